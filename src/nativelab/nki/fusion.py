"""Tile GEMMs fused back together while a kernel is recorded for compilation.

A kernel contracts over K in tiles of at most 128 partitions: a loop of nc_matmul calls into one fp32 PSUM
tile. Recorded one by one, each is a small fp32 GEMM plus an addition. Here consecutive nc_matmul calls into
one PSUM tile are deferred; when anything else reads or writes a tile they are emitted as one GEMM per run of
K tiles that sit at a constant stride in one SBUF tile (the [partition, k tile, free] blocks kernels keep, and
adjacent slices of one tile), viewed as one [K, free] operand without a copy. The accumulation is fp32 as in
PSUM; only the order of its additions differs from tile order.

Where one side's tiles are element-for-element copies of a kernel argument at affine positions (a weight
loaded transposed by dma_transpose, 128 rows at a time), the GEMM reads the argument itself, whatever the
other side is: the on-chip copy is then dead code, so a launch never transposes its weights.

A fused GEMM of bf16 operands whose fp32 result is then only rounded to bf16 (tensor_copy of the PSUM tile
into a bf16 tile) is recorded as a bf16 GEMM instead: oneDNN accumulates it in fp32 and rounds once, the same
value up to the order of the additions, and on AMX it runs ~5x faster (device/gemm_policy.py; where the
policy upcasts bf16 products, the compiler turns it back into an fp32 GEMM).

Only the recording pass fuses: the checking pass, the cost model and nki.simulate see every instruction."""

from __future__ import annotations

import math
import weakref

import numpy as np
import torch

from .tensor import NkiTensor, assign, flat_indices
from .tensor import covers_all as _covers


class _Operand:
    """A matmul operand as issued: its value viewed [K, free], and where it sits in its tile's value."""

    __slots__ = ("value", "base", "offset", "strides", "origin", "tiles")

    def __init__(self, t: NkiTensor, value: torch.Tensor, k: int, f: int):
        self.value = value.reshape(k, f)
        # the storages whose in-place write would change the value: the tile, and the one whose memory it borrows
        self.tiles = (t.storage, t.storage.lender)
        o, idx = t.storage.origin, flat_indices(t)
        # (argument storage, [K, F] flat indices in it) when the view is a copy of an argument's elements
        self.origin = (o[0], o[1][idx].reshape(k, f)) if o is not None and idx is not None else None
        self.base = None  # the tile's whole value, when the view is [K, free] at fixed strides in it
        self.offset, self.strides = 0, ()
        if any(op[0] == "dtype" or (op[0] == "ap" and op[4] is not None) for op in t.chain):
            return  # reinterpreted bytes: offsets are not elements of the tile's value
        try:
            layout = t.layout().view(k, f)
        except RuntimeError:
            return
        self.base = t.storage.tensor
        self.offset, self.strides = layout.storage_offset(), tuple(layout.stride())


class _Run:
    """Products whose operands step through their tiles at constant strides: one GEMM over all of them."""

    def __init__(self, s: _Operand, m: _Operand):
        self.first = (s, m)
        self.last = (s, m)
        self.steps = None
        self.count = 1

    def extend(self, s: _Operand, m: _Operand) -> bool:
        s0, m0 = self.first
        for a, a0 in ((s, s0), (m, m0)):
            if a.base is None or a.base is not a0.base or a.strides != a0.strides or a.value.shape != a0.value.shape:
                return False
        steps = (s.offset - self.last[0].offset, m.offset - self.last[1].offset)
        if self.steps is not None and steps != self.steps:
            return False
        self.steps, self.last, self.count = steps, (s, m), self.count + 1
        return True

    def operands(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[count * K, M] and [count * K, N]: row k * count + t is row k of the t-th product (any order
        sums the same products, as long as both operands use the same one)."""
        if self.count == 1:
            return self.first[0].value, self.first[1].value
        return tuple(_stacked(a, self.count, step) for a, step in zip(self.first, self.steps))


def _stacked(a: _Operand, count: int, step: int) -> torch.Tensor:
    base = a.base
    flat = base.view(-1) if base.is_contiguous() else base.reshape(-1)
    k, f = a.value.shape
    v = torch.as_strided(flat, (count, k, f), (step,) + a.strides, flat.storage_offset() + a.offset)
    return v.permute(1, 0, 2).reshape(count * k, f)


class _Pending:
    """A PSUM tile's deferred matmuls: dst = [dst +] sum of stationary.T @ moving."""

    def __init__(self, dst: NkiTensor, add: bool):
        self.storage = weakref.ref(dst.storage)  # a dropped tile's products are never seen: drop them
        self.chain = dst.chain
        self.add = add
        self.runs: list[_Run] = []
        self.products: list[tuple[_Operand, _Operand]] = []

    def append(self, s: _Operand, m: _Operand) -> None:
        self.products.append((s, m))
        if not self.runs or not self.runs[-1].extend(s, m):
            self.runs.append(_Run(s, m))


class PsumFuser:
    """The recording pass's deferred matmuls, one entry per PSUM tile; and which tile elements are plain
    copies of which elements of the kernel's arguments (so a GEMM can read the argument itself)."""

    def __init__(self, written_inputs=()):
        self.pending: list[_Pending] = []
        self.stores: list[_Store] = []
        self.written_inputs = set(written_inputs)  # arguments the kernel writes: their copies may go stale
        # computed operands stacked along K, by the views they stack: the LM head's 63 vocab tiles read one
        # stacked activation, so their stores can merge into one GEMM (_Computed); dropped when a tile the
        # stack read is written (its bases are kept, so an id is never reused while the entry lives)
        self.stacks: dict = {}

    # --- copies of arguments (Storage.origin)

    def copied(self, dst: NkiTensor, source: NkiTensor | None) -> None:
        """dst (on chip) was just written; with `source`, as a copy of it, element for element."""
        st = dst.storage
        idx = flat_indices(dst)
        src = None
        if source is not None and idx is not None:
            s_st = source.storage
            s_idx = flat_indices(source)
            if s_idx is not None and s_st.input_index is not None and s_st.input_index not in self.written_inputs:
                src = (s_st, s_idx)
            elif s_idx is not None and s_st.origin is not None:
                src = (s_st.origin[0], s_st.origin[1][s_idx])
        if src is None:
            if st.origin is not None:
                if idx is None:
                    st.origin = None
                else:
                    st.origin[1][idx] = -1
            return
        if st.origin is None or st.origin[0] is not src[0]:
            st.origin = (src[0], np.full(math.prod(st.shape), -1, dtype=np.int64))
        st.origin[1][idx] = src[1]

    def _argument_view(self, operands):
        """The operands stacked along K, [sum K, F], as a strided view of the argument they are copies of;
        None unless every element is a copy, at affine positions. Returns (view, (argument, offset, row
        step, column step, rows, columns))."""
        arg = operands[0].origin[0] if operands[0].origin is not None else None
        if arg is None or any(a.origin is None or a.origin[0] is not arg for a in operands):
            return None
        grid = np.concatenate([a.origin[1] for a in operands]) if len(operands) > 1 else operands[0].origin[1]
        if (grid < 0).any():
            return None
        k, f = grid.shape
        start = int(grid[0, 0])
        rs = int(grid[1, 0] - start) if k > 1 else 0
        cs = int(grid[0, 1] - start) if f > 1 else 0
        if rs < 0 or cs < 0:
            return None
        expect = start + np.arange(k, dtype=np.int64)[:, None] * rs + np.arange(f, dtype=np.int64)[None, :] * cs
        if not np.array_equal(grid, expect):
            return None
        desc = (arg, start, rs, cs, k, f)
        return _view(desc), desc

    def pending_into(self, storage) -> bool:
        return any(p.storage() is storage for p in self.pending) or any(x.storage is storage for x in self.stores)

    def before_write(self, storage) -> None:
        """A write is about to change `storage`: the deferred matmuls into it or reading it land first (only
        those: a transpose into another PSUM tile leaves an accumulation over K tiles pending)."""
        self.flush(lambda p: p.storage() is storage or any(storage in a.tiles for pair in p.products for a in pair))
        if self.stacks:
            self.stacks = {key: e for key, e in self.stacks.items()
                           if not any(b is storage.tensor for b in e.bases)}
        if any(x.storage is storage for x in self.stores):
            self.flush_stores(storage)

    def before_read(self, storage) -> None:
        if self.pending_into(storage):
            self.flush(lambda p: p.storage() is storage)
            self.flush_stores(storage)

    # --- stores of GEMM results into the kernel's outputs, one GEMM over all output tiles

    def store(self, dst: NkiTensor, value: torch.Tensor, source: NkiTensor | None) -> bool:
        """dma_copy(out[...], tile) of a tile that holds a bf16 GEMM of argument views: defer it (True)."""
        st = dst.storage
        if source is None or source.chain or not st.pinned or st.input_index is not None or st.buffer.on_chip:
            return False
        g = source.storage.gemm
        if g is None or g[0] is not source.storage.tensor or g[2] != st.dtype or value.dtype != st.dtype:
            return False
        if any(op[0] in ("dtype", "expand") or (op[0] == "ap" and op[4] is not None) for op in dst.chain):
            return False
        (a, b) = g[1]
        try:
            layout = dst.layout().view(a[5], b[5])  # the result's [M, N], row-major, as dma_copy writes it
        except RuntimeError:
            return False
        self.stores.append(_Store(st, layout.storage_offset(), tuple(layout.stride()), a, b))
        return True

    def copied_gemm(self, dst: NkiTensor, value: torch.Tensor, source: NkiTensor | None, rounded: bool) -> None:
        """dst (on chip) was written with `value`: it holds a GEMM of argument views if the source did and
        this write copied it whole (rounded: to bf16)."""
        st = dst.storage
        g = source.storage.gemm if source is not None and not source.chain else None
        st.gemm = None
        if g is None or g[0] is not source.storage.tensor or not _covers(dst) or st.pinned:
            return
        if rounded or value is g[0]:  # (converted to dst's dtype: the GEMM's fp32 result, rounded once)
            st.gemm = (st.tensor, g[1], st.dtype)

    def flush_stores(self, storage=None) -> None:
        todo = [x for x in self.stores if storage is None or x.storage is storage]
        if not todo:
            return
        self.stores = [x for x in self.stores if not (storage is None or x.storage is storage)]
        by_output: dict = {}
        for x in todo:
            by_output.setdefault(id(x.storage), []).append(x)
        for group in by_output.values():
            merged = _merge(group)
            for x in [merged] if merged is not None else group:
                _emit(x)

    def defer(self, dst: NkiTensor, stationary: NkiTensor, s_value, moving: NkiTensor, m_value,
              k: int, m: int, n: int, add: bool) -> None:
        """nc_matmul(dst, stationary, moving) issued: dst = [dst +] stationary.T @ moving, later."""
        entry = next((p for p in self.pending if p.storage() is dst.storage), None)
        if entry is not None and entry.chain != dst.chain:
            self.flush(lambda p: p is entry)  # another view of the tile: keep the order of the writes
            entry = None
        if entry is None or not add:  # an overwrite drops what was pending for the same view
            if entry is not None:
                self.pending.remove(entry)
            entry = _Pending(dst, add)
            self.pending.append(entry)
        entry.append(_Operand(stationary, s_value, k, m), _Operand(moving, m_value, k, n))

    def _pairs(self, p: _Pending):
        """The GEMMs that compute a PSUM tile's deferred products, as (stationary [K, M], moving [K, N])
        pairs: where one side's tiles copy an argument at affine positions, one GEMM reads the argument
        itself (the copy is then dead code: a weight loaded transposed is never transposed) and the other
        side's tiles are stacked (a copy: for a GEMV only of its vector side, which is small); else one
        GEMM per run of tiles that stack as views (a GEMV: per product). Returns (pairs, both sides'
        argument descriptors when the GEMM reads two arguments, thin)."""
        s0, m0 = p.products[0]
        thin = min(s0.value.shape[1], m0.value.shape[1]) < _THIN  # a GEMV-like product: see _THIN
        sides = [[s for s, _ in p.products], [m for _, m in p.products]]
        args = [self._argument_view(sides[0]), self._argument_view(sides[1])]
        if args[0] is not None and args[1] is not None:
            return [(args[0][0], args[1][0])], (args[0][1], args[1][1]), thin
        for j in (0, 1):
            other = sides[1 - j]
            if args[j] is not None and (not thin or other[0].value.shape[1] < _THIN):
                stacked = self._stack(other)
                if stacked is None:
                    v = other[0].value if len(other) == 1 else torch.cat([a.value for a in other])
                    return [(args[0][0], v) if j == 0 else (v, args[1][0])], None, thin
                desc = (args[0][1], stacked) if j == 0 else (stacked, args[1][1])
                return [(args[0][0], stacked.value) if j == 0 else (stacked.value, args[1][0])], desc, thin
        if thin:  # per run of products whose matrix side is one view of an argument (else per product):
            return self._thin_runs(p.products), None, thin  # stacking would copy the matrix side
        return [r.operands() for r in p.runs], None, thin

    def _stack(self, operands) -> "_Computed | None":
        """The operands stacked along K as one tensor, the same object for the same views of unchanged tiles
        (None where a view is not at fixed strides in its tile: no key)."""
        if any(a.base is None for a in operands):
            return None
        key = tuple((id(a.base), a.offset, a.strides, tuple(a.value.shape)) for a in operands)
        e = self.stacks.get(key)
        if e is None:
            # a copy even of one tile: a later in-place write to the tile must not change a deferred store
            v = operands[0].value.clone() if len(operands) == 1 else torch.cat([a.value for a in operands])
            e = self.stacks[key] = _Computed(v, [a.base for a in operands])
        return e

    def _thin_runs(self, products):
        """(stationary, moving) pairs for one-token products: consecutive products whose wide side copies one
        argument at affine positions (decode attention's V cache tiles) are one GEMM reading the argument,
        their thin side stacked (small); the others one GEMM each, a copied argument read in place."""
        wide = 1 if products[0][0].value.shape[1] < _THIN else 0
        pairs, i = [], 0
        while i < len(products):
            j, view = i + 1, None
            while j <= len(products):
                v = self._argument_view([pr[wide] for pr in products[i:j]])
                if v is None:
                    break
                view, j = v[0], j + 1
            j -= 1
            if view is None or j - i < 2:
                pairs.append(tuple(self._one(a) for a in products[i]))
                i += 1
                continue
            thin_side = torch.cat([pr[1 - wide].value for pr in products[i:j]])
            pairs.append((thin_side, view) if wide == 1 else (view, thin_side))
            i = j
        return pairs

    def _one(self, a: _Operand) -> torch.Tensor:
        arg = self._argument_view([a])
        return a.value if arg is None else arg[0]

    def flush(self, which=None) -> None:
        """Emit the deferred matmuls (`which`: only the entries it accepts), in the order they were issued."""
        if not self.pending:
            return
        if which is None:
            pending, self.pending = self.pending, []
        else:
            pending = [p for p in self.pending if which(p)]
            if not pending:
                return
            self.pending = [p for p in self.pending if not any(p is q for q in pending)]
        for p in pending:
            st = p.storage()
            if st is None:
                continue
            pairs, desc, thin = self._pairs(p)
            total = None
            for s, mv in pairs:
                y = _product(s.float(), mv.float())
                total = y if total is None else total + y
            assign(NkiTensor(st, p.chain), total, "nc_matmul", accumulate=p.add)
            if p.add or p.chain:
                continue
            if desc is not None and len(pairs) == 1:
                st.gemm = (st.tensor, desc, torch.float32)
            small = thin and all(s.numel() + mv.numel() <= _SMALL_GEMV for s, mv in pairs)
            if (len(pairs) == 1 or not thin) and not small and all(
                    s.dtype == torch.bfloat16 and mv.dtype == torch.bfloat16 for s, mv in pairs):
                # recorded now, while the operands hold these values; unused, the compiler drops it
                st.rounded = (st.tensor, _bf16_gemm(pairs))


def _product(s: torch.Tensor, mv: torch.Tensor) -> torch.Tensor:
    """s.T @ mv in fp32; a tiny one (a decode step's new-token score, one row times one column) as a broadcast
    product and sum, which the compiler fuses with its neighbours instead of calling a GEMM for it."""
    k, m = s.shape
    if k * m * mv.shape[1] <= _TINY:
        return (s[:, :, None] * mv[:, None, :]).sum(0)
    return s.t() @ mv


# A one-token product above _TINY whose operands hold at most this many elements is an fp32 GEMM: oneDNN's bf16
# GEMV costs ~30 us a call, the upcast and MKL's fp32 GEMV less; a larger one (a weight, 512 x 512 and up) stays
# bf16, where upcasting the weight every launch costs more.
_SMALL_GEMV = 65536
# Multiply-adds up to which a product is a broadcast multiply and sum that the compiler fuses with its neighbours:
# an extern GEMM call (~13 us) costs more. Up to one head's decode scores (64 x 1 x 512) and its probabilities times
# V (512 x 1 x 64): attention_tkg 8x512x64, bf16, 2 threads, 928 -> 268 us a launch (16 GEMM calls gone; 2-core
# Xeon, AVX-512 + AMX).
_TINY = 32768

# Below this many columns on either side (a decode step's one token) a product reads its tiles where they are
# (or the argument they copy): stacking the matrix side's K tiles into one operand copies the whole weight every
# launch, and the copy costs more than the GEMMs it merges (decode layer kernel, bf16, 2-core Xeon AVX-512 + AMX: 34.8 ms stacked against 5.0 ms unfused).
_THIN = 16


class _Computed:
    """A GEMM operand computed on chip, stacked along K ([K, F]): a descriptor like an argument's (arg, start,
    row step, column step, rows, columns) whose value is its own; stores merge only the same object."""

    __slots__ = ("value", "bases")

    def __init__(self, value: torch.Tensor, bases):
        self.value, self.bases = value, bases

    def __getitem__(self, i):
        return (self, 0, 0, 0, self.value.shape[0], self.value.shape[1])[i]


def _view(desc) -> torch.Tensor:
    """The [rows, columns] view of an argument a GEMM operand descriptor names (a computed one: its value)."""
    if isinstance(desc, _Computed):
        return desc.value
    arg, start, rs, cs, k, f = desc
    base = arg.tensor
    flat = base.view(-1) if base.is_contiguous() else base.reshape(-1)
    return torch.as_strided(flat, (k, f), (rs, cs), flat.storage_offset() + start)


class _Store:
    """out[region] = a.T @ b (bf16): region at `offset` with `strides` in the output's elements."""

    __slots__ = ("storage", "offset", "strides", "a", "b")

    def __init__(self, storage, offset, strides, a, b):
        self.storage, self.offset, self.strides, self.a, self.b = storage, offset, strides, a, b


def _merge(stores: list[_Store]) -> _Store | None:
    """One store for output tiles that cover a block exactly once, each the product of the block's rows of
    one operand and columns of the other (the tiles of one GEMM; a computed operand the same for all of
    them); else None."""
    if len(stores) < 2:
        return None
    x0 = stores[0]
    if any(x.strides != x0.strides for x in stores):
        return None
    sides = [_tile_positions([x.a for x in stores]), _tile_positions([x.b for x in stores])]
    if sides[0] is None or sides[1] is None:
        return None
    (a_at, a_desc), (b_at, b_desc) = sides
    at = list(zip(a_at, b_at))
    o0 = x0.offset - at[0][0] * x0.strides[0] - at[0][1] * x0.strides[1]
    if o0 < 0 or any(x.offset != o0 + i * x0.strides[0] + j * x0.strides[1] for x, (i, j) in zip(stores, at)):
        return None
    m = max(i + x.a[5] for x, (i, _) in zip(stores, at))
    n = max(j + x.b[5] for x, (_, j) in zip(stores, at))
    cover = np.zeros((m, n), dtype=np.int32)
    for x, (i, j) in zip(stores, at):
        cover[i:i + x.a[5], j:j + x.b[5]] += 1
    if not (cover == 1).all():
        return None
    return _Store(x0.storage, o0, x0.strides, a_desc(m), b_desc(n))


def _tile_positions(descs):
    """Where each store's operand sits in the merged one (its first row / column), and a function of the merged
    extent giving the merged descriptor; None if they do not tile one operand (a computed operand: the same
    object for every store, at 0)."""
    d0 = descs[0]
    if isinstance(d0, _Computed):
        if any(d is not d0 for d in descs):
            return None
        return [0] * len(descs), lambda extent: d0
    arg, _, rs, cs, k, _ = d0
    if cs <= 0 or any(isinstance(d, _Computed) or d[0] is not arg or d[2:5] != (rs, cs, k) for d in descs):
        return None
    start = min(d[1] for d in descs)
    at = []
    for d in descs:
        i, r = divmod(d[1] - start, cs)
        if r:
            return None
        at.append(i)
    return at, lambda extent: (arg, start, rs, cs, k, extent)


def _emit(x: _Store) -> None:
    """Write the store's GEMM into its output region (a slice of the output where it is one)."""
    out = x.storage.tensor
    a, b = _view(x.a), _view(x.b)
    if out.dtype == torch.bfloat16 and a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16:
        y = a.t() @ b  # fp32 accumulation, one rounding (as fusion's bf16 GEMMs)
    else:
        y = (a.float().t() @ b.float()).to(out.dtype)
    m, n = y.shape
    if out.is_contiguous() and x.offset == 0 and y.numel() == out.numel() and (m == 1 or x.strides == (n, 1)):
        out.copy_(y.view(out.shape))  # the whole output, row-major (one row: any row stride)
        return
    region = _slice_of(out, x.offset, x.strides, tuple(y.shape))
    if region is not None:
        region.copy_(y)
        return
    flat = out.reshape(-1)
    new = torch.as_strided_scatter(flat, y, tuple(y.shape), x.strides, x.offset)
    out.copy_(new.view(out.shape))


def _slice_of(t: torch.Tensor, offset: int, strides, sizes):
    """t's 2-D view at `offset` with `strides` and `sizes`, by indexing and slicing (an in-place copy into
    it traces; into an as_strided view it does not); None if it is no such view."""
    if not t.is_contiguous() or 1 in sizes:
        return None
    meta = torch.empty(t.shape, dtype=t.dtype, device="meta")
    contiguous = meta.stride()
    index, dims = [], []
    for d, (size, stride) in enumerate(zip(t.shape, contiguous)):
        start = (offset // stride) % size
        r = strides.index(stride) if stride in strides else None
        if r is not None and r not in [q for q, _ in dims]:
            index.append(slice(start, start + sizes[r]))
            dims.append((r, d))
        else:
            index.append(start)
    v = meta[tuple(index)]
    order = [r for r, _ in dims]
    if len(order) == 2 and order == [1, 0]:
        v = v.t()
    if tuple(v.shape) != tuple(sizes) or tuple(v.stride()) != tuple(strides) or v.storage_offset() != offset:
        return None
    out = t[tuple(index)]
    return out.t() if len(order) == 2 and order == [1, 0] else out


def _bf16_gemm(pairs) -> torch.Tensor:
    """The fused GEMM with bf16 output (oneDNN: fp32 accumulation, one rounding)."""
    if len(pairs) == 1:
        s, mv = pairs[0]
    else:  # a ragged last K tile is a run of its own: one GEMM over all runs (a copy of the operands)
        s, mv = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
    if s.shape[0] * s.shape[1] * mv.shape[1] <= _TINY:  # fused by the compiler (see _product)
        return _product(s.float(), mv.float()).to(torch.bfloat16)
    return s.t() @ mv
