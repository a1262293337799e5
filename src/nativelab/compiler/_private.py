"""Every private PyTorch API the compiler relies on (Dynamo, AOTAutograd, fake tensors, Inductor), each behind
one named function or name here; nothing else in nativelab/compiler imports `torch._*`.

`tests/test_private_apis.py` exercises each of them, so a PyTorch upgrade that changes one fails there.
"""

from __future__ import annotations

import torch
import torch.fx
from torch._ops import OpOverload  # the type of an ATen operator overload (`torch.ops.aten.mm.default`)
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

__all__ = ["OpOverload", "aot_autograd", "make_boxed_func", "dynamo_backend_known", "register_dynamo_backend",
           "recompute_meta", "standalone_compile", "load_artifact", "STANDALONE_COMPILE_LOGGER",
           "split_bf16_tile_transposes", "install_cpp_source_filter", "inductor_cache_tag", "rng_state_hops",
           "inductor_fallback_random", "functionalized_call", "python_modes_active", "no_python_modes",
           "route_default_backend", "INDUCTOR_ENTRY", "DEFAULT_BACKEND_KWARGS"]

# -- Dynamo and AOTAutograd: how the backend receives graphs ------------------------------------------------


def aot_autograd(**compilers):
    """Dynamo's AOTAutograd backend factory: `fw_compiler` / `bw_compiler` / `inference_compiler` each get
    an ATen graph; the result is a Dynamo backend."""
    from torch._dynamo.backends.common import aot_autograd as factory

    return factory(**compilers)


def make_boxed_func(fn):
    """`fn` in AOTAutograd's boxed calling convention (one list of arguments, which it may clear)."""
    from torch._functorch.aot_autograd import make_boxed_func as boxed

    return boxed(fn)


def dynamo_backend_known(name: str) -> bool:
    """Whether Dynamo knows a `torch.compile` backend by this name (registered or from an entry point)."""
    from torch._dynamo.backends.registry import list_backends

    return name in list_backends(exclude_tags=())


def register_dynamo_backend(name: str, compiler_fn) -> None:
    from torch._dynamo.backends.registry import register_backend

    register_backend(compiler_fn=compiler_fn, name=name)


def rng_state_hops():
    """AOTAutograd's operators for a random op inside an activation-checkpointed region: (the forward's
    `run_and_save_rng_state(op, *args)` -> (state, result), the backward's `run_with_rng_state(state, op,
    *args)`). PyTorch implements them for CPU/CUDA/XPU/HPU generator states only."""
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

    return run_and_save_rng_state, run_with_rng_state


def functionalized_call(node: torch.fx.Node):
    """A custom op that mutates its arguments reaches the backend functionalized, as one node
    `auto_functionalized_v2(op, **kwargs)` whose mutated arguments are described by their bases (`_all_bases`)
    and view information; its outputs are (the op's results..., the bases' new values...). Returns (op, the op's
    own keyword arguments with each mutated argument as its base node, the base nodes), or None for any other
    node and for a mutated argument that is a view of its base rather than the base itself."""
    from torch._higher_order_ops.auto_functionalize import NotView, get_mutable_args, read_view_information_from_args

    if node.op != "call_function" or node.target is not torch.ops.higher_order.auto_functionalized_v2:
        return None
    op = node.args[0]
    kwargs = dict(node.kwargs)
    bases = list(kwargs.pop("_all_bases"))
    names, types = get_mutable_args(op)
    views = read_view_information_from_args(names, types, kwargs, bases)  # pops the view keywords

    def base(info):
        if info is None:
            return None
        if type(info) is not NotView:
            raise LookupError  # a view of a base: the op must run on that view, not on the base
        return bases[info.base_index]

    try:
        for name, info in views.items():
            kwargs[name] = [base(i) for i in info] if isinstance(info, list) else base(info)
    except LookupError:
        return None
    return op, kwargs, bases


def python_modes_active() -> bool:
    """Whether a Python dispatch mode (TorchDispatchMode) is active: a cheap check before `no_python_modes`."""
    return torch._C._len_torch_dispatch_stack() > 0


def no_python_modes():
    """Context that pops every active Python dispatch mode for its body."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


# -- Fake tensors: node metadata without running anything ---------------------------------------------------


def recompute_meta(gm: torch.fx.GraphModule, example_inputs) -> None:
    """Recompute every node's metadata (`meta["val"]`) of `gm` for these inputs, with static shapes, by
    running it on fake tensors. Under no_grad: the graphs are already functional (AOTAutograd made them), and
    tracing autograd over inference-mode inputs would fail (it also runs in fresh threads, where grad mode
    is on again)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    # a shape environment for the unbacked integers a rolled loop's body reads its offsets into (nki/rolling.py)
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    fakes = [mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor) else x for x in example_inputs]
    with mode, torch.no_grad():
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)


def version(t: torch.Tensor) -> int:
    """A tensor's version counter: bumped by every in-place write (what autograd checks saved tensors with)."""
    return t._version


def storage_key(t: torch.Tensor) -> int:
    """An identity of a tensor's storage, equal for every tensor (and fake tensor) viewing it."""
    return t.untyped_storage()._cdata


# -- Inductor -----------------------------------------------------------------------------------------------

STANDALONE_COMPILE_LOGGER = "torch._inductor.standalone_compile"  # warns about graphs it cannot serialize


def standalone_compile(gm: torch.fx.GraphModule, example_inputs, freezing: bool):
    """Inductor-compile an ATen graph for these (static-shaped) inputs into a callable artifact, which can be
    saved (`artifact.save(path=..., format="binary")`) unless `artifact.is_saveable()` says otherwise.
    Parallel loops take their thread count from the calling thread at run time (`cpp.dynamic_threads`), so
    the device's thread policy (device/threads.py) governs them; Inductor otherwise sizes per-thread
    reduction buffers by the count at compile time (code compiled while the team was shrunk overran them
    when it grew back), and an explicit `cpp.threads` would hard-code `num_threads(N)`."""
    from torch._inductor import standalone_compile as compile_graph

    with torch.compiler.config.patch(cache_key_tag=inductor_cache_tag()):
        return compile_graph(gm, example_inputs, dynamic_shapes="from_example_inputs",
                             options={"config_patches": {"freezing": freezing, "cpp.dynamic_threads": True}})


INDUCTOR_ENTRY = "torch._inductor.compile_fx"  # the module whose `compile_fx` the default backend calls
DEFAULT_BACKEND_KWARGS = {"config_patches", "compile_region_name"}  # what torch.compile's default passes it


def route_default_backend(route, after_import) -> None:
    """Let `route(gm, example_inputs, config_patches)` answer first for torch.compile's default backend.

    `torch.compile(model)` (and backend="inductor") reach Inductor through the module attribute
    `torch._inductor.compile_fx.compile_fx`, looked up at each compile; this wraps it once that module is
    imported (`after_import`, since importing Inductor costs seconds). A callable `route` returns is the
    compiled graph; None lets Inductor compile as usual. Only the top-level call is asked: Inductor's own
    recursive calls (they pass `inner_compile=`, `decompositions=`) and `standalone_compile`'s go straight
    through."""

    def wrap(mod) -> None:
        real = mod.compile_fx
        if getattr(real, "nativelab_route", None) is not None:
            return

        def compile_fx(model_, example_inputs_, *args, **kwargs):
            if not args and set(kwargs) <= DEFAULT_BACKEND_KWARGS:
                compiled = route(model_, example_inputs_, kwargs.get("config_patches"))
                if compiled is not None:
                    return compiled
            return real(model_, example_inputs_, *args, **kwargs)

        compile_fx.__wrapped__, compile_fx.__doc__, compile_fx.nativelab_route = real, real.__doc__, route
        mod.compile_fx = compile_fx

    after_import(INDUCTOR_ENTRY, wrap)


def inductor_cache_tag() -> str:
    """The tag (`torch.compiler.config.cache_key_tag`) our compiles add to the key of Inductor's FX graph cache:
    the vector ISA Inductor generates code for. That key knows no CPU (its system info is CUDA's), so a graph
    generated for AVX-512 was served to a process running with `ATEN_CPU_CAPABILITY=avx2` (or to another
    machine sharing the cache directory), whose compiler built its 16-lane loops with 8-lane vectors: reads and
    writes past the buffers (a corrupt heap; an index check failing on the garbage)."""
    from torch._inductor import cpu_vec_isa

    base = torch.compiler.config.cache_key_tag
    return f"{base}|nativelab vec_isa={cpu_vec_isa.pick_vec_isa()}"


def inductor_fallback_random() -> bool:
    """Inductor's `fallback_random` setting (`torch._inductor.config.fallback_random`): random ops run as
    PyTorch's eager kernels (the eager numbers) instead of Inductor's own generator. It changes the generated
    code, so it is part of the compile cache key."""
    from torch._inductor import config

    return bool(config.fallback_random)


def load_artifact(path: str):
    """An artifact `standalone_compile` made and saved in binary format, loaded."""
    from torch._inductor import CompiledArtifact

    return CompiledArtifact.load(path=path, format="binary")

# Inductor's C++ backend moves bf16 data across a transposed 32x32 tile with this call (AVX-512 machines).
TILE_32 = "transpose_mxn<at::BFloat16,static_cast<int64_t>(32),static_cast<int64_t>(32),false>("
PREFIX = "#include <torch/csrc/inductor/cpp_prefix.h>"
_TILE_16X4 = """
// nativelab: a bf16 32x32 tile transposed as four 16x16 tiles (see nativelab/compiler/_private.py)
static inline void nativelab_transpose_bf16_32x32(const at::BFloat16* src, int64_t ld_src, at::BFloat16* dst,
                                                  int64_t ld_dst) {
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++)
      at::vec::transpose_mxn<at::BFloat16, 16, 16>(src + i * 16 * ld_src + j * 16, ld_src,
                                                  dst + j * 16 * ld_dst + i * 16, ld_dst);
}
"""
_installed = False


def split_bf16_tile_transposes(source: str) -> str:
    """Rewrite a C++ kernel's bf16 32x32 tile transposes as four 16x16 ones.

    torch 2.13's AVX-512 `transpose_mxn<BFloat16>` (32x32), compiled by GCC 12 at -O2/-O3 into a kernel that
    uses it more than once (e.g. the RoPE backward reading one tile for `t * 2` and for `t`), returns tiles
    with garbage lanes; at -O1, or with the 16x16 routine, it is exact. A bf16 LoRA backward through 30
    layers got NaN gradients from it. The 16x16 routine is as vectorized, so nothing is lost.
    """
    if TILE_32 not in source or PREFIX not in source:
        return source
    source = source.replace(TILE_32, "nativelab_transpose_bf16_32x32(")
    return source.replace(PREFIX, PREFIX + _TILE_16X4, 1)


def install_cpp_source_filter() -> None:
    """Route every C++ kernel Inductor builds in this process (fresh compiles and artifacts loaded from a
    cache alike: both call `AsyncCompile.cpp_pybinding` with the kernel's source) through
    `split_bf16_tile_transposes`. Idempotent."""
    global _installed
    if _installed:
        return
    from torch._inductor.async_compile import AsyncCompile

    original = AsyncCompile.cpp_pybinding

    def cpp_pybinding(self, argtypes, source_code):
        return original(self, argtypes, split_bf16_tile_transposes(source_code))

    cpp_pybinding.__wrapped__ = original
    AsyncCompile.cpp_pybinding = cpp_pybinding
    _installed = True
