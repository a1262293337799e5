"""A Hugging Face Trainer program for tests/test_hf_trainer.py: a tiny Llama from a config, trained for six
optimizer steps (gradient accumulation 2, evaluation and a checkpoint every 3 steps) on an in-memory dataset, on
whatever device the Trainer chooses (`cpu` as argv[1]: use_cpu=True). Then a fresh Trainer resumes from
checkpoint-3 and trains to step 6 again; with `bf16`, a third run under the Trainer's bf16 mixed precision.
Writes what each run logged, and where it ran, to argv[2]. Under torchrun it is data-parallel (the `neuron`
process-group backend on the device, gloo on the CPU)."""

import os
import sys

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments


class Tokens(Dataset):
    def __init__(self, n: int, seed: int):
        self.ids = torch.randint(0, 128, (n, 16), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


class StepsRun(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def train(out: str, use_cpu: bool, bf16: bool = False, resume: bool = False) -> dict:
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    args = TrainingArguments(
        output_dir=out, report_to=[], use_cpu=use_cpu, bf16=bf16, max_steps=6, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, learning_rate=1e-3, logging_steps=1, save_steps=3, eval_strategy="steps",
        eval_steps=3, per_device_eval_batch_size=4, seed=0, disable_tqdm=True)
    steps = StepsRun()
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(64, 1), eval_dataset=Tokens(16, 2),
                      callbacks=[steps])
    trainer.train(resume_from_checkpoint=f"{out}/checkpoint-3" if resume else None)
    hist = trainer.state.log_history
    return {
        "args_device": str(args.device), "pin_memory": args.dataloader_pin_memory,
        "mixed_precision": trainer.accelerator.mixed_precision,
        "param_device": str(next(model.parameters()).device), "steps_run": steps.steps,
        "loss": {h["step"]: h["loss"] for h in hist if "loss" in h},
        "eval_loss": {h["step"]: h["eval_loss"] for h in hist if "eval_loss" in h},
        "weights": {k: v.detach().float().cpu() for k, v in model.state_dict().items()},
    }


if __name__ == "__main__":
    use_cpu, result, tmp = sys.argv[1] == "cpu", sys.argv[2], sys.argv[3]
    runs = {"fp32": train(f"{tmp}/fp32", use_cpu), "resumed": train(f"{tmp}/fp32", use_cpu, resume=True)}
    if "bf16" in sys.argv[4:]:
        runs["bf16"] = train(f"{tmp}/bf16", use_cpu, bf16=True)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun every rank has the same history
        torch.save(runs, result)
    if torch.distributed.is_initialized():
        # as PyTorch's docs ask of a program: gloo's threads stop here, not during interpreter finalization (the
        # CPU run's plain gloo group has no at-exit release; one CI run's rank 0 aborted at exit, under load)
        torch.distributed.destroy_process_group()
