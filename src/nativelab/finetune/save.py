"""Saving without half-written state: every output (adapter, model shards, checkpoint) is written into a
temporary sibling directory, fsynced, then renamed into place in one step. A crash leaves either the old
directory or the new one, plus at worst a `.tmp-*` directory that the next save removes."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
from pathlib import Path

import torch

from ..files import fsync_dir
from . import model as model_mod

FINGERPRINT = "nativelab_base.json"  # beside the PEFT / HF files: which base model this was trained on
STATE = "trainer_state.pt"


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
    fsync_dir(root)


@contextlib.contextmanager
def atomic_dir(final: str | Path):
    """Yield a temporary directory that becomes `final` only if the block completes."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        if final.exists():  # replace: move the old one aside first, so the rename itself is atomic
            old = final.parent / f".{final.name}.old-{os.getpid()}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def trainable_state(model) -> dict:
    """The trained tensors only (LoRA: the adapter weights; full: every parameter), on the CPU."""
    return _to_cpu({n: p for n, p in model.named_parameters() if p.requires_grad})


def save_model(model, tokenizer, out: str | Path, lora: bool, max_shard_size: str = "200MB") -> Path:
    """LoRA: the adapter in PEFT format (PeftModel.from_pretrained loads it). Full: the model as safetensors
    shards (AutoModelForCausalLM.from_pretrained loads it). Tensors go through the CPU: safetensors reads host
    memory."""
    with atomic_dir(out) as tmp:
        if lora:
            sd = {k: v for k, v in model.state_dict().items() if "lora_" in k}
            model.save_pretrained(tmp, state_dict=_to_cpu(sd))
        else:
            model.save_pretrained(tmp, state_dict=_to_cpu(model.state_dict()), max_shard_size=max_shard_size)
        tokenizer.save_pretrained(tmp)
        write_fingerprint(tmp, model)
    return Path(out)


def write_fingerprint(directory: Path, model) -> None:
    """Beside what was saved: which base model it fits (check_fits reads it)."""
    (directory / FINGERPRINT).write_text(json.dumps(model_mod.fingerprint(model), indent=1))


def check_fits(saved_dir: str | Path, base_model) -> None:
    """A clear error when a saved adapter / checkpoint was trained on another base model."""
    path = Path(saved_dir) / FINGERPRINT
    if not path.is_file():
        raise ValueError(f"{saved_dir}: no {FINGERPRINT}; not saved by nativelab finetune")
    saved, here = json.loads(path.read_text()), model_mod.fingerprint(base_model)
    diff = {k: (saved.get(k), v) for k, v in here.items() if saved.get(k) != v}
    if diff:
        what = ", ".join(f"{k} {a} vs {b}" for k, (a, b) in diff.items())
        raise ValueError(f"{saved_dir} was saved for another base model ({what}: saved vs this base)")


def load_adapter(base_model, adapter_dir: str | Path, is_trainable: bool = False):
    """PeftModel.from_pretrained, after checking the adapter was trained on this base model."""
    from peft import PeftModel

    check_fits(adapter_dir, base_model)
    return PeftModel.from_pretrained(base_model, str(adapter_dir), is_trainable=is_trainable)


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if acc is not None:
        state[acc.type] = getattr(torch, acc.type).get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    for key, value in state.items():
        if key not in ("python", "torch") and hasattr(torch, key):
            getattr(torch, key).set_rng_state(value)


def save_checkpoint(out: str | Path, model, optimizer, scheduler, step: int, meta: dict) -> Path:
    """Everything `--resume` needs to continue exactly: trained weights, optimizer, scheduler, RNG, step."""
    with atomic_dir(out) as tmp:
        torch.save({"model": trainable_state(model), "optimizer": _to_cpu(optimizer.state_dict()),
                    "scheduler": scheduler.state_dict(), "rng": rng_state(), "step": step, "meta": meta},
                   tmp / STATE)
        write_fingerprint(tmp, model)
    return Path(out)


def _to_cpu(obj, copies: dict | None = None):
    """CPU copies of the tensors in a (nested) state dict. Tensors that share memory (a tied embedding and LM
    head) share their copy, so save_pretrained sees the tie and writes the tensor once."""
    copies = {} if copies is None else copies
    if isinstance(obj, torch.Tensor):
        key = (obj.device, obj.untyped_storage().data_ptr(), obj.storage_offset(), tuple(obj.shape), obj.stride(),
               obj.dtype)
        if key not in copies:
            copies[key] = obj.detach().to("cpu", copy=True)
        return copies[key]
    if isinstance(obj, dict):
        return {k: _to_cpu(v, copies) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v, copies) for v in obj)
    return obj


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    steps = [(int(p.name.split("-")[1]), p) for p in Path(output_dir).glob("checkpoint-*")
             if p.name.split("-")[1].isdigit() and (p / STATE).is_file()]
    return max(steps)[1] if steps else None


def load_checkpoint(path: str | Path, model, optimizer, scheduler) -> dict:
    """Restore a checkpoint into a freshly built model / optimizer / scheduler; returns its state."""
    path = Path(path)
    if not (path / STATE).is_file():
        raise FileNotFoundError(f"--resume {path}: no checkpoint there ({STATE} missing)")
    check_fits(path, model)
    state = torch.load(path / STATE, map_location="cpu", weights_only=False)
    params = dict(model.named_parameters())
    missing = [k for k in state["model"] if k not in params]
    if missing:
        raise ValueError(f"{path}: checkpoint holds parameters this model lacks ({missing[:3]} ...): "
                         "another method or LoRA configuration?")
    with torch.no_grad():
        for k, v in state["model"].items():
            params[k].copy_(v)
    optimizer.load_state_dict(state["optimizer"])  # moves its tensors to the parameters' device
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state
