"""Control flow on values read at run time: nl.dynamic_range bounded by, and `while` on, a register that
nisa.register_load fills from the kernel's data. Such a signature runs interpreted at every launch (one
NkiWarning naming the loop's line), each launch on its own values, against PyTorch on the same tensors."""

import inspect
import warnings

import pytest
import torch

from nativelab import nki
from nativelab.nki import isa as nisa
from nativelab.nki import language as nl

P = 32  # rows per tile (small shapes: the tests interpret every instruction)


def _line_of(fn, text):
    lines, start = inspect.getsourcelines(fn.fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _register_from(t):
    """A register loaded (at run time) from the one int32 element of HBM tensor t."""
    sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=sb, src=t)
    reg = nisa.register_alloc()
    nisa.register_load(reg, sb)
    return reg, sb


@nki.jit
def _add_first_tiles(a, b, n_tiles):
    """out = b, with its first n_tiles * P rows a + b: the trip count read at run time, each tile found by a
    row offset that advances in SBUF (a scalar_offset), as a dynamic-shape kernel walks its rows."""
    m, f = a.shape
    out = nl.ndarray((m, f), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=b)
    trips, _ = _register_from(n_tiles)
    row = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=row, value=0)
    window = [[f, P], [1, f]]
    for _ in nl.dynamic_range(0, trips, 1):  # THE LOOP
        x = nl.ndarray((P, f), dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray((P, f), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=x, src=a.ap(window, 0, scalar_offset=row, indirect_dim=0))
        nisa.dma_copy(dst=y, src=b.ap(window, 0, scalar_offset=row, indirect_dim=0))
        z = nl.ndarray((P, f), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=z, data1=x, data2=y, op=nl.add)
        nisa.dma_copy(dst=out.ap(window, 0, scalar_offset=row, indirect_dim=0), src=z)
        nisa.tensor_scalar(dst=row, data=row, op0=nl.add, operand0=P)
    return out


def _reference(a, b, k):
    ref = b.clone()
    ref[:k * P] = a[:k * P] + b[:k * P]
    return ref


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_a_loop_on_a_loaded_trip_count_runs_each_launch_on_its_own_value(device):
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(4 * P, 16, generator=g).to(torch.bfloat16) for _ in range(2))
    import nativelab

    kernel = nki.jit(_add_first_tiles.fn)  # a fresh kernel: its signature's first trace warns here
    nativelab.clear_op_tracking()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in (0, 4, 1):  # none, the most, one: the same signature, each launch its own trip count
            n = torch.tensor([[k]], dtype=torch.int32)
            got = kernel(a.to(device), b.to(device), n.to(device))
            assert got.device.type == device
            assert torch.equal(got.cpu(), _reference(a, b, k)), k
    if device == "neuron":  # op tracking sees the interpreted launches as the kernel, as compiled ones
        assert "kernel:_add_first_tiles" in nativelab.get_executed_ops()
    said = [str(w.message) for w in caught if issubclass(w.category, nki.NkiWarning)]
    assert len(said) == 1, said
    line = f"test_nki_dynamic.py:{_line_of(kernel, '# THE LOOP')}"
    assert all(w in said[0] for w in ("runs interpreted", "nl.dynamic_range", line, "slower")), said[0]
    # the estimate is that launch's: four tiles issue more instructions than one
    one, four = (kernel.estimate(a, b, torch.tensor([[k]], dtype=torch.int32)) for k in (1, 4))
    assert len(four.events) - len(one.events) == 3 * 5 and four.seconds > one.seconds
    # fake / meta tensors (torch.compile's tracing) get the outputs of the checking pass, without a launch
    meta = kernel(a.to("meta"), b.to("meta"), torch.empty(1, 1, dtype=torch.int32, device="meta"))
    assert meta.device.type == "meta" and meta.shape == a.shape and meta.dtype == a.dtype
    with pytest.raises(nki.NkiError, match="needs tensors with values"):
        kernel.estimate(a.to("meta"), b.to("meta"), torch.empty(1, 1, dtype=torch.int32, device="meta"))


@nki.jit
def _double_while_positive(x, n):
    """x * 2**n[0, 0]: `while reg:` on a register reloaded from an SBUF counter each iteration, which also
    serves as the loop's integer (an `if` on a register inside)."""
    t = nl.load(x)
    reg, left = _register_from(n)
    while reg:
        t = nl.multiply(t, 2.0)
        nisa.tensor_scalar(dst=left, data=left, op0=nl.subtract, operand0=1)
        nisa.register_load(reg, left)
    ran = nisa.register_alloc()
    nisa.register_load(ran, left)  # 0 once the loop is over
    if ran:
        t = nl.multiply(t, 0.0)  # never reached
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, t)
    return out


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_a_while_on_a_register_reloaded_each_iteration(device):
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nki.NkiWarning)
        for k in (3, 0, 5):
            got = _double_while_positive(x.to(device), torch.tensor([[k]], dtype=torch.int32).to(device))
            assert torch.equal(got.cpu(), x * 2.0 ** k), k


@nki.jit
def _unbounded(x, n):
    reg, _ = _register_from(n)
    f = x.shape[1]
    for i in nl.dynamic_range(reg):
        t = nl.ndarray((P, f), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x.ap([[f, P], [1, f]], 0, scalar_offset=i * P, indirect_dim=0))  # LIMIT
    return x


def test_limits_inside_a_runtime_loop_are_checked_on_the_launch_values():
    """The checking pass runs the loop no times; the launch's own iterations are checked as they run: its
    integer loop variable moves the window, and the third window is past the tensor's end."""
    x = torch.zeros(2 * P, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", nki.NkiWarning)
        assert _unbounded(x, torch.tensor([[2]], dtype=torch.int32)) is not None
        with pytest.raises(nki.NkiError) as e:
            _unbounded(x, torch.tensor([[3]], dtype=torch.int32))
    wanted = [f"test_nki_dynamic.py:{_line_of(_unbounded, '# LIMIT')}", "out of bounds"]
    assert [w for w in wanted if w not in str(e.value)] == [], str(e.value)
