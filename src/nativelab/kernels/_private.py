"""Every private PyTorch API the kernel library relies on, each behind one named function here; nothing else
in nativelab/kernels imports `torch._*`. `tests/test_private_apis.py` exercises each of them."""

from __future__ import annotations

import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensor  # imported once: is_fake runs on every kernel launch


def is_fake(t: torch.Tensor) -> bool:
    """A fake tensor (tracing: `torch.compile`, `make_fx`, a custom op's fake implementation), which holds
    metadata and no data."""
    return isinstance(t, FakeTensor)


def version(t: torch.Tensor) -> int:
    """A tensor's version counter: bumped by every in-place write (a frozen weight written in place is stale)."""
    return t._version


def overload_of(op):
    """The operator overload (`torch.ops.ns.name.default`) of a `torch.library.custom_op`."""
    return op._opoverload


def lean_version_bump(op) -> bool:
    """Replace the version-bump kernel (dispatch key ADInplaceOrView) that `torch.library.custom_op` registers
    for an op that mutates its arguments with one that does the same work without `fill_defaults`: that helper
    reads `schema.arguments` (a fresh list of every argument) once per argument, quadratic in the schema's
    length, which cost ~0.15 ms per call of `transformer_tkg_token` when it took 25 arguments (a tenth of a decode step).
    It runs whenever an argument is an ordinary (non-inference) tensor, inference mode or not. Returns False,
    leaving PyTorch's kernel, for a schema it does not cover (a mutated keyword-only argument, a view op)."""
    overload = op._opoverload
    schema = overload._schema
    mutated = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
    if schema._is_view_op() or any(schema.arguments[i].kwarg_only for i in mutated):
        return False
    after = torch._C._after_ADInplaceOrView_keyset
    bump = torch.autograd.graph.increment_version

    def adinplaceorview(keyset, *args, **kwargs):
        for i in mutated:  # the dispatcher drops trailing arguments equal to their defaults: those are not here
            if i < len(args) and args[i] is not None:
                bump(args[i])
        return overload.redispatch(keyset & after, *args, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": that is the point
        op._lib.impl(op._name, adinplaceorview, "ADInplaceOrView", with_keyset=True)
    return True
