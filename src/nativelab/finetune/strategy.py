"""How a fine-tuning run is spread over processes: one process (`SingleProcess`), or one rank per device under
torchrun with the model sharded by FSDP2 (`Sharded`, see parallel.py). Each strategy finds and loads a
checkpoint, shards the model, takes its part of a global batch, reduces a step's loss and saves, so the loop
in train.py reads the same for both."""

from __future__ import annotations

from pathlib import Path

import torch

from . import data, parallel, save


def label_tokens(labels: torch.Tensor) -> int:
    """Tokens that carry a label (the loss is their mean)."""
    return int((labels[:, 1:] != data.IGNORE).sum())


class SingleProcess:
    """All of every batch in this process; checkpoints are directories of plain files (save.py)."""

    def __init__(self, device: torch.device):
        self.world = parallel.World(device=device)

    def find_checkpoint(self, resume: str, root: Path, model) -> Path:
        """The checkpoint --resume names, checked against the (not yet built) base model."""
        path = save.latest_checkpoint(root) if resume == "latest" else Path(resume)
        if path is None:
            raise FileNotFoundError(f"--resume latest: no checkpoint in {root}")
        if not (path / save.STATE).is_file():
            dcp = " (a torchrun checkpoint: resume it under torchrun)" if (path / ".metadata").is_file() else ""
            raise FileNotFoundError(f"--resume {path}: no checkpoint there ({save.STATE} missing){dcp}")
        save.check_fits(path, model)
        return path

    def shard(self, model, precision: str) -> None:
        pass

    def load_checkpoint(self, path: Path, model, optimizer, scheduler) -> int:
        return save.load_checkpoint(path, model, optimizer, scheduler)["step"]

    def where(self, device: torch.device) -> str:
        return str(device)

    def per_rank(self, batch_size: int) -> str:
        return ""

    def local_batch(self, batch: dict, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        """This process's rows of the global batch, and its share of the batch's labeled tokens."""
        return batch["input_ids"], batch["labels"], 1.0

    def backward(self, loss: torch.Tensor, share: float) -> None:
        loss.backward()

    def global_loss(self, loss: torch.Tensor, share: float) -> float:
        return loss.item()  # also the step's synchronization point

    def eval_share(self, work: list) -> list:
        """This process's share of the held-out (batch, counts) pairs: all of them."""
        return work

    def sums(self, *values: float) -> list[float]:
        return list(values)

    def save_checkpoint(self, root: Path, model, optimizer, scheduler, step: int, meta: dict) -> None:
        save.save_checkpoint(root / f"checkpoint-{step}", model, optimizer, scheduler, step, meta)

    def save_model(self, model, tokenizer, out: str, lora: bool, arch: str) -> Path:
        return save.save_model(model, tokenizer, out, lora=lora)


class Sharded:
    """Rank r of `world.size` under torchrun: its slice of every global batch, the model sharded with FSDP2,
    checkpoints written by every rank (DCP), the final model gathered to rank 0."""

    def __init__(self, world: parallel.World):
        self.world = world

    def find_checkpoint(self, resume: str, root: Path, model) -> Path:
        return parallel.find_checkpoint(resume, root)  # the base model is checked when the checkpoint loads

    def shard(self, model, precision: str) -> None:
        parallel.shard(model, precision, self.world)

    def load_checkpoint(self, path: Path, model, optimizer, scheduler) -> int:
        return parallel.load_checkpoint(self.world, path, model, optimizer, scheduler)

    def where(self, device: torch.device) -> str:
        return f"{self.world.size} ranks ({device.type}, FSDP2)"

    def per_rank(self, batch_size: int) -> str:
        return f" ({batch_size} per rank)"

    def local_batch(self, batch: dict, batch_size: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        rank = self.world.rank
        rows = slice(rank * batch_size, (rank + 1) * batch_size)
        labels = batch["labels"][rows]
        return batch["input_ids"][rows], labels, label_tokens(labels) / label_tokens(batch["labels"])

    def backward(self, loss: torch.Tensor, share: float) -> None:
        # FSDP averages gradients over ranks: scaling each rank's token mean by share x ranks makes that
        # average the gradient of the global batch's token mean, as one process computes it
        (loss * (share * self.world.size)).backward()

    def global_loss(self, loss: torch.Tensor, share: float) -> float:
        (value,) = parallel.sums(self.world, loss.item() * share)  # the global batch's token mean
        return value

    def eval_share(self, work: list) -> list:
        """Rank r takes batches r, r + ranks, ...; every rank runs the same number of forwards (sharded forwards
        are collectives): a rank past the end repeats batch 0 and does not count it."""
        size, rank = self.world.size, self.world.rank
        rounds = -(-len(work) // size)
        return [work[i] if i < len(work) else (work[0][0], False) for i in range(rank, rounds * size, size)]

    def sums(self, *values: float) -> list[float]:
        return parallel.sums(self.world, *values)  # a collective

    def save_checkpoint(self, root: Path, model, optimizer, scheduler, step: int, meta: dict) -> None:
        parallel.save_checkpoint(self.world, root, model, optimizer, scheduler, step, meta)

    def save_model(self, model, tokenizer, out: str, lora: bool, arch: str) -> Path:
        return parallel.save_model(self.world, model, tokenizer, out, lora, arch)
