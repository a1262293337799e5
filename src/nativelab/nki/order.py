"""The order check, as CUDA's racecheck complements a static analysis: `nki.simulate(kernel, order="reverse")`
(or "shuffle", seeded) interprets the kernel twice, once in order and once with every nl.affine_range loop's
iterations (and a launch grid's programs) in that other order, and compares what the kernel wrote.

On the chip an affine_range's iterations may run in any order or at once (nki/hazards.py); a kernel whose
result depends on the order has a race. A difference raises OrderError naming the first differing output
element (row-major), both values, and the loop it traces to: each loop is then reordered alone, and the
first whose reordering alone changes that element is named. Equal results return the in-order run's.

Reordering an allowed accumulation (matmuls into one PSUM tile) changes its fp32 rounding, not its value: an
element differs when |got - expected| exceeds rtol x (|expected| + the output's largest magnitude), rtol by
dtype (RTOL); integers compare exactly. A running sum in any order gives the same total, so the order check
does not see every race the hazard checker reports; it sees what a different order changes."""

from __future__ import annotations

import random
import warnings

import torch

from . import limits

ORDERS = ("reverse", "shuffle")
RTOL = {torch.float32: 1e-3, torch.float64: 1e-6, torch.bfloat16: 2 ** -6, torch.float16: 2 ** -8}
RTOL_FP8 = 2 ** -2
GRID = "the launch grid"


class OrderError(limits.NkiError):
    """A kernel's result changed when its affine_range iterations (or programs) ran in another order."""

    # All but the message optional: pickling (multiprocessing, pytest-xdist) rebuilds it from its message alone.
    def __init__(self, message: str, output: str = "", index: tuple = (), expected=None, got=None,
                 loop: str | None = None, order: str = ""):
        super().__init__(message)
        self.output, self.index, self.expected, self.got = output, index, expected, got
        self.loop, self.order = loop, order


class Order:
    """The order an order check runs iterations in: `how` (reverse, shuffle with `seed`) for every affine_range
    loop, or only for the loops at the lines in `only` (GRID: the programs)."""

    def __init__(self, how: str, seed: int = 0, only: set | None = None):
        self.how, self.seed, self.only = how, seed, only

    def _applies(self, line: str) -> bool:
        return self.only is None or line in self.only

    def _permute(self, key: str, values: list) -> list:
        if self.how == "reverse":
            return values[::-1]
        rng = random.Random(f"{self.seed}:{key}:{len(values)}")  # one permutation per loop line and trip count
        out = rng.sample(values, len(values))
        return out if out != values or len(values) < 2 else values[1:] + values[:1]  # never the same order

    def iterations(self, line: str, values) -> list:
        values = list(values)
        return self._permute(line, values) if self._applies(line) else values

    def programs(self, n: int) -> list:
        return self._permute(GRID, list(range(n))) if self._applies(GRID) else list(range(n))


def check_order(run, how: str, seed: int, names: list):
    """run(order) interprets the kernel (order None: in order) on fresh copies of its inputs and returns (what
    it wrote: outputs then written arguments, the loops its trace entered [(kind, line)], its programs, the
    lines of the loops whose iterations' tiles are used after them). Those loops are not reordered: a kernel
    that keeps an iteration's tiles in a Python list for later code would get them in the other order, which
    the chip (the trace runs in order there) never does. Returns the in-order run's results, or raises
    OrderError (see the module docstring)."""
    if how not in ORDERS:
        raise ValueError(f"nki.simulate: order must be one of {ORDERS} (or None: in order), got {how!r}")
    expected, loops, programs, kept = run(None)
    lines = [line for line in dict.fromkeys(line for kind, line in loops if kind == "affine") if line not in kept]
    if programs > 1:
        lines.append(GRID)
    if kept:
        warnings.warn(f"nki: order check: the nl.affine_range loops at {', '.join(sorted(kept))} allocate tiles "
                      f"that are used after their iteration (kept in a Python list, say): run again in another order "
                      f"they would be other tiles, not the chip's work reordered, so these loops run in order; the "
                      f"hazard checker covers them", limits.NkiWarning, stacklevel=3)
    if not lines:
        return expected
    got = run(Order(how, seed, set(lines)))[0]
    first = _first_difference(expected, got)
    if first is None:
        return expected
    k, index = first
    culprit = None
    for line in lines:
        alone = run(Order(how, seed, {line}))[0]
        if _differs_at(expected[k], alone[k], index):
            culprit = line
            break
    where = (f"the launch grid's programs" if culprit == GRID else
             f"the nl.affine_range loop at {culprit}" if culprit is not None else
             f"several loops reordered together (none alone changes it: {', '.join(lines)})")
    e, g = expected[k][index].item(), got[k][index].item()
    order = how if how == "reverse" else f"shuffle (seed {seed})"
    raise OrderError(
        f"nki: order check ({order}): {names[k]}{list(index)} is {g} with the iterations reordered and {e} in "
        f"order; it traces to {where}: its iterations depend on each other, which on the chip (iterations in "
        f"any order or at once) gives either. Carry the dependency with nl.sequential_range (the hazard checker, "
        f"NATIVELAB_NKI_HAZARDS, names the instructions)", names[k], index, e, g,
        culprit, how)


def _mismatch(expected: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """Where got differs from expected beyond reordering's rounding (module docstring); NaNs match NaNs."""
    if not (expected.dtype.is_floating_point or expected.dtype.is_complex):
        return expected != got
    a, b = expected.double(), got.double()
    rtol = RTOL.get(expected.dtype, RTOL_FP8)
    finite = torch.isfinite(a)
    scale = a[finite].abs().max().item() if finite.any() else 0.0
    close = (a - b).abs() <= rtol * (a.abs() + scale)
    same = (a == b) | (torch.isnan(a) & torch.isnan(b)) | close
    return ~same


def _first_difference(expected, got):
    for k, (a, b) in enumerate(zip(expected, got)):
        bad = _mismatch(a, b)
        if bad.any():
            flat = int(bad.reshape(-1).nonzero()[0])
            return k, tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    return None


def _differs_at(expected: torch.Tensor, got: torch.Tensor, index: tuple) -> bool:
    return bool(_mismatch(expected, got)[index])
