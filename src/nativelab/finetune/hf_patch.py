"""`--kernels`: patch a Hugging Face Llama / Qwen-family model instance to run its RMSNorm, RoPE, SwiGLU MLP
and LM head + loss through nativelab's kernel library, the way Liger-Kernel patches models
(`apply_liger_kernel_to_llama`). Per instance, not per class: other models in the process stay as they are.

Each patched forward falls back to the original where a kernel does not apply (an MLP or LM head wrapped by
LoRA, biases, mixed dtypes, per-row position tables), so patching never changes what is computed, only how."""

from __future__ import annotations

import inspect
import types

import torch
import torch.nn.functional as F
from torch import nn

from ..device.config import DEVICE_NAME
from ..kernels import ops
from .data import IGNORE
from .model import base_of


def _autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None


def _plain_linear(m) -> bool:
    return type(m) is nn.Linear and m.bias is None


def _rmsnorm_forward(self, x):
    if x.dtype != self.weight.dtype:
        return type(self).forward(self, x)
    return ops.rmsnorm(x, self.weight, self.variance_epsilon)


def _mlp_forward(self, x):
    projs = (self.gate_proj, self.up_proj, self.down_proj)
    if not all(_plain_linear(p) for p in projs):  # e.g. LoRA-wrapped: the adapters need their own path
        return type(self).forward(self, x)
    dtype = _autocast_dtype(x) or x.dtype
    weights = [p.weight.to(dtype) for p in projs]
    return ops.mlp(x.to(dtype), *weights)


def _make_rope(original):
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if unsqueeze_dim != 1 or cos.dim() != 3 or cos.shape[0] != 1 or q.dtype != k.dtype:
            return original(q, k, cos, sin, unsqueeze_dim)  # per-row positions: the plain path
        c, s = cos[0].to(q.dtype), sin[0].to(q.dtype)
        return ops.rope(q, c, s), ops.rope(k, c, s)

    return apply_rotary_pos_emb


def _with_globals(fn, **overrides):
    """A copy of `fn` whose module globals are overridden (the attention forward with the RoPE kernel)."""
    fn = inspect.unwrap(fn)
    # Without the module's `__name__`: Dynamo resolves a traced function's globals by that name, so it would
    # read (and guard on) the module's own `apply_rotary_pos_emb`, not ours (since transformers 5.25 with the
    # `kernels` package, a module object that has no `__defaults__`: guard creation failed). Nameless globals
    # are taken as this dict.
    scope = {k: v for k, v in fn.__globals__.items() if k != "__name__"}
    new = types.FunctionType(fn.__code__, {**scope, **overrides}, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


def _causal_lm_forward(self, input_ids=None, labels=None, **kwargs):
    """With labels: the fused LM head + loss (the logits are never stored); without: the original forward."""
    if labels is None or not _plain_linear(self.lm_head) or kwargs.get("logits_to_keep", 0):
        return type(self).forward(self, input_ids=input_ids, labels=labels, **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    kwargs.pop("logits_to_keep", None)
    out = self.model(input_ids=input_ids, **kwargs)
    h = out.last_hidden_state
    dtype = _autocast_dtype(h) or h.dtype
    # Next-token targets: shift the labels left (the last position has none) instead of slicing h.
    target = F.pad(labels[:, 1:], (0, 1), value=IGNORE).reshape(-1)
    h, target = _labeled_rows(h.reshape(-1, h.shape[-1]), target)
    loss = ops.linear_cross_entropy(h.to(dtype), self.lm_head.weight.to(dtype), target)
    return CausalLMOutputWithPast(loss=loss, logits=None)


ROW_BUCKET = 64  # labeled-row counts are rounded up to this: a handful of kernel shapes, not one per batch


@torch.compiler.disable  # under --compile: a graph break here, the row count stays out of the traced shapes
def _labeled_rows(h: torch.Tensor, target: torch.Tensor):
    """Only the rows that carry a label go through the LM head: the loss (a mean over labeled tokens) and its
    gradient are the same, and an unlabeled row's gradient is zero. In SFT the prompt is unlabeled (86% of
    the rows of a 128-token HumanEval batch). The labeled rows are padded up to a multiple of ROW_BUCKET (with
    row 0, its label ignored), so the kernel sees few distinct shapes. One host sync (the count)."""
    labeled = (target != IGNORE).nonzero().squeeze(1)  # nonzero: native on the device (a sort would fall back)
    n = labeled.numel()
    keep = min(target.numel(), max(ROW_BUCKET, -(-n // ROW_BUCKET) * ROW_BUCKET))
    if keep == target.numel():
        return h, target
    rows = F.pad(labeled, (0, keep - n))
    kept = target.index_select(0, rows)
    kept[n:] = IGNORE
    return h.index_select(0, rows), kept


def apply_kernels(model) -> dict[str, int]:
    """Patch the model (a transformers causal LM, possibly inside a PEFT wrapper) in place; returns how many
    modules of each kind now run a kernel."""
    base = base_of(model)
    kind = next(base.parameters()).device.type
    if kind not in (DEVICE_NAME, "cpu"):
        raise ValueError(f"--kernels: the kernel library runs on the neuron device and the CPU, not {kind}")
    counts = {"rmsnorm": 0, "rope": 0, "mlp": 0, "lm_head+loss": 0}
    for module in base.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            module.forward = types.MethodType(_rmsnorm_forward, module)
            counts["rmsnorm"] += 1
        elif name.endswith("MLP") and all(hasattr(module, p) for p in ("gate_proj", "up_proj", "down_proj")):
            if getattr(module.config, "hidden_act", None) in ("silu", "swish"):
                module.forward = types.MethodType(_mlp_forward, module)
                counts["mlp"] += all(_plain_linear(getattr(module, p)) for p in ("gate_proj", "up_proj", "down_proj"))
        elif name.endswith("Attention"):
            forward = type(module).forward
            rope = inspect.unwrap(forward).__globals__.get("apply_rotary_pos_emb")
            if rope is not None:
                module.forward = types.MethodType(_with_globals(forward, apply_rotary_pos_emb=_make_rope(rope)),
                                                  module)
                counts["rope"] += 1
    if hasattr(base, "lm_head") and hasattr(base, "model"):
        base.forward = types.MethodType(_causal_lm_forward, base)
        counts["lm_head+loss"] += 1
    return counts
