"""The layout the Tensor Engine contracts a weight in, `[P, K / P, N] @ HBM`, made once per weight.

nc_matmul contracts over the partition dimension, so a linear weight w [N, K] (PyTorch's [out, in]) is wanted
with its contraction dimension K on P = min(K, 128) partitions: element [i, k, n] = w[n, k * P + i], K padded
with zero rows to whole tiles. In that layout plain DMAs put the weight in SBUF (`load_tiled`, in the blocks the
products use first); in PyTorch's, every launch would transpose it. The host lays a weight out once (`tiled`;
`prepared` remembers it per weight tensor, as nkilib's ops take `module.weight` and handle the transpose
themselves), and a kernel handed another layout refuses it by name (`expect_tiled`)."""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from ...nki import isa as nisa
from ...nki import language as nl
from .._private import is_fake, version

PMAX = 128  # nl.tile_size.pmax: the partitions the Tensor Engine contracts over


def tiled_shape(k: int, n: int) -> tuple[int, int, int]:
    """The shape [P, K / P, N] of a weight contracting K into N (P = min(K, 128), K / P rounded up)."""
    p = min(k, PMAX)
    return p, -(-k // p), n


def tiled(w: Tensor) -> Tensor:
    """w [N, K] ([out, in]) in the Tensor Engine's layout [P, K / P, N], contiguous (a new tensor)."""
    n, k = w.shape
    p, kt, _ = tiled_shape(k, n)
    w_t = torch.zeros(kt * p, n, dtype=w.dtype, device=w.device)
    w_t[:k] = w.t()
    return w_t.reshape(kt, p, n).permute(1, 0, 2).contiguous()


# id(first weight tensor) -> (a weak reference to it, what it was laid out from, the tiled copy); the entry goes
# when the tensor dies. A plain dict: prepared() is looked up at every launch (core's MLP, each of experimental's
# 31 weights a step), where a WeakIdKeyDictionary lookup costs several times more.
_prepared: dict = {}


def prepared(*ws: Tensor) -> Tensor:
    """`tiled(w)`, or for several weights `tiled(torch.cat(ws))` (a fused projection's [out, in] rows), made on the
    first call for these weight tensors and again only after one of them is written in place or replaced (a
    load_state_dict, an optimizer step, a new Parameter): later launches reuse the copy, so no launch transposes
    a weight."""
    if any(is_fake(w) for w in ws):  # tracing (a custom op's fake implementation): the layout's metadata, nothing kept
        return tiled(torch.cat(ws) if len(ws) > 1 else ws[0])
    made_from = tuple((id(w), w.data_ptr(), version(w)) for w in ws)
    first = id(ws[0])
    seen = _prepared.get(first)
    if seen is not None and seen[0]() is ws[0] and seen[1] == made_from:
        return seen[2]
    with torch.inference_mode(False), torch.no_grad():  # an ordinary tensor, usable inside and outside inference
        t = tiled(torch.cat([w.detach() for w in ws]) if len(ws) > 1 else ws[0].detach())
    _prepared[first] = (weakref.ref(ws[0], lambda _, k=first: _forget(k)), made_from, t)
    return t


# a caller's name -> (weak references to the tensors it was made from, their data pointers and versions, what was
# made); the entry goes when one of those tensors dies
_made: dict = {}


def made_once(site: str, read: list[Tensor], held: list[Tensor], make):
    """make(), or what it gave at `site`'s last call if the tensors are the same ones, `read`'s at the same memory
    and version (unwritten since), `held`'s (the caches a kernel writes) the same objects: a decode loop asks for the
    same prepared weights at every step, and remaking them (each weight's `prepared` looked up) cost the experimental
    tier ~0.3 ms of its ~3 ms token. One entry per site."""
    if any(is_fake(t) for t in read) or any(is_fake(t) for t in held):
        return make()
    tensors, state = [*read, *held], [(t.data_ptr(), version(t)) for t in read]
    last = _made.get(site)
    if (last is not None and last[1] == state and len(last[0]) == len(tensors)
            and all(r() is t for r, t in zip(last[0], tensors))):
        return last[2]
    made = make()
    _made[site] = ([weakref.ref(t, lambda _, s=site: _made.pop(s, None)) for t in tensors], state, made)
    return made


def _forget(key: int) -> None:
    """A prepared weight's tensor died: drop its copy (unless the id was already reused for a newer entry)."""
    entry = _prepared.get(key)
    if entry is not None and entry[0]() is None:
        del _prepared[key]


def expect_tiled(kernel: str, name: str, w, k: int, n: int, meaning: str) -> None:
    """ValueError naming the layout a kernel takes, when the weight w is not [P, K / P, N] for K -> N. meaning:
    the layout in words, e.g. "[P, dim / P, intermediate]"."""
    shape = tiled_shape(k, n)
    if tuple(w.shape) != shape:
        raise ValueError(f"{kernel}: {name} must be {meaning} = {list(shape)}, the Tensor Engine's layout "
                         f"(nativelab.kernels.nki.prepared(weight), once per weight), got {list(w.shape)}: a PyTorch "
                         f"[out, in] weight is not taken")


def load_tiled(*ws, n_block: int | None = None, k_block: int | None = None):
    """Weights in the tiled layout [P, K / P, N] (HBM) into SBUF, one tile each (a tuple for several), by DMAs of
    [P, k_block, n_block] blocks issued in the order the products use them: N's blocks outer, K's tiles inner, the
    weights interleaved block by block (gate's and up's first blocks before either's second), so the first
    matmuls start when their block has arrived rather than the whole weight. No blocks: one DMA a weight."""
    tiles = tuple(nl.ndarray(w.shape, dtype=w.dtype, buffer=nl.sbuf) for w in ws)
    p, kt, n = ws[0].shape
    nb, kb = n_block or n, k_block or kt
    for c0 in range(0, n, nb):
        c1 = min(n, c0 + nb)
        for k0 in range(0, kt, kb):
            k1 = min(kt, k0 + kb)
            for t, w in zip(tiles, ws):
                nisa.dma_copy(dst=t[:, k0:k1, c0:c1], src=w[:, k0:k1, c0:c1])
    return tiles if len(tiles) > 1 else tiles[0]


def untiled(t: Tensor, k: int) -> Tensor:
    """The inverse of `tiled`: t [P, K / P, N] -> w [N, K] (PyTorch's [out, in]), the padding rows dropped,
    contiguous (a new tensor)."""
    p, kt, n = t.shape
    return t.permute(1, 0, 2).reshape(kt * p, n)[:k].t().contiguous()
