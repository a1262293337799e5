"""Fine-tuning under torchrun (WORLD_SIZE > 1): one process per device, the model sharded with FSDP2.

- Every rank binds to its own device (`neuron:{LOCAL_RANK}`, `cuda:{LOCAL_RANK}` or the CPU) and joins the
  default process group (`neuron` backend for the device, gloo for the CPU, nccl for CUDA).
- `fully_shard` wraps every decoder layer, then the transformers model (embeddings, final norm, LM head).
  Tied embeddings stay one parameter: FSDP2 manages a parameter shared by two modules of the same group once.
  LoRA goes the same way (frozen base weights and trainable adapters share the groups): one code path.
- bf16 is FSDP2's MixedPrecisionPolicy (bf16 parameters all-gathered and computed, fp32 gradient reduction,
  fp32 sharded weights and optimizer) instead of autocast: the all-gathers move half the bytes.
- Checkpoints are torch.distributed.checkpoint (DCP) directories under --checkpoint-dir, written by every rank
  through nativelab.distributed.checkpoint (atomic: LATEST names only complete ones).
- The final model / adapter is gathered into a full CPU state dict and written by rank 0 (atomically).
"""

from __future__ import annotations

import io
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from ..device.config import DEVICE_NAME
from . import model as model_mod
from . import save


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def launched() -> bool:
    """Started by torchrun with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def setup(device: str) -> World:
    """Bind this rank to its device and join the process group (once per process). Errors are ValueErrors
    (bad input: more ranks than devices), so the CLI reports them in one line."""
    from ..distributed import bind_local_rank, local_rank

    local = local_rank()
    kind = torch.device(device).type
    if kind == DEVICE_NAME:

        try:
            dev = bind_local_rank()
        except RuntimeError as e:
            raise ValueError(str(e)) from None
    elif kind == "cuda":
        count = torch.cuda.device_count()
        if local >= count:
            raise ValueError(f"LOCAL_RANK={local} needs cuda:{local}, but this host has {count} CUDA devices: "
                             f"run at most {count} processes per node")
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        # the neuron group also serves CPU tensors; on the CPU alone gloo is the default
        dist.init_process_group(device_id=dev if kind == "cuda" else None)
    return World(dist.get_rank(), dist.get_world_size(), dev)


def decoder_layers(model) -> list[torch.nn.Module]:
    """The transformer blocks (Hugging Face names their class in `_no_split_modules`), inside a PEFT wrapper
    too."""
    base = model_mod.base_of(model)
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in base.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(base).__name__}: no decoder layers found to shard (its _no_split_modules: "
                         f"{sorted(names)})")
    return layers


def shard(model, precision: str, world: World) -> None:
    """fully_shard each decoder layer, then the root, in place. The root is the transformers model, inside
    a PEFT wrapper too: PEFT's generate() calls it directly, so the root's hooks must sit on it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # fully_shard's default mesh is on the accelerator: --device cpu needs its own
    mesh = init_device_mesh(world.device.type, (world.size,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if precision == "bf16" else MixedPrecisionPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model_mod.base_of(model), mesh=mesh, mp_policy=policy)


def sums(world: World, *values: float) -> list[float]:
    """Sums over ranks of each value (a collective)."""
    t = torch.tensor(values, dtype=torch.float64, device=world.device)
    dist.all_reduce(t)
    return t.tolist()


def full_state(model) -> dict:
    """The whole model's state on rank 0's CPU (other ranks: empty); a collective."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_model(world: World, model, tokenizer, out: str | Path, lora: bool, arch: str,
               max_shard_size: str = "200MB") -> Path:
    """save.save_model for a sharded model: gathered to rank 0, which writes it atomically."""
    sd = full_state(model)
    for alias in _tied_aliases(model):  # gathered apart, an alias would be a second copy in the file
        sd.pop(alias, None)
    if world.main:
        with save.atomic_dir(out) as tmp:
            if lora:
                model.save_pretrained(tmp, state_dict={k: v for k, v in sd.items() if "lora_" in k})
            else:
                model.save_pretrained(tmp, state_dict=sd, max_shard_size=max_shard_size)
                # save_pretrained names the class it saw: fully_shard's FSDP<Arch> subclass
                cfg = tmp / "config.json"
                cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "architectures": [arch]}, indent=2))
            tokenizer.save_pretrained(tmp)
            save.write_fingerprint(tmp, model)
    dist.barrier()  # the other ranks return once the model is in place
    return Path(out)


def _tied_aliases(model) -> list[str]:
    """Names under which an already named parameter appears again (the tied LM head)."""
    seen, aliases = set(), []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            aliases.append(name)
        seen.add(id(p))
    return aliases


# -- checkpoints ---------------------------------------------------------------------------------------------


def _options(strict: bool = True):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # LoRA: the adapters, not the base model again. Loading then leaves the frozen weights as they are
    # (not strict); dcp.load itself fails on any trained tensor the checkpoint lacks.
    return StateDictOptions(ignore_frozen_params=True, strict=strict)


def _state(model, optimizer):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options())
    return {"model": model_sd, "optim": optim_sd}


def save_checkpoint(world: World, root: Path, model, optimizer, scheduler, step: int, meta: dict) -> Path:
    from ..distributed import checkpoint

    rngs = [None] * world.size
    dist.all_gather_object(rngs, save.rng_state())  # each rank's own: dropout masks differ per rank
    state = _state(model, optimizer)
    trainer = {"scheduler": scheduler.state_dict(), "rng": rngs, "step": step, "world": world.size,
               "fingerprint": model_mod.fingerprint(model), "meta": meta}
    state["trainer"] = io.BytesIO()  # one opaque blob (DCP would flatten a nested dict into many entries)
    torch.save(trainer, state["trainer"])
    return checkpoint.save(state, root, step, keep=sys.maxsize)  # keep all, as single-process runs do


def find_checkpoint(resume: str, root: Path) -> Path:
    from ..distributed import checkpoint

    path = checkpoint.latest(root) if resume == "latest" else Path(resume)
    if path is None:
        raise FileNotFoundError(f"--resume latest: no checkpoint in {root}")
    if not (path / ".metadata").is_file():
        single = " (a single-process checkpoint: resume it without torchrun)" if (path / save.STATE).is_file() else ""
        raise FileNotFoundError(f"--resume {path}: no distributed checkpoint there (.metadata missing){single}")
    return path


def load_checkpoint(world: World, path: Path, model, optimizer, scheduler) -> int:
    """Restore a DCP checkpoint into the sharded model / optimizer / scheduler / RNG; returns its step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    meta = {"trainer": io.BytesIO()}  # first the small part: a mismatch is named before any tensor loads
    dcp.load(meta, storage_reader=dcp.FileSystemReader(path))
    meta["trainer"].seek(0)
    t = torch.load(meta["trainer"], weights_only=False)
    here = model_mod.fingerprint(model)
    if t["fingerprint"] != here:
        raise ValueError(f"{path} was saved for another base model ({t['fingerprint']} vs {here})")
    if t["world"] != world.size:
        raise ValueError(f"{path} was saved by {t['world']} ranks; resume it with the same number "
                         f"(the data each rank sees depends on it), not {world.size}")
    state = _state(model, optimizer)
    dcp.load(state, storage_reader=dcp.FileSystemReader(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=_options(strict=False))
    scheduler.load_state_dict(t["scheduler"])
    save.set_rng_state(t["rng"][world.rank])
    return t["step"]
