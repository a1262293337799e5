"""A new signature's first launch (NATIVELAB_NKI_FIRST_CALL, issue 47): by default it runs interpreted, as
nki.simulate does, and the signature compiles at its second launch; where the disk cache holds the graph a
signature compiled to in an earlier process, its first launch compiles (a cache hit) at once. Values are the
reference's either way."""

import pytest
import torch

from nativelab import nki
from nativelab.compiler import metrics
from nativelab.nki import language as nl


@pytest.fixture(autouse=True)
def _interpret_first(tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    monkeypatch.setenv("NATIVELAB_NKI_FIRST_CALL", "interpret")  # the default (tests/conftest.py sets compile)


def scaled_exp(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.multiply(nl.exp(nl.load(x)), 3.0))
    return out


def _traced(kernel):
    return next(iter(kernel._traces.values()))


def test_the_first_launch_is_interpreted_and_the_second_compiles():
    x = torch.randn(64, 32)
    kernel = nki.jit(scaled_exp)
    compiles = metrics.current().cache_misses
    first = kernel(x)
    assert _traced(kernel).launch is None and metrics.current().cache_misses == compiles  # nothing compiled
    torch.testing.assert_close(first, torch.exp(x) * 3)
    second = kernel(x)
    assert _traced(kernel).launch is not None and metrics.current().cache_misses == compiles + 1
    torch.testing.assert_close(second, first)
    other = kernel(torch.randn(32, 32))  # a new signature: interpreted again
    assert other.shape == (32, 32) and len(kernel._traces) == 2
    assert [t.launch is None for t in kernel._traces.values()] == [False, True]


def test_a_signature_compiled_in_an_earlier_process_compiles_at_its_first_launch():
    x = torch.randn(64, 32).to("neuron")
    earlier = nki.jit(scaled_exp)
    earlier(x)
    earlier(x)  # compiled, and noted in the disk cache
    hits = metrics.current().cache_hits
    later = nki.jit(scaled_exp)  # as a new process has it: no traces, the same disk cache
    got = later(x)
    assert _traced(later).launch is not None and metrics.current().cache_hits == hits + 1
    torch.testing.assert_close(got.cpu(), torch.exp(x.cpu()) * 3)


def test_first_call_names_its_choices():
    with pytest.raises(ValueError, match="first_call must be 'interpret' or 'compile', got 'later'"):
        nki.jit(scaled_exp, first_call="later")
    kernel = nki.jit(scaled_exp, first_call="compile")
    kernel(torch.randn(8, 8))
    assert _traced(kernel).launch is not None
