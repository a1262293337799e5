"""Which kind of work an entry is, by name: the rows of the time-by-category table and plot."""

from __future__ import annotations

import functools

CATEGORIES = (
    "matmul", "attention", "normalization", "elementwise", "sampling", "copy",
    "compiled graph", "fused layer", "fallback", "host sync", "compile",
)

# First match wins, so the specific names come before the generic ones ("kernel:sample" before "mm").
_RULES = (
    ("fused layer", ("transformer_tkg",)),
    ("sampling", ("argmax", "argmin", "sort", "multinomial", "topk", "cumsum", "exponential", "kernel:sample")),
    ("attention", ("attention", "softmax", "scaled_dot_product", "repeat_interleave", "masked_fill")),
    ("normalization", ("rmsnorm", "layer_norm", "group_norm", "batch_norm", "rsqrt")),
    ("matmul", ("mm", "matmul", "linear", "baddbmm", "addmv", "dot", "qkv", "kernel:mlp", "conv")),
    ("copy", ("copy", "clone", "cat", "stack", "index", "gather", "scatter", "embedding", "slice", "select",
              "contiguous", "_to_copy", "fill", "zero", "empty")),
)


@functools.lru_cache(maxsize=4096)
def categorize(name: str) -> str:
    """The category of device work named `name` (an ATen op, `kernel:<fn>` or `graph:<name>`)."""
    if name.startswith("graph:"):
        return "compiled graph"
    low = name.lower()
    for category, keys in _RULES:
        if any(k in low for k in keys):
            return category
    return "elementwise"
