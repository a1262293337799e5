"""Where an op on the device does something other than plain CPU dispatch would, in one place.

- The real device's dtype policy: int64 -> int32 and float64 -> float32 for inputs that are not 0-d, the results
  cast back (`NARROW`, warned once per dtype); NATIVELAB_DTYPE_POLICY=0 turns it off.
- Index arguments: the device takes int32 indices (the guide's labels), CPU kernels insist on int64
  (`INT64_INDEX_ARGS`).
- CPU-output dtypes: ops whose CPU kernels (which the device runs) give other dtypes than their meta kernels.
- Composite overrides: ops registered on the device key so that PyTorch's composite kernels do not run them.
- Layouts a CPU fallback's result must keep.
The GEMM policy (bf16 products as fp32 GEMMs) is `gemm_policy.py`, shared with compiled graphs.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch

from . import _private, gemm_policy, state

_Tensor = torch.Tensor
_meta = torch.device("meta")

log = logging.getLogger("nativelab.device.dtype_policy")

# CPU kernels that insist on int64 indices; the device takes int32 (the guide's int32 labels).
INT64_INDEX_ARGS = {
    "nll_loss_forward": ("target",),
    "nll_loss_backward": ("target",),
    "nll_loss2d_forward": ("target",),
    "nll_loss2d_backward": ("target",),
    "gather": ("index",),
    "scatter": ("index",),
    "scatter_add": ("index",),
    "scatter_add_": ("index",),
    "scatter_": ("index",),
    "scatter_reduce": ("index",),
    "scatter_reduce_": ("index",),
    "index_copy": ("index",),
    "index_copy_": ("index",),
    "take": ("index",),
    "put_": ("index",),
    "put": ("index",),
    "multi_margin_loss": ("target",),
    "multilabel_margin_loss_forward": ("target",),
    "multilabel_margin_loss_backward": ("target",),
}
NARROW = {torch.int64: torch.int32, torch.float64: torch.float32}
WIDE = {n: w for w, n in NARROW.items()}


def is_narrowed(dtype) -> bool:
    """Does the device compute tensors of this dtype in a narrower one (int64 as int32, float64 as float32)?
    Complex tensors it computes as they are (CPU's kernels, complex128 exactly), as every other dtype; 0-d
    tensors and the arguments an op writes are not narrowed either (`plan`)."""
    return state.device.dtype_policy and dtype in NARROW


class Plan(NamedTuple):
    """What the device does to one call signature that plain CPU dispatch would not (`plan`)."""

    narrow: tuple  # positions of read arguments holding a tensor the dtype policy narrows
    widen: tuple  # index arguments holding int32 tensors, which CPU's kernels take as int64
    gemm: bool  # a bf16 matrix product run as an fp32 GEMM of upcast operands (gemm_policy)
    # int64 index arguments (not 0-d): int32 on the device, as every int64 tensor; CPU's kernels get them as
    # they are, the same values while they fit (nothing for the Python path to do)
    indices: tuple = ()
    # 0-d operands that follow the narrowed inputs (`_follow_narrowed`): filled by `graph_plan`, for compiled
    # graphs; eager code finds them when the op runs (`finish_policy`)
    follow: tuple = ()
    # (position, value) of Python numbers saturated to the narrow dtype's range (`_saturate_numbers`): filled by
    # `graph_plan`, as `follow`
    numbers: tuple = ()

    @property
    def casts(self) -> bool:
        """The dtype policy has work (an input to narrow, an int32 index to widen): its runners, and the
        probe of a signature's first call as made."""
        return bool(self.narrow or self.widen)

    @property
    def work(self) -> bool:
        """The Python path has something to do (the C++ kernel sends every call of such a signature there)."""
        return bool(self.narrow or self.widen or self.gemm)


def plan(rec, args) -> Plan | None:
    """The device's policy for one call (`rec` the op's OpRecord, `args` in schema order; device or host
    tensors alike: it reads dtypes and shapes only), None when the call is CPU's as made. The one decision
    that the Python path (queued work, run_on_host), the C++ kernel (`dispatch.fast_spec`: a signature whose
    plan has `work` goes through Python) and `nativelab check` (the inputs computed narrower) read. Only ops
    the device computes (`route == "native"`) narrow; a CPU fallback computes in the dtypes it is given."""
    native = rec.route == "native"
    narrow = _narrowed_positions(rec, args) if native else ()
    index = [i for i in rec.int64_args if i < len(args) and isinstance(args[i], _Tensor)]
    widen = tuple(i for i in index if args[i].dtype == torch.int32)
    indices = tuple(i for i in index if native and _narrows(args[i]) and args[i].dtype == torch.int64)
    gemm = upcasts_gemm(rec, args)
    return Plan(narrow, widen, gemm, indices) if narrow or widen or gemm or indices else None


# Ops whose route is native but which eager dispatch computes from copies, narrowing nothing: their
# CompositeExplicitAutograd kernels (empty or clone, then copy_ / fill_ / an in-place op on what they write:
# masked_fill's written self is not narrowed and its value is 0-d), the runtime's own copy kernels, or a CPU
# fallback under another name (convolution reaches the device as convolution_overrideable).
COMPUTED_BY_COPIES = frozenset({
    "aten::_to_copy", "aten::copy_", "aten::constant_pad_nd", "aten::masked_fill", "aten::repeat",
    "aten::slice_backward", "aten::convolution", "aten::convolution_backward",
})


def graph_plan(rec, args) -> Plan | None:
    """The plan of one node of a compiled graph (`args`: its arguments' fake values, in schema order): the
    eager call's (`plan`), as eager dispatch of the same op computes it, so that compiled code narrows where
    eager ops do (compiler/dtype_policy.py)."""
    if rec.name.partition(".")[0] in COMPUTED_BY_COPIES:
        return None
    p = plan(rec, args)
    if p is None or not p.narrow or rec.mutable:  # (an op that writes its arguments: call_narrowed's rule)
        return p
    narrowed = {NARROW[t.dtype] if _narrows(t) else t.dtype for i in p.narrow for t in tensors((args[i],))}
    saturated = list(args)
    _saturate_numbers(rec, saturated, narrowed)
    numbers = tuple((j, v) for j, v in enumerate(saturated) if v is not args[j])
    return p._replace(follow=_followers(rec, args, narrowed, set(p.narrow)), numbers=numbers)


def upcasts_gemm(rec, args) -> bool:
    return rec.name in gemm_policy.OPS and gemm_policy.upcast_args(rec.name, args)


def _narrows(t) -> bool:
    return t is not None and is_narrowed(t.dtype) and t.dim() != 0


def _narrowed_positions(rec, args) -> tuple:
    # is_narrowed and _narrows spelled out: this runs for every op the Python path queues
    if not state.device.dtype_policy:
        return ()
    found = ()
    for i, a in enumerate(args):
        if isinstance(a, _Tensor):
            if a.dtype not in NARROW or a.dim() == 0:
                continue
        elif not (isinstance(a, (list, tuple))
                  and any(isinstance(t, _Tensor) and t.dtype in NARROW and t.dim() != 0 for t in a)):
            continue
        if i not in rec.mutable and i not in rec.int64_args:
            found += (i,)
    return found


def tensors(args):
    """The tensors among an op's arguments (in tensor lists too)."""
    for a in args:
        if isinstance(a, _Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (t for t in a if isinstance(t, _Tensor))


# ---------------------------------------------------------------------------------------------------------
# Dtype policy (the real device's): int64 -> int32 and float64 -> float32 for inputs that are not 0-d.

_policy_warned: set = set()


def _narrow(t):
    if not (isinstance(t, _Tensor) and _narrows(t)):
        return t
    warn_narrowed(t.dtype)
    return t.to(NARROW[t.dtype])


def warn_narrowed(dtype) -> None:
    """The real device's warning, once per process and dtype (eager ops and compiled graphs share it)."""
    if dtype in _policy_warned:
        return
    _policy_warned.add(dtype)
    wide, narrow = ("int64", "int32") if dtype == torch.int64 else ("float64", "float32")
    log.warning(
        "Neuron backend does not support %s. Automatically casting to %s. Consider using %s directly for "
        "better performance until native %s support is added.", wide, narrow, narrow, wide,
    )


def widen_indices(rec, hargs: list) -> None:
    for i in rec.int64_args:
        a = hargs[i]
        if isinstance(a, _Tensor) and a.dtype == torch.int32:
            hargs[i] = a.long()


def finish_policy(rec, hargs: list) -> bool:
    """Apply the dtype policy to host arguments (the positions `plan` names: it reads values, so it runs when
    the op runs, not when it is queued); True when an input was narrowed."""
    narrow = _narrowed_positions(rec, hargs)
    for i in narrow:
        a = hargs[i]
        hargs[i] = _narrow(a) if isinstance(a, _Tensor) else [_narrow(t) for t in a]
    if narrow:
        computed = {t.dtype for i in narrow for t in tensors((hargs[i],))}
        if not rec.mutable:  # (an op that writes its arguments: call_narrowed's own rule for 0-d operands)
            _follow_narrowed(rec, hargs, computed, set(narrow))
        else:
            _saturate_numbers(rec, hargs, computed)
    if rec.int64_args:
        widen_indices(rec, hargs)
    return bool(narrow)


def _follow_narrowed(rec, hargs: list, narrowed: set, skip: set) -> None:
    """0-d operands of a dtype the policy narrowed follow it (`narrowed`: the narrow dtypes computed), index
    arguments excepted: ops that require equal dtypes saw float32 and float64 (nll_loss_backward's 0-d
    grad_output and total_weight beside a narrowed float64 input: "expected scalar type Float but found
    Double"; index_put_'s values, `x[idx] = -1` on int64). Where dtypes may differ, CPU casts a 0-d operand to
    the narrow dtype of the others anyway (type promotion), so its value is the same."""
    for j in _followers(rec, hargs, narrowed, skip):
        hargs[j] = hargs[j].to(NARROW[hargs[j].dtype])
    _saturate_numbers(rec, hargs, narrowed)


def _followers(rec, args, narrowed: set, skip: set) -> tuple:
    """The positions `_follow_narrowed` narrows (`args`: host tensors or a graph node's fake values)."""
    wide = {WIDE[n] for n in narrowed if n in WIDE}
    indices = {rec.arg_pos[n] for n in rec.arg_pos if "ind" in n} | set(rec.int64_args)
    return tuple(j for j, a in enumerate(args) if j not in skip and j not in indices and isinstance(a, _Tensor)
                 and a.dim() == 0 and a.dtype in wide)


_INT32 = torch.iinfo(torch.int32)
_FLOAT32 = torch.finfo(torch.float32)


def _saturate_numbers(rec, hargs: list, narrowed: set) -> None:
    """Python numbers in Scalar arguments beyond the range of the narrow dtype computed saturate to it: CPU's
    kernel checks that a Scalar fits its tensor's dtype, so `x.clamp(max=iinfo(int64).max)` on int64 and
    `x.clamp(min=finfo(float64).min)` on float64 raised "value cannot be converted to type int without overflow"
    where CPU computes them; saturated, a bound beyond every value the device holds stays beyond them (a wrapped
    one, iinfo(int64).max as int32's -1, would clamp silently)."""
    for j in rec.number_pos:
        if j >= len(hargs):
            break
        v = hargs[j]
        if type(v) is int and torch.int32 in narrowed and not _INT32.min <= v <= _INT32.max:
            hargs[j] = max(_INT32.min, min(_INT32.max, v))
        elif type(v) is float and torch.float32 in narrowed and _FLOAT32.max < abs(v) < float("inf"):
            hargs[j] = max(_FLOAT32.min, min(_FLOAT32.max, v))


def widen_results(res, args):
    """The policy's second half: results come back int64/float64 when an input had that dtype."""
    wide = {t.dtype for t in tensors(args) if is_narrowed(t.dtype)}
    back = {NARROW[w]: w for w in wide}
    if isinstance(res, _Tensor):
        return res.to(back[res.dtype]) if res.dtype in back else res
    if isinstance(res, (list, tuple)):
        out = [r.to(back[r.dtype]) if isinstance(r, _Tensor) and r.dtype in back else r for r in res]
        return type(res)(out) if isinstance(res, list) else tuple(out)
    return res


def probe(rec, hargs) -> None:
    """Run the call as made on copies of the storages it writes (every argument in such a storage viewed onto
    the copy, so that CPU's overlap checks still see an out= that is also an input), dropping the result."""
    written = {a.untyped_storage().data_ptr() for i in rec.mutable for a in tensors((hargs[i],))}
    copies: dict = {}

    def onto_copy(t):
        if not isinstance(t, _Tensor) or t.layout != torch.strided or t.untyped_storage().data_ptr() not in written:
            return t
        st = t.untyped_storage()
        copy = copies.get(st.data_ptr())
        if copy is None:
            copy = copies[st.data_ptr()] = st.clone()
        return torch.empty(0, dtype=t.dtype).set_(copy, t.storage_offset(), t.size(), t.stride())

    probe = [[onto_copy(t) for t in a] if isinstance(a, (list, tuple)) else onto_copy(a) for a in hargs]
    widen_indices(rec, probe)  # the device takes int32 indices (the guide's labels): not a CPU check to keep
    rec.call(probe)


def call_narrowed(rec, hargs: list):
    """Call an op that writes its arguments after the policy narrowed an input. The written arguments follow:
    an out= op computes its functional form and the copy into `out` casts back (as functional ops do:
    `scatter.value_out` on int64 must not see an int32 input and an int64 out); an in-place op computes on
    a narrowed copy of what it writes, stored back afterwards (`x.scatter_(d, i, src)` needs x and src alike)."""
    if not rec.mutable:
        return rec.call(hargs)
    if all(i >= rec.npos for i in rec.mutable):
        fn = rec.functional_form()
        if fn is not None:
            fschema = _private.op_schema(fn)
            fargs = [hargs[rec.arg_pos[a.name]] for a in fschema.arguments]
            npos = sum(1 for a in fschema.arguments if not a.kwarg_only)
            res = fn(*fargs[:npos], **{a.name: v for a, v in zip(fschema.arguments[npos:], fargs[npos:])})
            pairs = list(zip(rec.mutable, (res,) if isinstance(res, _Tensor) else res))
            if any(hargs[i].dtype not in (r.dtype, WIDE.get(r.dtype)) for i, r in pairs):
                # an out= of another kind than the result (sum or cumsum of float64 into an int64 out): CPU's
                # out= kernel computes in out's dtype (it truncates each element, then sums), which a cast of the
                # float result would not; the out= kernel runs on the narrowed inputs, as CPU's would
                return rec.call(hargs)
            for i, r in pairs:
                out = hargs[i]
                if out.shape != r.shape:
                    out.resize_(r.shape)
                out.copy_(r)
            return rec.alias_returns(hargs)
    wide = {}
    for i in rec.mutable:
        a = hargs[i]
        if isinstance(a, _Tensor) and is_narrowed(a.dtype):
            wide[i] = a
            hargs[i] = a.to(NARROW[a.dtype])
        elif isinstance(a, list) and any(isinstance(t, _Tensor) and is_narrowed(t.dtype) for t in a):
            wide[i] = a
            hargs[i] = [t.to(NARROW[t.dtype]) if isinstance(t, _Tensor) and is_narrowed(t.dtype) else t for t in a]
    # 0-d operands of a written argument's dtype follow it: ops that require equal dtypes (index_put_'s
    # values: `x[idx] = -1` on int64, a Python number wrapped as a 0-d int64 tensor) saw int32 and int64.
    # Indices stay int64 (index_copy_(0, torch.tensor(0), src) on int64 requires a long index).
    _follow_narrowed(rec, hargs, {NARROW[t.dtype] for a in wide.values() for t in tensors((a,))
                                  if is_narrowed(t.dtype)}, set(wide))
    try:
        res = rec.call(hargs)
        for i, a in wide.items():
            for dst, src in zip(a, hargs[i]) if isinstance(a, list) else ((a, hargs[i]),):
                if dst is not src:
                    if dst.shape != src.shape:
                        dst.resize_(src.shape)
                    dst.copy_(src)
    finally:
        for i, a in wide.items():
            hargs[i] = a
    return res


# ---------------------------------------------------------------------------------------------------------
# Native ops that run at once (the queue drained, as a fallback runs), never queued.

# histc: CUDA's kernel reads the input's min and max back to the host when no range is given, so a non-finite
# range (`histc(tensor([nan]))`) raises at the call; and its checks of min and max read float values, which a
# call signature's key leaves out, so a later call of a signature that passed (`min=5., max=1.`) would be
# queued and raise only at the next sync.
RUN_AT_ONCE = frozenset({"aten::histc", "aten::histc.out"})


def _empty_input(args) -> bool:
    return isinstance(args[0], _Tensor) and args[0].numel() == 0


# Native ops that run at once when a call's arguments say so; such a call signature is never cached, so the C++
# kernel keeps sending it to Python. linalg_vector_norm of an empty tensor checks its `ord`, a float the key
# leaves out (`ord=-1` over an empty dim has no identity), so after an `ord=2` call passed it would be queued.
RUN_AT_ONCE_WHEN = {"aten::linalg_vector_norm": _empty_input}


# ---------------------------------------------------------------------------------------------------------
# CPU-output dtypes.


def _layer_norm_stats_dtype(args, res):
    """CPU's native_layer_norm keeps a bf16/fp16 input's dtype for mean and rstd, where its meta kernel says
    float32; the queued CPU kernel insists on its own (and users compare against CPU)."""
    x = args[0]
    if x.dtype not in (torch.bfloat16, torch.float16):
        return res
    return (res[0], *(torch.empty_strided(r.shape, r.stride(), dtype=x.dtype, device=_meta) for r in res[1:]))


# Ops whose output dtypes on the CPU (whose kernels the device runs) differ from their meta kernels'
CPU_OUTPUT_DTYPES = {"aten::native_layer_norm": _layer_norm_stats_dtype}


# ---------------------------------------------------------------------------------------------------------
# Composite overrides: ops the device registers on its own key (dispatch.direct_kernels).

# Native ops whose CompositeExplicitAutograd kernel would win over the device's fallback and compute them from
# ops the device does not have: native_layer_norm's math version goes through native_batch_norm (a CPU fallback).
OVER_COMPOSITE = {"aten.native_layer_norm.default"}
# all/any over a tuple of dims with out=: the composite reduces dim by dim and copies into `out`, so CPU's check
# of out's dtype never ran (all(x, (0, 1), out=float64) was accepted).
OVER_COMPOSITE |= {"aten.all.dims_out", "aten.any.dims_out"}
# Ops the device does not have whose CompositeExplicitAutograd kernel would win over the CPU fallback and
# decompose them into bf16 device steps, each rounding to bf16, where CPU's kernel keeps fp32 intermediates
# (group_norm's error vs float64 0.079 against CPU's 0.046). Registered, they run as the fallback: CPU's kernel.
HOST_OVER_COMPOSITE = {"aten.native_group_norm.default", "aten.addr.default"}
# Fallback ops that PyTorch's composite kernels would get wrong on the device: mode's out= form refuses any device
# but CPU, CUDA and XPU; mse_loss and smooth_l1_loss go through their out= kernels, which on CPU resize the
# 0-d result they are given (PyTorch's "An output with one or more elements was resized" warning at every call,
# where CPU's own functional kernel warns nothing). Registered, they run CPU's kernel of the same overload.
HOST_OVER_COMPOSITE |= {"aten.mode.values", "aten.mse_loss.default", "aten.smooth_l1_loss.default"}


# ---------------------------------------------------------------------------------------------------------
# Layouts a CPU fallback's result must keep.


def _channels_last_format(t):
    """channels_last(_3d) if `t` is laid out so (and not also contiguous), else None."""
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())
    if fmt is None or t.is_contiguous() or not t.is_contiguous(memory_format=fmt):
        return None
    return fmt


def _group_norm_forward(args, res):
    """PyTorch's derivative of native_group_norm makes the gradient and the input contiguous on every device but
    CPU (`device().is_cpu() ? input.suggest_memory_format() : Contiguous`), so the input gradient of a
    channels_last GroupNorm came back contiguous where CPU's is channels_last. The forward's rstd reaches the
    backward unchanged (its storage: autograd saves a shallow copy), so its storage remembers the input's layout."""
    fmt = _channels_last_format(args[0])
    if fmt is not None:
        res[2].untyped_storage()._nl_group_norm_format = fmt
    return res


def _group_norm_backward(args, res):
    fmt = getattr(args[3].untyped_storage(), "_nl_group_norm_format", None)
    if fmt is None or res[0] is None or res[0].is_contiguous(memory_format=fmt):
        return res
    return (res[0].contiguous(memory_format=fmt), *res[1:])


# CPU fallbacks whose results must keep a layout the composite or autograd code around them loses
KEEP_LAYOUT = {
    "aten::native_group_norm": _group_norm_forward,
    "aten::native_group_norm_backward": _group_norm_backward,
}
