"""Every private PyTorch API the profiler relies on, each behind one named function.

`tests/test_private_apis.py` exercises each of them, so a PyTorch upgrade that changes one fails there.
"""

from __future__ import annotations

import torch
import torch.autograd.profiler
import torch._dynamo.callback
import torch._dynamo.utils
from torch._ops import OpOverload  # noqa: F401 - the type of an ATen operator overload, as graph nodes target


def torch_profiler_enabled() -> bool:
    """Whether a `torch.profiler.profile` is recording now (then device work is emitted as its events)."""
    return torch.autograd.profiler._is_profiler_enabled


def dynamo_counters() -> dict[str, dict[str, int]]:
    """A snapshot of Dynamo's counters: `graph_break` (reason -> count), `stats` (`unique_graphs`, ...)."""
    return {group: dict(c) for group, c in torch._dynamo.utils.counters.items()}


def add_compile_callbacks(start, end) -> None:
    """Call `start(compile_id)` / `end(compile_id)` around each Dynamo compilation ("frame/recompile")."""
    handler = torch._dynamo.callback.callback_handler
    handler.register_start_callback(start)
    handler.register_end_callback(end)


def remove_compile_callbacks(start, end) -> None:
    handler = torch._dynamo.callback.callback_handler
    handler.remove_start_callback(start)
    handler.remove_end_callback(end)


def compile_id_of_str(compile_id: str) -> tuple[int, int]:
    """(frame id, recompile index) from a compile callback's `compile_id` ("0/1": frame 0's first recompile)."""
    frame, _, attempt = str(compile_id).partition("/")
    digits = lambda s: int("".join(c for c in s.split("_")[0] if c.isdigit()) or 0)  # noqa: E731
    return digits(frame), digits(attempt)
