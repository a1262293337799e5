"""A launch of a kernel whose signature was seen before goes straight to its compiled code (jit.py's
launch key): the same results as the first launch, and every argument the key must tell apart is told
apart (contiguity, a scalar's type and value, the grid, the device)."""

import pytest
import torch

from nativelab import nki
from nativelab.nki import language as nl

pytestmark = pytest.mark.slow  # kernels are compiled


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))


@nki.jit
def _scale_rows(x, factor):
    """out[p] = x[p] * factor + program_id (so each grid is a different kernel)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    nl.store(out, nl.add(nl.multiply(t, factor), float(nl.program_id(0))))
    return out


def test_repeated_launches_match_and_the_key_tells_arguments_apart():
    x = torch.randn(16, 8)
    for _ in range(3):  # the first traces and compiles, the others take the known launch
        torch.testing.assert_close(_scale_rows(x, 2.0), x * 2.0)
    assert len(_scale_rows._launches) == 1
    torch.testing.assert_close(_scale_rows(x, 3.0), x * 3.0)  # another value: another trace
    torch.testing.assert_close(_scale_rows(x, 3), x * 3)  # an int, not the float 3.0
    assert len(_scale_rows._traces) == 3
    wide = torch.randn(8, 16)
    strided = wide.t()  # (16, 8), not contiguous: made contiguous, never launched through the fast key
    for _ in range(2):
        torch.testing.assert_close(_scale_rows(strided, 2.0), strided * 2.0)
    assert all(k[3][0][3] for k in _scale_rows._launches)  # only contiguous launches kept (grid, target, lowering, key)
    # kernel[grid] each time: one object per grid, the last program's id added
    for _ in range(2):
        torch.testing.assert_close(_scale_rows[2](x, 2.0), x * 2.0 + 1.0)
    assert _scale_rows[2] is _scale_rows[2]


def test_keyword_launches_take_the_known_launch_with_their_own_tensors():
    x, y = torch.randn(16, 8), torch.randn(16, 8)
    _scale_rows._launches.clear()
    torch.testing.assert_close(_scale_rows(x, factor=2.0), x * 2.0)  # traces (or finds the trace), keys it
    torch.testing.assert_close(_scale_rows(x=x, factor=2.0), x * 2.0)
    assert len(_scale_rows._launches) == 2  # each way of passing the arguments is a key of its own
    known = dict(_scale_rows._launches)
    for t in (y, x, y):  # another tensor through the same key: its values, not the first launch's
        torch.testing.assert_close(_scale_rows(t, factor=2.0), t * 2.0)
        torch.testing.assert_close(_scale_rows(factor=2.0, x=t), t * 2.0)
        torch.testing.assert_close(_scale_rows(x=t, factor=2.0), t * 2.0)
    assert len(_scale_rows._launches) == 3 and all(_scale_rows._launches[k] is v for k, v in known.items())
    torch.testing.assert_close(_scale_rows(y, factor=3), y * 3)  # an int, not the float 3.0: its own trace


def test_repeated_launches_on_the_device_are_each_a_kernel():
    import nativelab

    x = torch.randn(16, 8)
    d = x.to("neuron")
    _scale_rows(d, 2.0)
    nativelab.clear_op_tracking()
    for _ in range(3):
        got = _scale_rows(d, 2.0)
    torch.neuron.synchronize()
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), x * 2.0)
    assert nativelab.get_op_counts()["device"].get("kernel:_scale_rows") == 3
    assert nativelab.get_fallback_ops() == []
    torch.testing.assert_close(_scale_rows(x, 2.0), x * 2.0)  # the same shapes on the CPU: its own key
