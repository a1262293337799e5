"""Every private PyTorch API nativelab uses, exercised directly: if a PyTorch upgrade changes one, the
failure names it here (see src/nativelab/device/_private.py)."""

import importlib
import logging

import pytest
import torch

from nativelab.device import _private, memory


def test_torch_version_is_the_pinned_one():
    assert torch.__version__.split("+")[0] == "2.13.0"


def test_empty_tensor_on_any_core_via_dlpack():
    for i in range(4):
        t = _private.empty_on_index(i, torch.bfloat16)
        assert t.device == torch.device("neuron", i) and t.dtype == torch.bfloat16 and t.numel() == 0


def test_new_tensor_and_set_storage_redispatch():
    tpl = _private.empty_on_index(1, torch.float32)
    t = _private.new_tensor_like(tpl)
    assert t is not tpl and t.device == tpl.device and t._version == 0
    st = memory.alloc_storage(4 * 6, 1)
    out = _private.set_tensor_storage(t, st, 0, (2, 3), (3, 1))
    assert out.shape == (2, 3) and out.data_ptr() == st.data_ptr()


def test_zero_tensor_key_is_visible():
    assert _private.is_zero_tensor(torch._efficientzerotensor((2,))) and not _private.is_zero_tensor(torch.zeros(2))
    z = torch._efficientzerotensor((2,), device="neuron")
    assert _private.is_zero_tensor(z) and z.device.type == "neuron"


def test_backend_registered_under_its_name():
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    assert torch.neuron.default_generators[0].device == torch.device("neuron", 0)


def test_patched_repr():
    import torch._tensor_str as ts

    assert ts._str_intern.__name__ == "_str_intern" and ts._str_intern.__module__ == _private.__name__


def test_backward_runs_in_the_calling_thread():
    import threading

    assert torch._C._is_multithreading_enabled() is False
    seen = []
    t = threading.Thread(target=lambda: seen.append(torch._C._is_multithreading_enabled()))
    t.start()
    t.join()
    assert seen == [True]  # a per-thread flag: other threads run backward in autograd's device threads


def test_no_python_modes_pops_fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert type(torch.empty(1)).__name__ == "FakeTensor"
        with _private.no_python_modes():
            assert type(torch.empty(1)) is torch.Tensor


def test_process_group_methods_the_neuron_backend_overrides():
    """nativelab.distributed's Python ProcessGroup overrides these by name (c10d calls them on a group
    returned by a backend creator); a rename in PyTorch would silently bypass the override."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from nativelab.distributed import NeuronProcessGroup
    from nativelab.distributed import _private as d_private

    for name in ("_set_group_name", "_set_group_desc", "_get_backend_name", "_set_sequence_number_for_group",
                 "all_gather_single", "reduce_scatter_single", "all_to_all_single", "all_gather_single_coalesced",
                 "reduce_scatter_single_coalesced", "allreduce", "allgather", "broadcast", "barrier", "send", "recv",
                 "_start_coalescing", "_end_coalescing"):
        assert hasattr(dist.ProcessGroup, name), name
        # the private names in distributed/_private.py's base class, which forwards them to public methods
        assert name in vars(d_private.PythonProcessGroup if name.startswith("_") else NeuronProcessGroup), name
    assert {"_allgather_base", "_reduce_scatter_base"} <= set(vars(d_private.PythonProcessGroup))
    for name in ("_allgather_base", "_reduce_scatter_base", "alltoall_base", "allreduce", "barrier",
                 "_set_sequence_number_for_group"):
        assert hasattr(dist.ProcessGroupGloo, name), name
    for name in ("AllreduceOptions", "AllgatherOptions", "ReduceScatterOptions", "BarrierOptions", "AllToAllOptions"):
        assert hasattr(c10d, name), name
    assert dist.ReduceOp.RedOpType.PREMUL_SUM is not None


def test_profiler_private_apis():
    """The profiler's private PyTorch calls (src/nativelab/profile/_private.py)."""
    from nativelab.profile import _private as prof_private

    assert prof_private.torch_profiler_enabled() is False
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert prof_private.torch_profiler_enabled() is True
    assert isinstance(prof_private.dynamo_counters(), dict)
    seen = []
    start, end = (lambda a: seen.append(("start", a.compile_id))), (lambda a: seen.append(("end", a.compile_id)))
    prof_private.add_compile_callbacks(start, end)
    try:
        f = torch.compile(lambda x: x + 1, backend="eager")
        f(torch.ones(2))
        f(torch.ones(3))  # a recompile of the same frame
    finally:
        prof_private.remove_compile_callbacks(start, end)
    ids = [prof_private.compile_id_of_str(cid) for kind, cid in seen if kind == "end"]
    assert ids[0][1] == 0 and any(attempt > 0 for _, attempt in ids), seen
    assert seen and all(kind in ("start", "end") for kind, _ in seen)


def test_compiler_dynamo_and_fake_tensor_apis():
    """The compiler's Dynamo, AOTAutograd and fake-tensor calls (src/nativelab/compiler/_private.py)."""
    import torch.fx
    from torch.fx.experimental.proxy_tensor import make_fx

    from nativelab.compiler import _private as cc_private

    seen = []

    def fw(gm, example_inputs):
        seen.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return cc_private.make_boxed_func(gm.forward)

    torch._dynamo.reset()
    f = torch.compile(lambda x: x.sin() + 1, backend=cc_private.aot_autograd(fw_compiler=fw, inference_compiler=fw))
    assert torch.equal(f(torch.ones(3)), torch.ones(3).sin() + 1) and torch.ops.aten.sin.default in seen[0]
    assert not cc_private.dynamo_backend_known("nativelab_canary")
    cc_private.register_dynamo_backend("nativelab_canary", lambda gm, ex: gm.forward)
    assert cc_private.dynamo_backend_known("nativelab_canary")
    assert isinstance(torch.ops.aten.add.Tensor, cc_private.OpOverload)

    gm = make_fx(lambda x: x.sum(0))(torch.ones(2, 3))  # traced at one shape, metadata recomputed for another
    cc_private.recompute_meta(gm, [torch.ones(5, 7)])
    assert [tuple(n.meta["val"].shape) for n in gm.graph.nodes if n.op == "call_function"] == [(7,)]
    import inspect

    from torch._inductor import CompiledArtifact

    assert {"dynamic_shapes", "options"} <= set(inspect.signature(torch._inductor.standalone_compile).parameters)
    assert {"path", "format"} <= set(inspect.signature(CompiledArtifact.load).parameters)
    # Inductor's FX graph cache key takes torch.compiler.config.cache_key_tag (where we put the vector ISA) and
    # pick_vec_isa still names the ISA Inductor generates for
    from torch._inductor import codecache, cpu_vec_isa

    assert "cache_key_tag" in inspect.getsource(codecache.FxGraphHashDetails.__init__)
    assert str(cpu_vec_isa.pick_vec_isa()) in cc_private.inductor_cache_tag()
    importlib.import_module(cc_private.STANDALONE_COMPILE_LOGGER)  # the logger we quiet is that module's own
    assert cc_private.STANDALONE_COMPILE_LOGGER in logging.Logger.manager.loggerDict


def test_default_backend_reaches_inductor_through_compile_fx():
    """compiler/_private.py's route_default_backend: torch.compile(model) and backend="inductor" call the module
    attribute torch._inductor.compile_fx.compile_fx at compile time, with only DEFAULT_BACKEND_KWARGS, and our
    wrapper is the one installed there (the device installs it when it registers)."""
    import importlib

    from nativelab.compiler import _private as cc_private
    from nativelab.compiler import default_backend

    mod = importlib.import_module(cc_private.INDUCTOR_ENTRY)
    assert mod.compile_fx.nativelab_route is default_backend.route
    installed, calls = mod.compile_fx, []

    def recorder(gm, example_inputs, *args, **kwargs):
        calls.append((args, set(kwargs)))
        return gm.forward

    try:
        mod.compile_fx = recorder
        for backend in ("inductor", None):
            torch._dynamo.reset()
            f = torch.compile(lambda x: x * 2) if backend is None else torch.compile(lambda x: x * 2, backend=backend)
            assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))
    finally:
        mod.compile_fx = installed
        torch._dynamo.reset()
    assert len(calls) == 2 and all(not a and k <= cc_private.DEFAULT_BACKEND_KWARGS for a, k in calls), calls


def test_swap_of_a_parameter_held_by_autograd():
    """device/_private.py's swap_tensors_held_by_autograd: PyTorch's `torch.utils.swap_tensors` still refuses a
    tensor an autograd graph holds; ours swaps it (`_use_count`, `_swap_tensor_impl`) and poisons the old graph."""
    w = torch.nn.Parameter(torch.ones(3, 3))
    out = (torch.ones(2, 3, requires_grad=True) @ w).tanh() @ w  # w saved for backward
    assert w._use_count() > 2
    with pytest.raises(RuntimeError, match="use_count"):
        torch.utils.swap_tensors(w, torch.nn.Parameter(torch.zeros(3, 3)))
    new = torch.nn.Parameter(torch.zeros(3, 3))
    _private.swap_tensors_held_by_autograd(w, new)
    assert torch.equal(w.detach(), torch.zeros(3, 3)) and torch.equal(new.detach(), torch.ones(3, 3))
    with pytest.raises(RuntimeError, match="before its module moved"):
        out.sum().backward()


def test_module_apply_moves_a_parameter_through_torch_functions_a_mode_sees():
    """device/_private.py's is_shallow_copy_check, is_data_setter and is_grad_getter (device/conversion.py's
    per-thread mode answers them): `Module._apply` still asks `torch._has_compatible_shallow_copy_type` whether
    a converted parameter can be set in place, reads `param.grad`, moves the parameter with `param.data = moved`,
    then asks again for the gradient and moves it with `param.grad.data = moved`, each call seen by a
    TorchFunctionMode."""
    from torch.overrides import TorchFunctionMode

    tests = {"check": _private.is_shallow_copy_check, "set": _private.is_data_setter, "grad": _private.is_grad_getter}
    seen = []

    class Recording(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.extend(name for name, test in tests.items() if test(func))
            return func(*args, **(kwargs or {}))

    lin = torch.nn.Linear(2, 2, bias=False)
    lin.weight.grad = torch.ones(2, 2)
    with Recording():
        lin.double()
    assert seen == ["check", "grad", "set", "check", "grad", "grad", "set"]
    assert lin.weight.dtype == lin.weight.grad.dtype == torch.float64


def test_compiler_rng_apis():
    """The compiler's view of random ops (src/nativelab/compiler/_private.py): AOTAutograd still replays a
    random op of a checkpointed region with the two operators `rng_state_hops` names, with the signatures
    compiler/random_ops.py rewrites; Inductor's `fallback_random` switch still exists."""
    import torch._inductor.config
    import torch.nn.functional as F

    from nativelab.compiler import _private as cc_private

    save, replay = cc_private.rng_state_hops()
    seen = []

    def compiler(gm, example_inputs):
        seen.append([n for n in gm.graph.nodes if n.op == "call_function" and n.target in (save, replay)])
        return cc_private.make_boxed_func(gm.forward)

    def f(x):
        return torch.utils.checkpoint.checkpoint(lambda t: F.dropout(t * 3, 0.5, training=True), x,
                                                 use_reentrant=False)

    torch._dynamo.reset()
    x = torch.ones(8, requires_grad=True)
    torch.compile(f, backend=cc_private.aot_autograd(fw_compiler=compiler, bw_compiler=compiler))(x).sum().backward()
    torch._dynamo.reset()
    (fw_node,), (bw_node,) = seen
    assert fw_node.target is save and fw_node.args[0] is torch.ops.aten.native_dropout.default
    assert bw_node.target is replay and bw_node.args[1] is torch.ops.aten.native_dropout.default
    state, (out, _) = save(torch.ops.aten.native_dropout.default, torch.ones(64), 0.5, True)  # CPU semantics
    again, _ = replay(state, torch.ops.aten.native_dropout.default, torch.ones(64), 0.5, True)
    assert state.dtype == torch.uint8 and torch.equal(again, out)
    assert isinstance(cc_private.inductor_fallback_random(), bool)
    with torch._inductor.config.patch(fallback_random=True):
        assert cc_private.inductor_fallback_random() is True


def test_kernel_private_apis():
    """The kernel library's fake-tensor check and version counter (src/nativelab/kernels/_private.py)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nativelab.kernels import _private as k_private

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.ones(2))
    assert k_private.is_fake(fake) and not k_private.is_fake(torch.ones(2))
    t = torch.ones(2)
    v = k_private.version(t)
    t.add_(1)
    assert k_private.version(t) == v + 1


def test_device_operator_and_dispatcher_apis():
    """device/_private.py's operator schema and raw callable, dispatcher questions, the backend's name, the
    composite redispatch, the autocast exclusion, `.to`'s argument parser, a module's tensor tables and the
    lazy negative view."""
    add = torch.ops.aten.add.Tensor
    assert isinstance(add, _private.OpOverload)
    s = _private.op_schema(add)
    assert (s.name, s.overload_name, [a.name for a in s.arguments]) == ("aten::add", "Tensor", ["self", "other", "alpha"])
    assert s.returns[0].alias_info is None and _private.op_schema(len) is None
    two, three = torch.full((2,), 2.0), torch.full((2,), 3.0)
    assert torch.equal(_private.op_callable(torch.ops.aten.mul.Tensor)(two, three), torch.full((2,), 6.0))
    assert _private.has_kernel_for_dispatch_key("aten::add.Tensor", "CompositeExplicitAutogradNonFunctional")
    assert not _private.has_kernel_for_dispatch_key("aten::sort", "CompositeExplicitAutogradNonFunctional")
    with pytest.raises(RuntimeError):
        _private.has_kernel_for_dispatch_key("aten::le.int", "CompositeExplicitAutogradNonFunctional")
    assert _private.privateuse1_backend_name() == "neuron"
    to_copy = _private.redispatch_to_composite(torch.ops.aten._to_copy.default)
    d = torch.randn(3).to("neuron")
    assert to_copy(d, dtype=torch.float64).dtype == torch.float64 and to_copy(d).device == d.device
    a = torch.randn(4, 4).to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
        with _private.without_autocast():
            assert (a @ a).dtype == torch.float32
    assert _private.parse_to("cpu", torch.float16) == (torch.device("cpu"), torch.float16, False, None)
    params, buffers = _private.own_tensor_tables(torch.nn.BatchNorm1d(2))
    assert set(params) == {"weight", "bias"} and set(buffers) == {"running_mean", "running_var", "num_batches_tracked"}
    z = torch.tensor([1 + 2j])
    n = _private.neg_view(z)
    assert n.is_neg() and torch.equal(n.resolve_neg(), -z)


def test_nki_private_apis():
    """The NKI layer's fake-tensor and view checks (src/nativelab/nki/_private.py)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nativelab.nki import _private as nki_private

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.ones(2))
    assert nki_private.is_fake(fake) and not nki_private.is_fake(torch.ones(2))
    t = torch.ones(4)
    assert nki_private.is_view(t[1:]) and not nki_private.is_view(t) and not nki_private.is_view(t + 1)


def test_nki_private_apis_of_the_loop_roller():
    """What nki/rolling.py reads of make_fx and traces with it (src/nativelab/nki/_private.py): the graph being
    recorded, a tensor's node in it, the tracked tensors, schema alias annotations, a loop body traced into a
    graph of its own (an unbacked counter whose range is told to the shape environment, a tensor made untracked
    written in place) while the outer graph records nothing of it."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from nativelab.nki import _private as nki_private

    aten = torch.ops.aten
    assert nki_private.written_argument(aten.add_.Tensor) == 0 and nki_private.written_argument(aten.add.Tensor) is None
    assert nki_private.is_view_op(aten.slice.Tensor) and not nki_private.is_view_op(aten.copy_.default)
    assert nki_private.is_higher_order(torch.ops.higher_order.while_loop) and not nki_private.is_higher_order(aten.mm)
    assert nki_private.fx_graph() is None
    seen = {}

    def f(a, out):
        b = a * 2
        seen["graph"], seen["node"] = nki_private.fx_graph(), nki_private.proxy_node(b)
        seen["tracked"] = any(t is b and n is seen["node"] for t, n in nki_private.tracked_tensors())

        def body(k, o, src):
            s = k.item()
            nki_private.check_range(s, 0, 4)
            o.narrow(0, s * 2, 2).copy_(src.narrow(0, s * 2, 2))
            return ()

        with nki_private.untracked():
            inputs = (torch.zeros((), dtype=torch.int64), out.clone())
        n_before = len(seen["graph"].nodes)
        seen["body"] = nki_private.trace_subgraph(body, *inputs, b)
        seen["outer unchanged"] = len(seen["graph"].nodes) == n_before
        return (out,)

    make_fx(f, tracing_mode="fake")(torch.ones(8), torch.zeros(8))
    assert seen["node"].graph is seen["graph"] and seen["node"].target is aten.mul.Tensor and seen["tracked"]
    assert seen["outer unchanged"]
    body = seen["body"]
    assert [n.op for n in body.graph.nodes].count("placeholder") == 3
    o = torch.zeros(8)
    for k in range(4):
        body(torch.tensor(k), o, torch.arange(8.0))
    assert torch.equal(o, torch.arange(8.0))


def test_kernel_ops_bump_versions_without_fill_defaults(monkeypatch):
    """kernel_op replaces custom_op's version-bump kernel for a mutating op (src/nativelab/kernels/_private.py:
    lean_version_bump, which reaches CustomOpDef._lib, _opoverload and torch._C._after_ADInplaceOrView_keyset):
    the mutated tensors' versions still advance, in and out of inference mode, and PyTorch's fill_defaults
    (quadratic in the argument count) is not called on the way."""
    import torch._library.utils as lib_utils

    from nativelab.kernels.interface import kernel_op

    @kernel_op("nativelab_test::bump_probe", mutates_args=("xs", "y"))
    def probe(a: torch.Tensor, xs: list[torch.Tensor], y: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        for x in xs:
            x.mul_(scale)
        y.add_(1)
        return a.clone()

    calls = []
    real = lib_utils.fill_defaults
    monkeypatch.setattr(lib_utils, "fill_defaults", lambda *a: calls.append(1) or real(*a))
    xs, y = [torch.ones(2), torch.ones(3)], torch.zeros(1)
    before = [t._version for t in (*xs, y)]
    probe(torch.ones(1), xs, y)
    with torch.inference_mode():
        probe(torch.ones(1), xs, y, 3.0)
    assert [t._version for t in (*xs, y)] == [v + 4 for v in before]  # two bumps by the op, two by the writes
    assert xs[0].tolist() == [6.0, 6.0] and y.item() == 2.0 and calls == []


def test_profiler_sees_an_overload_type():
    from nativelab.profile import _private as prof_private

    assert isinstance(torch.ops.aten.mm.default, prof_private.OpOverload)


@pytest.mark.slow
def test_compiler_version_counter_and_storage_key():
    """compiler/_private.py's version counter (a frozen parameter written in place is stale) and storage
    identity (an output that is an input's view)."""
    from nativelab.compiler import _private as cc_private

    t = torch.ones(4)
    v = cc_private.version(t)
    t.mul_(2)
    assert cc_private.version(t) == v + 1
    assert cc_private.storage_key(t) == cc_private.storage_key(t[1:]) != cc_private.storage_key(torch.ones(4))


def test_compiler_private_apis(monkeypatch):
    """The compiler's hook on Inductor's C++ kernels (src/nativelab/compiler/_private.py): the hook point still
    exists, every kernel's source passes through it, and on an AVX-512 machine the bf16 32x32 tile transpose it
    rewrites is still spelled as it expects (if Inductor renames it, the rewrite silently stops: fail here)."""
    from torch._inductor.async_compile import AsyncCompile

    from nativelab.compiler import _private as cc_private

    cc_private.install_cpp_source_filter()
    assert hasattr(AsyncCompile.cpp_pybinding, "__wrapped__")
    seen = []
    rewrite = cc_private.split_bf16_tile_transposes
    monkeypatch.setattr(cc_private, "split_bf16_tile_transposes", lambda s: seen.append(s) or rewrite(s))
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x.transpose(1, 2) * 2, x.transpose(1, 2).contiguous()), backend="inductor")
    x = torch.randn(4, 192, 128).to(torch.bfloat16)
    doubled, moved = f(x)
    assert torch.equal(doubled, x.transpose(1, 2) * 2) and torch.equal(moved, x.transpose(1, 2))
    assert seen and all(cc_private.PREFIX in s for s in seen)
    if torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX"):
        tiled = [s for s in seen if cc_private.TILE_32 in s]
        assert tiled, "Inductor no longer emits the tile transpose we rewrite"
        assert cc_private.TILE_32 not in rewrite(tiled[0]) and "nativelab_transpose_bf16_32x32(" in rewrite(tiled[0])


def test_fused_transformer_paths_read_the_python_backend_name():
    # nativelab resets this name so the device stays out of PyTorch's fused nested-tensor fast paths.
    import inspect

    import torch.utils.backend_registration as br

    assert br._privateuse1_backend_name == "privateuseone"
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    for fn in (torch.nn.TransformerEncoder.forward, torch.nn.TransformerEncoderLayer.forward):
        assert "backend_registration._privateuse1_backend_name" in inspect.getsource(fn)
    assert "_check_arg_device" in inspect.getsource(torch.nn.MultiheadAttention.forward)


def test_check_reads_dynamo_compilation_metrics():
    """nativelab.check reads Dynamo's record of frame compilations for recompile reasons and graph-break lines,
    and operator overloads' base names (its cost estimate)."""
    import torch._dynamo.utils as dynamo_utils

    from nativelab.check import _private as check_private

    import collections
    import dataclasses

    assert isinstance(dynamo_utils._compilation_metrics, collections.deque)
    fields = {f.name for f in dataclasses.fields(dynamo_utils.CompilationMetrics)}
    assert {"compile_id", "co_name", "co_filename", "co_firstlineno", "recompile_reason", "restart_reasons",
            "entire_frame_compile_time_s", "start_time_us"} <= fields
    assert isinstance(check_private.dynamo_compilation_metrics(), list)
    assert isinstance(torch.ops.aten.mm.default, check_private.OpOverload)
    assert check_private.is_mutating(torch.ops.aten.add_.Tensor) and not check_private.is_mutating(torch.ops.aten.add.Tensor)
    # Scalar arguments are values; int arguments (ignore_index=-100, reduction, dims) are not
    assert check_private.scalar_args(torch.ops.aten.add.Scalar) == (frozenset({0, 1, 2}),
                                                                     frozenset({"self", "other", "alpha"}))
    assert check_private.scalar_args(torch.ops.aten.nll_loss_forward.default)[0] == {0, 1, 2}  # not 3, 4 (ints)
    assert check_private.scalar_args(torch.ops.aten.clamp.default)[1] == {"self", "min", "max"}
    calls = []
    real = getattr(torch.nn.Module, check_private.MODULE_APPLY)
    m = torch.nn.Linear(2, 2)
    setattr(m, check_private.MODULE_APPLY, lambda fn, *a, **k: calls.append(fn) or real(m, fn, *a, **k))
    m.double()
    assert calls and m.weight.dtype is torch.float64


def test_check_reads_what_torch_compile_made():
    """nativelab.check records torch.compile calls without replacing it (check/compile_calls.py): the module wrapper
    registers the module as its `_orig_mod` child inside torch.compile, and the Dynamo context found on the stack
    (then, and while a compiled function's frame compiles) keeps the backend, mode, options, dynamic, fullgraph."""
    import sys

    from nativelab.check import _private as check_private

    seen = []

    def registered(module, name, submodule):
        if check_private.is_compiled_module(module) and name == check_private.COMPILED_MODULE_CHILD:
            seen.append(check_private.dynamo_context_on_stack(sys._getframe(1)))

    handle = torch.nn.modules.module.register_module_module_registration_hook(registered)
    try:
        lin = torch.nn.Linear(2, 2)
        compiled = torch.compile(lin, backend="neuron", dynamic=True, options={"freezing": False})
        torch.compile(lin, mode="max-autotune-no-cudagraphs")  # Inductor keeps the mode as its configuration
    finally:
        handle.remove()
    assert compiled._orig_mod is lin and check_private.is_compiled_module(compiled) and len(seen) == 2
    assert seen[0][1] is None and check_private.compile_settings(seen[0][0]) == {
        "backend": "neuron", "dynamic": True, "mode": None, "options": {"freezing": False}, "fullgraph": False}
    inductor = check_private.compile_settings(seen[1][0])
    assert inductor["backend"] == "inductor" and inductor["mode"] is None and inductor["options"]

    def backend(gm, example_inputs):  # runs while Dynamo compiles the frame, under the compiled callable's call
        seen.append(check_private.dynamo_context_on_stack(sys._getframe(1)))
        return gm

    def twice(x):
        return x * 2

    torch.compile(twice, backend=backend, fullgraph=True)(torch.ones(2))
    ctx, fn = seen[2]
    assert fn is twice and check_private.compile_settings(ctx) == {
        "backend": "backend", "dynamic": None, "mode": None, "options": None, "fullgraph": True}
    assert check_private.dynamo_context_on_stack(sys._getframe()) == (None, None)


def test_dlpack_device_patch_and_torch_naming_bug():
    # PyTorch's own __dlpack_device__ checks the unrenamed name "privateuse1"; if it learns the renamed one,
    # the patch can go.
    assert hasattr(torch.Tensor.__dlpack_device__, "__wrapped__")
    import inspect

    assert '"privateuse1"' in inspect.getsource(torch.Tensor.__dlpack_device__.__wrapped__)


def test_after_import_hook_runs_on_first_import(tmp_path, monkeypatch):
    import sys

    (tmp_path / "nl_after_import_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    _private.after_import("nl_after_import_probe", lambda m: seen.append(m.VALUE))
    assert seen == []
    import nl_after_import_probe  # noqa: F401

    assert seen == [1]
    _private.after_import("nl_after_import_probe", lambda m: seen.append(2))  # already imported: at once
    assert seen == [1, 2]
    del sys.modules["nl_after_import_probe"]


def test_privateuse1_kineto_profiler_registry_as_csrc_declares_it():
    # csrc/profiler_plugin.cpp declares PyTorch's PrivateUse1ProfilerRegistry itself (its header includes a
    # Kineto header by a path the extension build does not search): the declaration must match the header.
    from pathlib import Path

    header = Path(torch.__file__).parent / "include/torch/csrc/profiler/standalone/privateuse1_profiler.h"
    text = header.read_text()
    assert "std::function<std::unique_ptr<libkineto::IActivityProfiler>()>;" in text
    assert "static PrivateUse1ProfilerRegistry& instance();" in text
    assert "void registerFactory(PrivateUse1ProfilerFactory factory);" in text
    # The session's interface and the kernel activity type PyTorch maps to DeviceType.PrivateUse1.
    kineto = Path(torch.__file__).parent / "include/kineto"
    assert "virtual void pushCorrelationId" in (kineto / "IActivityProfiler.h").read_text()
    assert "CONCURRENT_KERNEL = 5" in (kineto / "ActivityType.h").read_text()


# -- The device's C++ runtime (csrc/): what it calls in libtorch / libtorch_python that is not public API.


def test_cpp_python_kernel_bridge_converts_arguments_and_results():
    """ops.cpp hands calls it leaves to Python over with torch::jit::toPyObject / toIValue (declared by hand)
    plus getTHPDtype / getTHPLayout / getTHPMemoryFormat for ints that are dtypes, layouts, memory formats:
    a Python-path op with such arguments and several results must round-trip."""
    from nativelab.device import state

    with state.device.mode(fast_path=False):
        x = torch.randn(4, 6)
        d = x.to("neuron")
        vals, idx = torch.max(d, dim=1)  # two results through toIValue
        e = torch.empty(2, 3, 4, 5, dtype=torch.bfloat16, device="neuron", memory_format=torch.channels_last)
        s = d.sum(0, dtype=torch.float64)  # a ScalarType argument seen as torch.float64 by the Python kernel
    torch.testing.assert_close(vals.cpu(), x.max(1).values)
    assert torch.equal(idx.cpu(), x.max(1).indices)
    assert e.dtype == torch.bfloat16 and e.is_contiguous(memory_format=torch.channels_last)
    assert s.dtype == torch.float64
    torch.testing.assert_close(s.cpu(), x.sum(0, dtype=torch.float64))


def test_cpp_view_kernels_and_composite_redispatch():
    """ops.cpp registers at::native::view / as_strided_tensorimpl / _reshape_alias for the device and runs
    _to_copy as PyTorch's CompositeExplicitAutograd kernel (redispatchBoxed)."""
    x = torch.randn(4, 6)
    d = x.to("neuron")
    v = d.view(6, 4)
    a = d.as_strided((3, 2), (1, 3), 2)
    assert v.untyped_storage().data_ptr() == d.untyped_storage().data_ptr()
    torch.testing.assert_close(v.cpu(), x.view(6, 4))
    torch.testing.assert_close(a.cpu(), x.as_strided((3, 2), (1, 3), 2))
    h = d.to(torch.float16)
    assert h.device == d.device and h.dtype == torch.float16
    torch.testing.assert_close(h.cpu(), x.to(torch.float16))


def test_cpp_storage_wrap_and_unpack():
    """memory.cpp passes storages to Python with THPStorage_Unpack / THPStorage_Wrap."""
    from nativelab.device import state

    d = torch.randn(8, device="neuron") * 2  # memory the runtime allocated
    st = d.untyped_storage()
    assert state.device.rt.mem_owns(st)
    host = memory.host_storage(st)
    assert host.device.type == "cpu" and host.data_ptr() == st.data_ptr() and host.nbytes() == st.nbytes()


def test_compiler_reads_functionalized_custom_ops_and_dispatch_modes():
    """compiler/_private.py's `functionalized_call` (AOTAutograd's auto_functionalized_v2 node and its view
    information), `python_modes_active` / `no_python_modes`, and kernels/_private.py's `overload_of`."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from nativelab.compiler import _private as cc_private
    from nativelab.kernels import _private as k_private

    @torch.library.custom_op("nativelab_canary::acc", mutates_args=("acc",))
    def acc_op(x: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
        acc.add_(x)
        return x * 2

    acc_op.register_fake(lambda x, acc: torch.empty_like(x))
    assert k_private.overload_of(acc_op) is torch.ops.nativelab_canary.acc.default
    graphs = []

    def inference(gm, example_inputs):
        graphs.append(gm)
        return cc_private.make_boxed_func(gm.forward)

    torch._dynamo.reset()
    backend = cc_private.aot_autograd(fw_compiler=inference, inference_compiler=inference,
                                      keep_inference_input_mutations=True)
    for fn in (lambda x, a: acc_op(x, a), lambda x, a: acc_op(x[1:], a[1:])):
        torch.compile(fn, backend=backend)(torch.ones(3), torch.zeros(3))
    calls = [[cc_private.functionalized_call(n) for n in gm.graph.nodes if n.op == "call_function"]
             for gm in graphs]
    whole = [c for c in calls[0] if c is not None]
    assert len(whole) == 1
    op, kwargs, bases = whole[0]
    placeholders = [n for n in graphs[0].graph.nodes if n.op == "placeholder"]
    assert op is torch.ops.nativelab_canary.acc.default and kwargs["acc"] is bases[0] and bases[0] in placeholders
    assert all(c is None for c in calls[1])  # a mutated view of an input: not described as its base

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    assert not cc_private.python_modes_active()
    with Mode():
        assert cc_private.python_modes_active()
        with cc_private.no_python_modes():
            assert not cc_private.python_modes_active()


def test_cpp_backend_meta_registry_as_csrc_calls_it():
    """csrc/backend_meta.cpp registers the device's tensor metadata with torch::jit::TensorBackendMetaRegistry
    (pickler_helper.h), which torch._utils.get_tensor_metadata / set_tensor_metadata and torch.save reach."""
    from pathlib import Path

    header = Path(torch.__file__).parent / "include/torch/csrc/jit/serialization/pickler_helper.h"
    text = header.read_text()
    assert "void(const at::Tensor&, std::unordered_map<std::string, bool>&)>;" in text
    assert "inline void TensorBackendMetaRegistry(" in text and "GetBackendMetaSerialization();" in text
    t = torch.empty(2, device="neuron")
    torch._utils.set_tensor_metadata(t, {"canary": True})
    assert torch._utils.get_tensor_metadata(t) == {"canary": True}


def test_fake_tensor_converter_and_tensor_metadata_calls():
    """device/_private.fakes_keep_backend_meta wraps FakeTensorConverter.from_real_tensor(self, fake_mode, t, ...)
    and copies torch._C._get_tensor_metadata(t) onto its result with torch._C._set_tensor_metadata."""
    import inspect

    from torch._subclasses import fake_tensor

    wrapped = fake_tensor.FakeTensorConverter.from_real_tensor
    assert getattr(wrapped, "_nl_keeps_backend_meta", False)  # installed when the device registered
    original = next(c.cell_contents for c in wrapped.__closure__ if inspect.isfunction(c.cell_contents))
    assert list(inspect.signature(original).parameters)[:3] == ["self", "fake_mode", "t"]
    t = torch.empty(2, device="neuron")
    torch._C._set_tensor_metadata(t, {"canary": True})
    assert torch._C._get_tensor_metadata(t) == {"canary": True}
