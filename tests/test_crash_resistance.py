"""The device's runtime never takes the interpreter down: what its C++ entry points assume of a tensor (strided,
memory on the device, sizes and strides inside the storage, a dtype the host kernels hold) is checked, and
anything else is a Python exception naming the op and the cause (csrc/host_views.cpp). Each case runs in its own
interpreter and must end with an exception or the right result, never a signal."""

import textwrap

import pytest

from conftest import run_python

# Each case starts an interpreter (3-4 s of imports on 2 cores) to survive a crash: slow, as a sweep is.
pytestmark = pytest.mark.slow

PRELUDE = """
import torch, nativelab
def raises(fn, kind, *words):
    try:
        fn()
    except kind as e:
        msg = str(e)
        assert all(w in msg for w in words), msg
        return msg
    raise AssertionError("no exception")
dev = torch.device("neuron")
"""


def run(body: str, **env):
    r = run_python(PRELUDE + textwrap.dedent(body) + "\nprint('ok')\n", env=env, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-3000:]}"  # a signal is a negative exit code
    assert r.stdout.strip().endswith("ok"), r.stdout[-1000:]
    return r


@pytest.mark.parametrize("fast", ["1", "0"])
def test_conjugate_and_negative_views(fast):
    run("""
    c = torch.randn(4, dtype=torch.complex64)
    d = c.to(dev)
    for make in (lambda t: t.conj(), lambda t: t._neg_view(), lambda t: t.conj()._neg_view()):
        want, got = make(c), make(d)
        assert torch.equal(got.cpu(), want.resolve_conj().resolve_neg())
        assert torch.equal((got * 2 + 1).cpu(), want * 2 + 1)
        out = torch.empty_like(d)
        out.copy_(got)
        assert torch.equal(out.cpu(), want.resolve_conj().resolve_neg())
        plain = lambda t: torch.view_as_real(t.resolve_conj().resolve_neg())  # noqa: E731
        assert torch.equal(plain(got).cpu(), plain(want))
    """, NATIVELAB_FAST_PATH=fast)


def test_zero_tensors_in_every_path():
    """A zero tensor given to device work launched from Python, to an op, to a copy, to a view: its zeros."""
    run("""
    from nativelab.device import queue
    z = torch._efficientzerotensor((3, 2), device=dev)
    out = torch.ones(3, 2, device=dev)
    queue.launch("op", "test::add_into", lambda o, a: o.add_(a), out, z)
    assert out.cpu().tolist() == [[1.0, 1.0]] * 3
    assert torch.equal((z.t() + 1).cpu(), torch.ones(2, 3))
    assert torch.equal(torch.cat([z, out]).cpu(), torch.cat([torch.zeros(3, 2), torch.ones(3, 2)]))
    h = torch.full((3, 2), 5.0); h.copy_(z); assert h.abs().sum() == 0
    """)


def test_tensor_subclasses_and_wrappers():
    run("""
    class Sub(torch.Tensor):
        pass
    s = torch.arange(4.0, device=dev).as_subclass(Sub)
    assert type(s * 2) is Sub and (s * 2).cpu().tolist() == [0.0, 2.0, 4.0, 6.0]

    from torch.utils._pytree import tree_map
    class Wrapper(torch.Tensor):  # a wrapper subclass (no storage of its own) that unwraps: right results
        @staticmethod
        def __new__(cls, elem):
            return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)
        def __init__(self, elem):
            self.elem = elem
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            un = lambda t: t.elem if isinstance(t, Wrapper) else t
            return tree_map(lambda t: Wrapper(t) if isinstance(t, torch.Tensor) else t,
                            func(*tree_map(un, args), **tree_map(un, kwargs or {})))
    w = Wrapper(torch.arange(4.0, device=dev))
    assert (w * 3).elem.cpu().tolist() == [0.0, 3.0, 6.0, 9.0]

    # the wrapper itself (storage-less) reaching the device's kernels: an exception naming the op
    with torch._C._DisableTorchDispatch():
        for fn in (lambda: torch.add(w, 1), lambda: torch.neg(w), lambda: w.sum(), lambda: w.cpu(),
                   lambda: torch.ones(4, device=dev).copy_(w)):
            raises(fn, (RuntimeError, NotImplementedError), "neuron")

    # functionalization over device tensors
    def f(x):
        y = x.clone()
        y.add_(1)
        y[0].mul_(5)
        return y.view(2, 2)
    x = torch.arange(4.0)
    assert torch.equal(torch.func.functionalize(f)(x.to(dev)).cpu(), f(x))
    """)


def test_meta_and_fake_tensors_reaching_the_device():
    run("""
    x = torch.ones(3, device=dev)
    m = torch.ones(3, device="meta")
    raises(lambda: x + m, RuntimeError, "device")
    raises(lambda: x.copy_(m), (RuntimeError, NotImplementedError), "meta")
    raises(lambda: m.to(dev).cpu(), (RuntimeError, NotImplementedError), "meta")

    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode()
    fake = mode.from_tensor(x)
    with mode:
        y = fake * 2 + 1
    assert y.device.type == "neuron" and y.shape == (3,)
    raises(lambda: x + y, Exception)  # a fake tensor outside its mode: FakeTensor's own error
    with torch._C._DisableTorchDispatch():  # the fake itself reaching the device's kernels
        for fn in (lambda: torch.add(y, 1), lambda: torch.mul(x, y), lambda: y.sum(), lambda: x.copy_(y)):
            raises(fn, (RuntimeError, NotImplementedError), "neuron")
    assert (x * 2).cpu().tolist() == [2.0, 2.0, 2.0]  # the device is still fine
    """)


@pytest.mark.parametrize("fast", ["1", "0"])
def test_storageless_and_zero_size_tensors(fast):
    run("""
    for shape in [(0,), (0, 3), (2, 0, 4)]:
        c = torch.randn(shape)
        d = c.to(dev)
        for fn in (lambda t: t + 1, lambda t: t.sum(0), lambda t: torch.cat([t, t]),
                   lambda t: t.t() if t.dim() == 2 else t,
                   lambda t: t.exp_(), lambda t: t.reshape(-1), lambda t: t.clone()):
            assert torch.equal(fn(d).cpu(), fn(c.clone())), shape
    e = torch.empty(0, device=dev)
    e.set_()
    assert (e + 1).cpu().numel() == 0
    assert torch.mm(torch.ones(2, 0, device=dev), torch.ones(0, 3, device=dev)).cpu().tolist() == [[0.0] * 3] * 2
    s = torch.UntypedStorage(0, device=dev)
    t = torch.empty(0, device=dev).set_(s, 0, (0,), (1,))
    assert t.cpu().numel() == 0
    """, NATIVELAB_FAST_PATH=fast)


@pytest.mark.parametrize("fast", ["1", "0"])
def test_storages_resized_or_freed_under_queued_work(fast):
    run("""
    x = torch.arange(8.0, device=dev)
    y = x * 2                            # queued, reading x
    x.untyped_storage().resize_(0)       # the resize waits for it
    assert y.cpu().tolist() == [2.0 * i for i in range(8)]
    for fn in (lambda: x + 1, lambda: x.sum(), lambda: x.cpu(), lambda: torch.ones(8, device=dev).copy_(x),
               lambda: x.add_(1), lambda: torch.cat([x, x]), lambda: x.median()):
        raises(lambda: (fn(), torch.neuron.synchronize()), RuntimeError, "neuron", "bytes of its storage")

    a = torch.arange(16.0, device=dev)
    v = a[8:]
    w = v * 1                            # queued before the shrink: right result
    a.untyped_storage().resize_(32)      # keeps 8 floats: v now reaches past its storage
    assert w.cpu().tolist() == [float(i) for i in range(8, 16)]
    msg = raises(lambda: (v + 1).cpu(), RuntimeError, "bytes of its storage")
    assert "aten::add" in msg or "copy" in msg, msg

    # set_ onto a storage too small for the shape: grown, as on CPU
    s = torch.UntypedStorage(8, device=dev)
    t = torch.empty(0, device=dev).set_(s, 0, (10,), (1,))
    c = torch.empty(0).set_(torch.UntypedStorage(8), 0, (10,), (1,))
    assert s.nbytes() == c.untyped_storage().nbytes() == 40
    t.fill_(3.0)
    assert t.cpu().tolist() == [3.0] * 10
    """, NATIVELAB_FAST_PATH=fast)


def test_non_strided_layouts():
    run("""
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]], device=dev)
    raises(lambda: x.to_sparse(), (RuntimeError, NotImplementedError), "neuron", "sparse")
    raises(lambda: x.to_sparse_csr(), (RuntimeError, NotImplementedError), "neuron")
    raises(lambda: torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.tensor([1.0]), (2, 2), device=dev),
           (RuntimeError, NotImplementedError))
    sp = torch.tensor([[0.0, 1.0]]).to_sparse()
    raises(lambda: sp.to(dev), (RuntimeError, NotImplementedError))
    raises(lambda: x.to_mkldnn(), (RuntimeError, NotImplementedError), "neuron")
    raises(lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], device=dev) + 1,
           (RuntimeError, NotImplementedError))
    raises(lambda: torch.empty(2, 2, device=dev, layout=torch.sparse_coo), (RuntimeError, NotImplementedError))
    raises(lambda: x.as_strided((100,), (1,)), RuntimeError)
    raises(lambda: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8), (RuntimeError, NotImplementedError, TypeError))
    assert (x + 1).cpu().tolist() == [[1.0, 2.0], [3.0, 1.0]]
    """)


@pytest.mark.parametrize("fast", ["1", "0"])
def test_queued_work_whose_inputs_die_first(fast):
    run("""
    import gc
    from nativelab.device import queue
    outs = []
    for i in range(50):
        a = torch.full((64,), float(i), device=dev)
        b = a[::2] * 2                   # queued on a view of a
        c = torch.empty(32, device=dev)
        queue.launch("op", "test::copy", lambda o, s: o.copy_(s), c, b)
        del a, b                         # the inputs die before the queue runs
        gc.collect()
        outs.append(c)
    torch.neuron.synchronize()
    assert [o.cpu()[0].item() for o in outs] == [2.0 * i for i in range(50)]
    """, NATIVELAB_FAST_PATH=fast)


@pytest.mark.parametrize("fast", ["1", "0"])
def test_bad_sizes_strides_and_shapes_raise_at_the_call_as_on_cpu(fast):
    """Negative or overflowing sizes and strides never make a tensor over too little memory (the C++ allocation
    kernels hand them to CPU, whose error they raise); a copy whose source does not broadcast raises at the call."""
    run("""
    sync = torch.neuron.synchronize
    cases = {
        "empty neg": lambda d: torch.empty(-1, device=d),
        "empty overflow": lambda d: torch.empty(2**62, device=d),
        "empty 2d overflow": lambda d: torch.empty(2**40, 2**40, device=d),
        "empty_strided neg size": lambda d: torch.empty_strided((-2,), (1,), device=d),
        "empty_strided neg stride": lambda d: torch.empty_strided((3,), (-1,), device=d),
        "empty_strided stride overflow": lambda d: torch.empty_strided((3,), (2**61,), device=d),
        "full neg": lambda d: torch.full((-1,), 1.0, device=d),
        "zero tensor neg": lambda d: torch._efficientzerotensor((-1,), device=d),
        "storage neg": lambda d: torch.UntypedStorage(-1, device=d),
        "set_ neg offset": lambda d: torch.empty(0, device=d).set_(torch.UntypedStorage(16, device=d), -1, (2,), (1,)),
        "copy_ from cpu": lambda d: (torch.ones(4, device=d).copy_(torch.ones(3)), torch.neuron.synchronize()),
        "copy_ on device": lambda d: (torch.ones(4, device=d).copy_(torch.ones(3, device=d)), sync()),
        "copy_ more dims": lambda d: (torch.ones(2, device=d).copy_(torch.ones(1, 1, 2, device=d)), sync()),
    }
    for name, make in cases.items():
        want = raises(lambda: make("cpu"), RuntimeError)
        got = raises(lambda: make(dev), RuntimeError)
        if got.split()[:4] != want.split()[:4]:  # CPU's error (its opening words: the same cause)
            raise AssertionError(f"{name}: device {got!r}, cpu {want!r}")
    assert (torch.ones(3, device=dev) + 1).cpu().tolist() == [2.0] * 3
    """, NATIVELAB_FAST_PATH=fast)
