"""Sampling in NKI: greedy (the index of each row's largest logit, torch.argmax's: the first, on ties) and
top-p (the library sampler's draw, kernels/ops/sample.py, given its noise).

Rows on partitions; the Vector Engine's max8 finds a chunk's largest values (at most 16384 per partition)
and nc_find_index8 their first positions, and a running (value, index) pair per row keeps the first chunk
holding the maximum (a later chunk replaces it only when strictly greater).

Top-p keeps the row's probabilities (fp32, resident in SBUF: 128 KB per partition for a 32000-token vocabulary)
and finds the nucleus threshold by the library's bisection (32 steps on the kept mass, no sort), then draws by
the exponential race argmax(p / E) over the kept tokens. The noise E comes in as a tensor: the library's
counter-based hash is 32-bit integer multiplication, which the engines' fp32 arithmetic does not emulate, and
taking it from the same hash keeps the draw the library's. Top-k is not implemented here."""

from __future__ import annotations

import torch

from ...nki import isa as nisa
from ...nki import jit
from ...nki import language as nl
from ..interface import nki_op, wrap_kernel, wrap_nki
from ..ops._checks import check_float, check_rank
from ..ops.sample import _uniform as uniform_noise  # the library sampler's noise (same layer)
from ..ops.sample import check_sampling
from .tiles import tiles

MAX8_FMAX = 16384  # max8 reads at most 16384 elements per partition (the nki.isa.max8 page)


@jit
def argmax_kernel(logits):
    rows, vocab = logits.shape
    p = nl.tile_size.pmax
    out = nl.ndarray((rows, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    chunk = min(vocab, MAX8_FMAX)
    for _, r0, n in tiles(rows, p):
        best, best_at = running_argmax(n)
        for _, c0, nc in tiles(vocab, chunk, carried=True):  # the running (max, index)
            t = nl.ndarray((n, nc), dtype=logits.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=logits[r0:r0 + n, c0:c0 + nc])
            argmax_step(best, best_at, t, c0)
        _store_index(out[r0:r0 + n, :], best_at)
    return out


def running_argmax(n):
    """The running (maximum, its index) of n rows, before any chunk: (-inf, 0)."""
    best = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
    best_at = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)  # indices < 2**24: exact in fp32
    nisa.memset(dst=best, value=-float("inf"))
    nisa.memset(dst=best_at, value=0.0)
    return best, best_at


def _largest(t):
    """Each partition's 8 largest values of t [n, <= 16384] (descending) and their first columns (uint32)."""
    n = t.shape[0]
    top = nl.ndarray((n, 8), dtype=t.dtype, buffer=nl.sbuf)
    nisa.max8(dst=top, src=t)
    at = nl.ndarray((n, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=at, data=t, vals=top)
    return top, at


def argmax_step(best, best_at, t, c0):
    """Fold the chunk t [n, <= 16384] (columns c0 ...) into the running maximum: replaced only if greater."""
    n = t.shape[0]
    top, at = _largest(t)
    at_f = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=at_f, data=at[:, 0:1], op0=nl.add, operand0=float(c0))
    greater = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=greater, data1=top[:, 0:1], data2=best, op=nl.greater)
    nisa.tensor_copy_predicated(dst=best_at, src=at_f, predicate=greater)
    nisa.tensor_tensor(dst=best, data1=best, data2=top[:, 0:1], op=nl.maximum)


def _store_index(dst, best_at):
    res = nl.ndarray(best_at.shape, dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=best_at)
    nisa.dma_copy(dst=dst, src=res)


_BISECT_STEPS = 32  # as the library's sampler
_CHUNK = 8000  # columns per temporary tile (32 KB fp32 per partition beside the resident probabilities)


@jit
def top_p_kernel(logits, exp_noise, temperature, top_p):
    rows, vocab = logits.shape
    p = nl.tile_size.pmax
    out = nl.ndarray((rows, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    for _, r0, n in tiles(rows, p):
        probs = nl.ndarray((n, vocab), dtype=nl.float32, buffer=nl.sbuf)
        z_max = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=z_max, value=-float("inf"))
        for _, c0, nc in tiles(vocab, _CHUNK, carried=True):  # z = logits / temperature, its running row maximum
            t = nl.ndarray((n, nc), dtype=logits.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=logits[r0:r0 + n, c0:c0 + nc])
            nisa.tensor_scalar(dst=probs[:, c0:c0 + nc], data=t, op0=nl.divide, operand0=float(temperature))
            m = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(dst=m, op=nl.max, data=probs[:, c0:c0 + nc], axis=1, keepdims=True)
            nisa.tensor_tensor(dst=z_max, data1=z_max, data2=m, op=nl.maximum)
        # softmax(max(z, z_max - 70)): far-below logits floored (no denormals), as the library does
        floor = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=floor, data=z_max, op0=nl.subtract, operand0=70.0)
        nisa.tensor_scalar(dst=probs, data=probs, op0=nl.maximum, operand0=floor)
        neg_max = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=neg_max, data=z_max, op0=nl.multiply, operand0=-1.0)
        total = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=probs, op=nl.exp, data=probs, bias=neg_max, reduce_op=nl.add, reduce_res=total)
        inv = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv, data=total)
        nisa.tensor_scalar(dst=probs, data=probs, op0=nl.multiply, operand0=inv)
        lo = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=lo, value=0.0)
        if top_p < 1.0:  # the largest threshold t whose kept mass (p >= t) is still >= top_p, by bisection
            hi = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(dst=hi, op=nl.max, data=probs, axis=1, keepdims=True)
            for _ in nl.sequential_range(_BISECT_STEPS):
                mid = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=mid, data1=lo, data2=hi, op=nl.add)
                nisa.tensor_scalar(dst=mid, data=mid, op0=nl.multiply, operand0=0.5)
                mass = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.memset(dst=mass, value=0.0)
                for _, c0, nc in tiles(vocab, _CHUNK, carried=True):  # the mass summed tile by tile
                    kept = nl.ndarray((n, nc), dtype=nl.float32, buffer=nl.sbuf)
                    part = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.scalar_tensor_tensor(dst=kept, data=probs[:, c0:c0 + nc], op0=nl.greater_equal,
                                              operand0=mid, op1=nl.multiply, operand1=probs[:, c0:c0 + nc])
                    nisa.tensor_reduce(dst=part, op=nl.add, data=kept, axis=1, keepdims=True)
                    nisa.tensor_tensor(dst=mass, data1=mass, data2=part, op=nl.add)
                enough = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_scalar(dst=enough, data=mass, op0=nl.greater_equal, operand0=float(top_p))
                nisa.tensor_copy_predicated(dst=lo, src=mid, predicate=enough)
                nisa.tensor_copy_predicated(dst=hi, src=mid, predicate=enough, reverse_pred=True)
        best, best_at = running_argmax(n)  # the race: argmax of p / E over the kept tokens (0 elsewhere)
        for _, c0, nc in tiles(vocab, _CHUNK, carried=True):  # the running (max, index)
            e = nl.ndarray((n, nc), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=e, src=exp_noise[r0:r0 + n, c0:c0 + nc])
            race = nl.ndarray((n, nc), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=race, data1=probs[:, c0:c0 + nc], data2=e, op=nl.divide)
            keep = nl.ndarray((n, nc), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=keep, data=probs[:, c0:c0 + nc], op0=nl.greater_equal, operand0=lo)
            nisa.select_reduce(dst=race, predicate=keep, on_true=race, on_false=0.0)
            argmax_step(best, best_at, race, c0)
        _store_index(out[r0:r0 + n, :], best_at)
    return out


_argmax = wrap_nki(argmax_kernel)
_top_p = wrap_nki(top_p_kernel)


@nki_op("nativelab::nki_argmax", mutates_args=())
def argmax(logits: torch.Tensor) -> torch.Tensor:
    """The greedy token of each row of logits (B, V): int64 (B,), as logits.argmax(-1)."""
    check_rank("logits", logits, 2)
    check_float("logits", logits)
    if logits.shape[1] < 8:
        raise ValueError(f"nki_argmax: needs at least 8 logits per row (max8), got {logits.shape[1]}")
    return _argmax(logits.contiguous()).reshape(-1).to(torch.int64)


@wrap_kernel
def noise_kernel(seed_state, out):
    """The library sampler's race noise E = -log(u) for the [seed, counter] state (a kernel, as the library's
    sampler computes it: the hash's double arithmetic runs in its compiled code, not as eager device ops, which
    the device keeps in fp32)."""
    out.copy_(-torch.log(uniform_noise(seed_state, out.shape)).float())


@nki_op("nativelab::nki_sample_top_p", mutates_args=("seed_state",))
def sample_top_p(logits: torch.Tensor, seed_state: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """One token per row of logits (B, V) by temperature + top-p, as the library's `sample` (top_k 0) draws it
    from the same seed_state [seed, counter], which advances."""
    check_rank("logits", logits, 2)
    check_float("logits", logits)
    check_sampling(seed_state, logits.device, 0, top_p)
    if temperature <= 0.0:
        raise ValueError(f"nki_sample_top_p: temperature must be > 0 (0 is greedy: nki_argmax), got {temperature}")
    exp_noise = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    noise_kernel(seed_state, exp_noise)
    out = _top_p(logits.contiguous(), exp_noise, float(temperature), float(top_p)).reshape(-1).to(torch.int64)
    seed_state[1:].add_(1)
    return out
