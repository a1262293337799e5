"""ATen ops on the device: one boxed kernel for every op that reaches the PrivateUse1 key, and its routes.

Three routes, chosen once per op overload (`schema.OpRecord.route`):
- views (`view`, `transpose`, `split`, ...): metadata only, answered at once on the same device storage;
- ops the real device implements (`native_ops.txt`): output metadata from meta kernels (cached), outputs
  allocated, the CPU kernel queued to run later on host memory (asynchronous, in program order);
- everything else: a CPU fallback, as on the real device: drain the queue, run the CPU kernel, record the
  op and warn once.
What a call does other than plain CPU dispatch (the dtype policy, index dtypes, ...) is `policy.py`.
A few ops the device runtime must answer itself (allocation, copies, `.item()`, `resize_`, `set_`) have
their own kernels in `runtime_ops.py`.
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from . import _private, gemm_policy, guard, memory, observe, policy, queue, rng, schema, sparse, state, tracking
from .schema import OpRecord

DEVICE = memory.DEVICE
_Tensor = torch.Tensor
_meta = torch.device("meta")
_cpu = torch.device("cpu")

_MISSING = object()

_records = schema.records  # OpOverload -> OpRecord (bound here: read per call)
_no_context = contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------------------
# Argument walking. Schema arguments arrive positionally in `args` and by name in `kwargs`; we normalise to
# one positional list (`OpRecord.normalise`) so schema positions (mutable args, index args, generator) can be
# used directly.


_PLAIN = (int, float, bool, str, type(None), torch.dtype)
_NUMBERS = (int, float, bool, complex)
_scalars: dict = {}


def _device_index(args, cpu_ok: tuple = (), written: tuple = ()) -> int:
    """The device all tensor arguments live on (-1: none), by CUDA's rules: every device tensor on one core; CPU
    tensors only as 0-d scalars the op reads, or in the `cpu_ok` positions (a 0-d CPU tensor in a `written`
    position, `nonzero(x, out=torch.empty((), dtype=torch.long))`, was written on the host while CUDA refuses it).

    The call's signature key is not made here: the C++ kernel builds it (csrc/ops.cpp `build_key`, the one key of
    both paths) and hands it to `device_kernel`. What stays in Python is this check, which raises CUDA's error at
    the call and knows the positions where an op takes CPU tensors (schema.py's OpRecord.cpu_ok); the C++ kernel
    only leaves such calls to Python."""
    index = -1
    cpu_bad = None
    for pos, a in enumerate(args):
        if type(a) in _PLAIN:
            continue
        if isinstance(a, _Tensor):
            items = (a,)
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], (_Tensor, type(None))):
            items = a
        else:
            continue
        for t in items:
            if t is None:
                continue
            d = t.device
            if d.type == DEVICE:
                if index < 0:
                    index = d.index
                elif d.index != index:
                    raise RuntimeError(
                        f"Expected all tensors to be on the same device, but found at least two devices, "
                        f"{DEVICE}:{index} and {d}!"
                    )
            elif cpu_bad is None and (t.dim() != 0 or pos in written) and pos not in cpu_ok:
                cpu_bad = d
    if cpu_bad is not None and index >= 0:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"{DEVICE}:{index} and {cpu_bad}!"
        )
    return index


# The dtypes PyTorch gives a Python number it wraps into a tensor (c10::scalar_to_tensor)
_WRAPPED_DTYPES = {float: torch.float64, int: torch.int64, bool: torch.bool, complex: torch.complex128}


def _scalar_tensor(v):
    """0-d CPU tensors for Python scalars, cached: the same few constants recur in every step. Marked as
    wrapped numbers, as PyTorch marks them, so that they do not take part in type promotion (a 0-d bf16 tensor
    * 0.5 stays bf16)."""
    key = (type(v), v)
    t = _scalars.get(key)
    if t is None:
        t = torch.tensor(v, dtype=_WRAPPED_DTYPES.get(type(v)))
        state.device.rt.mark_wrapped_number(t)
        if len(_scalars) < 4096:
            _scalars[key] = t
    return t


def _to_host(x, what: str = ""):
    """Device tensors -> zero-copy CPU views; `device=neuron` arguments -> cpu (for work run at once: work
    launched on the queue gets its host views from the launch). `what`: the op, named by a view's error."""
    tx = type(x)
    if tx in _PLAIN:
        return x
    if isinstance(x, _Tensor):
        if x.device.type == DEVICE:
            return memory.host_view(x, what)
        return x
    if isinstance(x, (list, tuple)):
        if x and isinstance(x[0], (_Tensor, type(None))):
            return [_to_host(t, what) if t is not None else None for t in x]
        return x
    if isinstance(x, torch.device) and x.type == DEVICE:
        return _cpu
    return x


def _to_meta(x):
    if isinstance(x, _Tensor):
        if x.device.type == DEVICE:
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=_meta)
        return x
    if isinstance(x, (list, tuple)):
        if x and isinstance(x[0], (_Tensor, type(None))):
            return [_to_meta(t) if t is not None else None for t in x]
        return x
    if isinstance(x, torch.device) and x.type == DEVICE:
        return _meta
    return x


# ---------------------------------------------------------------------------------------------------------
# The three routes.


def _view(rec: OpRecord, args: list, index: int):
    if any(isinstance(a, _Tensor) and _private.is_zero_tensor(a) for a in args):  # a view of memory that is not there
        out = rec.call([_to_meta(a) for a in args])  # (PyTorch's ZeroTensor key passes views through)
        back = lambda r: memory.zero_tensor(r.shape, r.stride(), r.dtype, index)  # noqa: E731
        return back(out) if isinstance(out, _Tensor) else type(out)(back(r) for r in out)
    hargs = [_to_host(a, rec.name) for a in args]
    out = rec.call(hargs)
    sources = [a for a in args if isinstance(a, _Tensor) and a.device.type == DEVICE]

    def back(r):
        ptr = r.untyped_storage().data_ptr()
        for s in sources:
            if memory.host_storage(s.untyped_storage()).data_ptr() == ptr:
                return memory.wrap(
                    s.untyped_storage(), index, r.dtype, r.size(), r.stride(), r.storage_offset(), s.is_inference()
                )
        return memory.from_host(r, index)  # not a view after all (e.g. a CPU scalar input)

    if isinstance(out, _Tensor):
        return back(out)
    return type(out)(back(r) for r in out) if isinstance(out, (list, tuple)) else out


def _native(rec: OpRecord, args: list, index: int, key: tuple):
    if rec.random or rec.name in policy.RUN_AT_ONCE:  # the generator is read at the call, not when the queue
        return run_on_host(rec.name, rec, args, index, fallback=False)  # runs (rng.py); policy.RUN_AT_ONCE
    when = policy.RUN_AT_ONCE_WHEN.get(rec.name)
    if when is not None and when(args):  # (not cached: the C++ kernel keeps sending this signature here)
        return run_on_host(rec.name, rec, args, index, fallback=False, check=True)
    spec = rec.meta_cache.get(key, _MISSING)
    first = spec is _MISSING
    if first:
        try:
            spec = _meta_spec(rec, args)
        except Exception:  # noqa: BLE001 - no usable meta kernel; the host run reports real errors
            spec = None
    if spec is None:  # output metadata unknown without running: run it now, still "on the device"
        res = run_on_host(rec.name, rec, args, index, fallback=False, check=first)
        if first:  # (a call that raised is not cached: the next one is checked again)
            rec.meta_cache[key] = None
        return res
    kind, outs_spec, resizes, plan = spec
    if first and resizes:  # CPU's kernel resizes them itself the first time: its checks of the out= arguments
        res = run_on_host(rec.name, rec, args, index, fallback=False, check=True)  # come before its resize
        rec.meta_cache[key] = spec
        return res
    for i, shape in resizes:  # out= arguments the op resizes
        t = args[i]
        if t.shape != shape:
            _warn_resized(t, shape)
            resize_(t, shape)
    if kind == "mutating":
        if first:
            _first_call(rec, key, spec, _run_mutating_checked if plan is not None and plan.casts else _run_mutating,
                        args)
        else:
            queue.launch("op", rec.name, _run_mutating, rec, args)
        state.device.rt.count_executed(rec.name)
        return rec.alias_returns(args)
    outs = [memory.empty_strided(shape, stride, dtype, index) for shape, stride, dtype in outs_spec]
    run = _run_functional_policy if plan is not None and plan.casts else _run_functional
    if rec.name in gemm_policy.OPS and policy.upcasts_gemm(rec, args):  # per call (tests change min_rows)
        run = _run_upcast_gemm
    if first:
        _first_call(rec, key, spec, _run_functional_checked if run is _run_functional_policy else run, args, outs)
    else:
        queue.launch("op", rec.name, run, rec, args, outs)
    state.device.rt.count_executed(rec.name)
    if kind == "tensor":
        return outs[0]
    if kind == "list":
        return outs
    return tuple(outs)


def _first_call(rec: OpRecord, key: tuple, spec: tuple, run, args: list, outs: list | None = None) -> None:
    """The first call of a call signature runs at once (after the queue drains), so that the checks CPU's kernel
    makes of shapes, dtypes and out= arguments, which meta kernels do not all make (an index_put_ whose indices
    do not broadcast, `all(out=float64)`), raise at the call as on CPU and CUDA; later calls of a signature that
    passed are queued, and only value errors (an index out of range) wait for the sync, as on CUDA. A failing
    signature is not cached: every call of it runs at once and raises.

    The run also learns the output strides CPU's kernel really writes: an out= kernel that restrides its output
    (reflection_pad2d.out makes a channels_last input's output channels_last where the meta kernel says
    contiguous) would write that layout into memory the device tensor reads in another. The device tensor takes
    CPU's strides, and so do the outputs of every later call."""
    try:
        if outs is None:
            queue.run_now("op", rec.name, run, rec, args)
            rec.meta_cache[key] = spec
            return
        # (rec, host args, host outs) as the queue passes them, which the profiler reads
        strides = queue.run_now("op", rec.name, lambda r, h, o: _run_reporting_strides(run, r, h, o), rec, args, outs)
    except Exception as e:
        if state.device.sync:  # NATIVELAB_SYNC=1 names the op in every failure, as its launches do
            raise queue.DeviceError(f"neuron: queued op {rec.name} failed: {type(e).__name__}: {e}") from e
        raise
    kind, outs_spec, resizes, plan = spec
    if any(tuple(st) != tuple(o[1]) for st, o in zip(strides, outs_spec)):
        for out, st in zip(outs, strides):
            if tuple(st) != out.stride():
                memory.set_storage(out, out.untyped_storage(), out.storage_offset(), out.shape, st)
        outs_spec = tuple((shape, tuple(st), dtype) for (shape, _, dtype), st in zip(outs_spec, strides))
        spec = (kind, outs_spec, resizes, plan)
    rec.meta_cache[key] = spec


def _run_reporting_strides(run, rec, hargs, houts):
    run(rec, hargs, houts)
    return [h.stride() for h in houts]


def _warn_resized(t: torch.Tensor, shape) -> None:
    """CPU's warning (at::native::resize_output) for an out= argument with elements that the op resizes."""
    if t.numel() != 0:
        warnings.warn(
            f"An output with one or more elements was resized since it had shape {list(t.shape)}, which does not "
            f"match the required output shape {list(shape)}. This behavior is deprecated, and in a future PyTorch "
            "release outputs will not be resized unless they have zero elements. You can explicitly reuse an out "
            "tensor t by resizing it, inplace, to zero elements with t.resize_(0).", UserWarning, stacklevel=5,
        )



# Queued work. The dtype policy reads values, so it is applied here, when the op runs, not when it is queued.


def _run_mutating(rec, hargs):
    if policy.finish_policy(rec, hargs):
        policy.call_narrowed(rec, hargs)
    else:
        rec.call(hargs)


def _run_mutating_checked(rec, hargs):
    """A signature's first call of an op that writes its arguments and that the dtype policy narrows: CPU's
    kernel first sees the call as the user made it, on scratch copies of what it writes, so that its dtype checks
    raise as on CPU (the policy computes an out= op's functional form and casts into `out`, which would accept
    `index_select(out=int64)` of a float input)."""
    policy.probe(rec, hargs)
    _run_mutating(rec, hargs)




def _run_functional_policy(rec, hargs, houts):
    # Narrowed inputs compute in the narrow dtype; the copy into the outputs casts back (the policy).
    if policy.finish_policy(rec, hargs):
        _run_functional_copy(rec, hargs, houts)
    else:
        _run_functional(rec, hargs, houts)


def _run_functional_checked(rec, hargs, houts):
    """A signature's first call of a functional op the dtype policy may narrow: CPU's kernel sees the call as
    made first (its result dropped), so its dtype checks raise as on CPU (scatter of a float64 tensor with a
    float32 source, which narrowing would make agree)."""
    policy.probe(rec, hargs)
    if policy.finish_policy(rec, hargs):
        _run_functional_copy(rec, hargs, houts, cpu_strides=True)
    else:
        _run_functional(rec, hargs, houts)


def _run_functional(rec, hargs, houts):
    if rec.out_op is not None:
        kw = dict(zip(rec.kwnames, hargs[rec.npos:])) if len(hargs) > rec.npos else {}
        kw.update(zip(rec.out_names, houts))
        rec.out_call(*hargs[: rec.npos], **kw)
    else:
        _run_functional_copy(rec, hargs, houts)


def _run_upcast_gemm(rec, hargs, houts):
    # a bf16 product as an fp32 GEMM of upcast operands, rounded into the bf16 output (see gemm_policy)
    houts[0].copy_(rec.call(gemm_policy.upcast_tensors(hargs)))


def _run_functional_copy(rec, hargs, houts, cpu_strides=False):
    """`cpu_strides` (a signature's first call, whose output strides become the signature's: _first_call): the
    outputs take the strides of CPU's results where the meta kernel said others (reflection_pad2d of a
    narrowed channels_last float64 input is channels_last on CPU, contiguous by its meta kernel)."""
    res = rec.call(hargs)
    for h, r in zip(houts, (res,) if isinstance(res, _Tensor) else res):
        if cpu_strides and h.stride() != r.stride() and h.shape == r.shape and _dense(r) and _dense(h):
            h.set_(h.untyped_storage(), h.storage_offset(), h.shape, r.stride())
        h.copy_(r)


def _dense(t) -> bool:
    """Non-overlapping and dense: its elements fill a span of numel() elements, dims in any order."""
    span = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1):
        if stride != span:
            return False
        span *= size
    return True


def _meta_spec(rec: OpRecord, args: list):
    """(kind, output (shape, stride, dtype)s, out= resizes, the policy's plan) for a call
    signature: everything about a launch that does not depend on values, worked out once."""
    margs = [_to_meta(a) for a in args]
    with warnings.catch_warnings():
        # the out= meta kernels' own resize warning (its text is not CPU's): _native gives CPU's when it resizes
        warnings.filterwarnings("ignore", message="An output with one or more elements was resized")
        res = rec.call(margs)
    plan = policy.plan(rec, args)
    if rec.name in policy.CPU_OUTPUT_DTYPES:
        res = policy.CPU_OUTPUT_DTYPES[rec.name](args, res)
    if rec.mutable:
        resizes = tuple(
            (i, margs[i].shape) for i in rec.mutable
            if isinstance(args[i], _Tensor) and margs[i].shape != args[i].shape
        )
        return ("mutating", (), resizes, plan)
    if isinstance(res, _Tensor):
        return ("tensor", ((res.shape, res.stride(), res.dtype),), (), plan)
    kind = "list" if isinstance(res, list) else "tuple"
    return (kind, tuple((r.shape, r.stride(), r.dtype) for r in res), (), plan)




def run_on_host(name: str, rec: OpRecord, args: list, index: int, fallback: bool = True, check: bool = False):
    """Run an op now: drain the queue, run the CPU kernel on host views, bring the results back.

    A CPU fallback (recorded and warned about once), or a device op whose outputs cannot be known before it
    runs (no meta kernel, data-dependent shapes), which the real device would also have to wait for.
    `check`: the first call of its signature, which CPU's kernel first sees as made when the dtype policy
    narrows it (its dtype errors are CPU's).
    """
    queue.drain()
    if not fallback:
        state.device.rt.count_executed(name)
    elif tracking.record_fallback(name):
        warnings.warn(f"Operator '{name}' fell back to CPU", stacklevel=4)
    if index < 0:
        index = guard.current_index()
    if rec.gen_pos is not None:  # the CPU generator holding the device generator's state (default or given)
        args[rec.gen_pos] = guard.host_generator(args[rec.gen_pos], index)
    hargs = [_to_host(a, rec.name) for a in args]
    grown = []
    for i in rec.mutable:  # the CPU kernel may resize what it writes (an out= argument too small for the result,
        a = args[i]  # nonzero's): it gets a view of the same memory whose storage it can grow, as on CPU
        if isinstance(a, _Tensor) and a.device.type == DEVICE and a.layout == torch.strided:
            hargs[i] = memory.resizable_host_view(a, rec.name)
            grown.append(a)
    narrowed = False
    if not fallback:
        as_called = list(hargs)
        narrowed = policy.finish_policy(rec, hargs)
        if narrowed and (rec.mutable or check):  # CPU's dtype checks of the call as made (_run_mutating_checked;
            policy.probe(rec, as_called)  # `check`: a signature's first call)
    elif rec.int64_args:
        policy.widen_indices(rec, hargs)
    call = policy.call_narrowed if narrowed and rec.mutable else OpRecord.call
    obs = observe.host_op  # the profiler times the host run and counts the bytes moved
    run = call if obs is None else (lambda *a: obs(name, fallback, call, a, args))
    try:
        with rng.default_generator_drawn_from(index) if rec.random and rec.gen_pos is None else _no_context:
            # A CPU fallback is host work; a device op that had to run at once (its outputs unknown until it
            # runs, or random) is the device's: launched to run now (the session above counts it via host_op).
            res = run(rec, hargs) if fallback else queue.run_now("op", name, run, rec, hargs, observed=False)
    finally:
        for a in grown:  # the host storage that stayed the device's is not resizable for anyone else
            memory.host_storage(a.untyped_storage())
    if narrowed:
        res = policy.widen_results(res, args)
    for i in rec.mutable:  # the CPU kernel may have resized an out= argument
        _follow_host_resize(args[i], hargs[i])
    if not rec.returns_alias:
        return None
    if rec.mutable and all(i is not None for i in rec.returns_alias):
        return rec.alias_returns(args)
    return _results_to_device(rec, res, args, index)




def _follow_host_resize(dev, host) -> None:
    if not isinstance(dev, _Tensor) or dev.device.type != DEVICE or not isinstance(host, _Tensor):
        return
    if host.shape == dev.shape and host.stride() == dev.stride() and host.data_ptr() == dev.data_ptr():
        return
    st = dev.untyped_storage()
    if host.untyped_storage().data_ptr() != memory.host_storage(st).data_ptr():
        # The CPU kernel grew the storage (moving it to new CPU memory): grow the device storage in place, as
        # CPU's resize does, so every tensor of that storage sees it, and copy the bytes in.
        hst = host.untyped_storage()
        n = hst.nbytes()
        if n > st.nbytes():
            st.resize_(n)
        if n:
            _bytes(memory.host_storage(st))[:n].copy_(_bytes(hst))
    memory.set_storage(dev, st, host.storage_offset(), host.shape, host.stride())


def _bytes(st: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(st)


def _results_to_device(rec: OpRecord, res, args, index: int):
    if isinstance(res, _Tensor):
        return _one_to_device(rec, 0, res, args, index)
    if isinstance(res, (tuple, list)):
        out = [
            _one_to_device(rec, i, r, args, index) if isinstance(r, _Tensor) else r for i, r in enumerate(res)
        ]
        return type(res)(out) if isinstance(res, tuple) else out
    return res


def _one_to_device(rec, i, r, args, index):
    alias = rec.returns_alias[i] if i < len(rec.returns_alias) else None
    if alias is not None:
        return args[alias]
    if r.device.type != "cpu":
        return r
    if r.layout in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        raise sparse.error(rec.name)  # a CPU fallback made a sparse result (`x.to_sparse()`): no device has it
    if r.layout != torch.strided:  # an mkldnn result (`x.to_mkldnn()`); quantized ones: memory's error
        raise NotImplementedError(
            f"neuron: {rec.name}: its result would be a {r.layout} tensor, which the device cannot hold "
            "(strided tensors only, as on Neuron)"
        )
    return memory.from_host(r, index)


# ---------------------------------------------------------------------------------------------------------
# The boxed kernel behind every op on the device.


def direct_kernels() -> list:
    """Native ops whose functional form PyTorch would otherwise route through `empty` + the `.out` op
    (structured kernels): registering them directly saves an allocation, a resize and a dispatch."""
    found = []
    for name in schema.NATIVE_OPS:
        base, _, overload = name.partition(".")
        packet = getattr(torch.ops.aten, base.split("::", 1)[1], None)
        if packet is None:
            continue
        for ov in ([overload] if overload else [o for o in packet.overloads()]):
            op = getattr(packet, ov or "default", None)
            if op is None or op.is_view:
                continue
            try:
                structured = _private.has_kernel_for_dispatch_key(op.name(), "CompositeExplicitAutogradNonFunctional")
            except RuntimeError:  # a TorchScript-only overload such as aten::le.int
                continue
            # (An in-place foreach op is left to its CompositeExplicitAutograd kernel, one op per tensor, each on
            # the C++ path: registered directly, each call took the Python path and an AdamW step went 2.7 -> 4.8 ms.)
            if structured or str(op) in policy.OVER_COMPOSITE:
                found.append(op)
    for name in policy.HOST_OVER_COMPOSITE:
        found.append(getattr(getattr(torch.ops.aten, name.split(".")[1]), name.split(".")[2]))
    # Once each: the op table names some overloads both alone and under their base name, and a second
    # registration of the same kernel makes the dispatcher warn "Overriding a previously registered kernel".
    return list(dict.fromkeys(found))


def device_kernel(op, key, *args, **kwargs):
    """The Python kernel the C++ one (csrc/ops.cpp) calls for what it leaves to Python. `key`: the call's
    signature key (bytes) that the C++ kernel built for a native op, the one both paths cache under; None for a
    view or a fallback, or a call with an argument the key cannot hold (run uncached)."""
    hook = observe.dispatch  # a watching tool (nativelab.check) sees the call from the user's stack
    if hook is not None:
        return hook(op, args, kwargs, lambda: _device_kernel(op, key, *args, **kwargs))
    return _device_kernel(op, key, *args, **kwargs)


def _device_kernel(op, key, *args, **kwargs):
    rec = _records.get(op) or schema.record_for(op)
    full = rec.normalise(args, kwargs)
    for i in rec.tensor_pos:
        if i < len(full) and type(full[i]) in _NUMBERS:
            full[i] = _scalar_tensor(full[i])  # a wrapped scalar the dispatcher turned into a number
    route = rec.route
    index = _device_index(full, rec.cpu_ok, rec.mutable)
    if route == "native":
        if index < 0:
            index = guard.current_index()
        if key is None:  # nothing to cache it under: each call runs at once, checked as a first call
            return run_on_host(rec.name, rec, full, index, fallback=False, check=True)
        return _native(rec, full, index, key)
    if route == "view":
        return _view(rec, full, index)
    res = run_on_host(rec.name, rec, full, index)
    keep = policy.KEEP_LAYOUT.get(rec.name)
    return res if keep is None else keep(full, res)




def resize_(t: torch.Tensor, shape, memory_format=None) -> torch.Tensor:
    """Resize a device tensor in place, as CPU's resize_ does: when the new shape needs more bytes than its
    storage has, the storage itself grows in place (PyTorch's `UntypedStorage.resize_`, the runtime's resize
    hook: on the storage's core, the old bytes kept), so every tensor of that storage sees the new memory."""
    shape = tuple(shape)
    if memory_format in (None, torch.contiguous_format):
        stride = memory.contiguous_strides(shape)
    else:  # channels_last & co: CPU's strides for that format (and its error for the formats it refuses)
        stride = torch.empty(0, dtype=t.dtype, device="meta").resize_(shape, memory_format=memory_format).stride()
    need = memory._nbytes_for(shape, stride, t.dtype.itemsize) + t.storage_offset() * t.dtype.itemsize
    st = t.untyped_storage()
    if need > st.nbytes():
        st.resize_(need)
    memory.set_storage(t, st, t.storage_offset(), shape, stride)
    return t


# ---------------------------------------------------------------------------------------------------------
# The C++ kernel (csrc/ops.cpp) takes the common case of a native op without entering the interpreter; it asks
# these two once per op overload and once per call signature, and sends every other call to device_kernel.



def fast_route(name: str, overload: str):
    """For the C++ kernel, once per op overload: (the OpOverload, its tracking name, its route, its key). The route:
    None (every call through Python), ('f', out= overload name or '') for a functional op queued with its
    outputs, or ('m', the argument each return is) for an op that writes its arguments. The key: None (a view
    or a fallback: its calls are not keyed), else whether float arguments' values are part of the call's
    signature key (`rec.out_args`: they may size out= arguments); the C++ kernel then keys every call, for its
    own cache and for the Python path's."""
    ns, _, base = name.partition("::")
    op = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
    rec = schema.record_for(op)
    keyed = rec.out_args if rec.route == "native" else None
    if rec.route != "native" or rec.random or rec.cpu_ok or rec.name in policy.RUN_AT_ONCE:
        return op, rec.name, None, keyed
    if rec.mutable:  # (an op that returns nothing, `_fused_adamw_`, is queued the same way)
        if all(i is not None for i in rec.returns_alias):
            return op, rec.name, ("m", tuple(rec.returns_alias)), keyed
        return op, rec.name, None, keyed
    out = schema.op_schema(rec.out_op).overload_name if rec.out_op is not None else ""
    return op, rec.name, ("f", out), keyed


def fast_spec(op, key: bytes):
    """For the C++ kernel, once per call signature (its key: dtypes, shapes, strides, the other arguments): None
    (this signature goes through Python: `policy.plan` has work, no meta kernel, an out= argument to resize),
    False (not yet: this call through Python, ask again), else (kind, [(shape, stride, dtype) of each output])."""
    # The spec the Python path validated by running the signature's first call (_first_call), under the same
    # key: until then, False: this call goes to Python, which runs it at once, and the C++ kernel asks again.
    spec = _records[op].meta_cache.get(key, _MISSING)
    if spec is _MISSING:
        return False
    if spec is None:  # no usable meta kernel: the Python path runs it on the host
        return None
    kind, outs, resizes, plan = spec
    if resizes or (plan is not None and plan.work):  # the policy has work (policy.plan, from the first call)
        return None
    return kind, [(tuple(shape), tuple(stride), dtype) for shape, stride, dtype in outs]


def _refresh_fast_path() -> None:
    """The C++ path is on unless turned off (NATIVELAB_FAST_PATH=0, `state.device.set(fast_path=False)`), off
    in sync mode and while anything watches the device (a profiler, nativelab check)."""
    dev = state.device
    dev.rt.set_fast(dev.fast_path and not dev.sync and not observe.watched())


def _mode_changed() -> None:
    queue.drain()  # the work queued before the change runs as it was queued
    _refresh_fast_path()


def install() -> None:
    """Register the device's kernel (the C++ one, which calls device_kernel for what it leaves to Python)."""
    direct = sorted(op.name().split("::", 1)[1] for op in direct_kernels() if op.name().startswith("aten::"))
    state.device.rt.install_kernels(device_kernel, fast_route, fast_spec, direct)
    state.device.on_change(_mode_changed)
    observe._listeners.append(_refresh_fast_path)
    _refresh_fast_path()


# -- What the layers above may ask (the graph runtime, the profiler): public, so they import no underscore name.


def device_index(args) -> int:
    """The core all tensor arguments of a call live on (-1: none), by the eager rules (CPU tensors only as
    0-d scalars): where a compiled graph launches."""
    return _device_index(args)


def is_immediate(t: torch.Tensor) -> bool:
    """A 0-d CPU constant the device made for a Python scalar (`t * 2`): an immediate, not memory traffic."""
    return any(t is v for v in _scalars.values())


def after_import(name: str, fn) -> None:
    """Call fn(module) once the module `name` is imported (now, if it already is), without importing it: how a
    layer above sets up a part of PyTorch that costs seconds to import (the compiler, Inductor's entry)."""
    _private.after_import(name, fn)
