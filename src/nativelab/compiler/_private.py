"""Every private PyTorch (Inductor) API the compiler relies on, each behind one named function.

`tests/test_private_apis.py` exercises each of them, so a PyTorch upgrade that changes one fails there.
"""

from __future__ import annotations

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
