"""Autograd and optimizers on the device match the same training on plain CPU."""

import contextlib
import copy
import threading

import pytest
import torch
import torch.nn as nn


def _train(model, X, y, opt_factory, steps, device):
    model = copy.deepcopy(model).to(device)
    X, y = X.to(device), y.to(device)
    opt = opt_factory(model.parameters())
    losses = []
    for _ in range(steps):
        loss = nn.functional.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize(
    "opt_factory",
    [
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
        lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
        lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True),
    ],
    ids=["sgd-momentum", "adam-loop", "adam-foreach", "adamw-foreach"],
)
def test_training_matches_cpu(opt_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 3))
    X, y = torch.randn(64, 10), torch.randint(0, 3, (64,))
    ref_losses, ref_model = _train(model, X, y, opt_factory, 8, "cpu")
    dev_losses, dev_model = _train(model, X, y, opt_factory, 8, "neuron")
    assert dev_losses[-1] < dev_losses[0]
    torch.testing.assert_close(dev_losses, ref_losses, rtol=1e-4, atol=1e-5)
    for p_ref, p_dev in zip(ref_model.parameters(), dev_model.parameters()):
        assert p_dev.device.type == "neuron"
        torch.testing.assert_close(p_dev.cpu(), p_ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_fused_adamw_runs_on_the_device_and_equals_cpus(amsgrad):
    # Hugging Face Trainer's optim="adamw_torch_fused": torch._fused_adamw_, which the real device implements
    # (native_ops.txt), is queued on the device like any native op, not a CPU fallback; CPU's fused step, bit for
    # bit, over steps with a Tensor and a float lr.
    import torch_neuronx

    g = torch.Generator().manual_seed(0)
    params = [torch.randn(5, 3, generator=g), torch.randn(7, generator=g)]
    grads = [[torch.randn(p.shape, generator=g) for p in params] for _ in range(3)]
    out = {}
    torch_neuronx.clear_op_tracking()
    for device in ("cpu", "neuron"):
        ps = [p.clone().to(device).requires_grad_() for p in params]
        for lr in (0.1, torch.tensor(0.05)):
            opt = torch.optim.AdamW(ps, lr=lr.to(device) if isinstance(lr, torch.Tensor) else lr,
                                    weight_decay=0.1, amsgrad=amsgrad, fused=True)
            for step in grads:
                for p, gr in zip(ps, step):
                    p.grad = gr.to(device)
                opt.step()
        out[device] = [p.detach().cpu() for p in ps]
    for dev, ref in zip(out["neuron"], out["cpu"]):
        assert torch.equal(dev, ref)
    counts = torch_neuronx.get_op_counts()
    assert counts["device"]["aten::_fused_adamw_"] == 3 and counts["device"]["aten::_fused_adamw_.tensor_lr"] == 3
    assert not [op for op in counts["fallback"] if "adam" in op]


def test_eager_lab_loop_with_int32_labels_decreases_every_epoch():
    torch.manual_seed(0)
    device = torch.device("neuron")
    model = nn.Sequential(nn.Linear(10, 2)).to(device)
    X = torch.randn(100, 10).to(device)
    y = torch.randint(0, 2, (100,), dtype=torch.int32).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(10):
        loss = criterion(model(X), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(b < a for a, b in zip(losses, losses[1:]))
    assert model[0].weight.grad.device == torch.device("neuron", 0)


def test_backward_on_another_core():
    w = torch.randn(4, 4).to("neuron:3").requires_grad_()
    (w * w).sum().backward()
    assert w.grad.device == torch.device("neuron", 3)
    torch.testing.assert_close(w.grad.cpu(), 2 * w.detach().cpu())


def test_no_grad_and_inference_mode():
    lin = nn.Linear(4, 4).to("neuron")
    x = torch.randn(2, 4).to("neuron")
    with torch.no_grad():
        assert not lin(x).requires_grad
    with torch.inference_mode():
        out = lin(x)
        assert out.is_inference()
    torch.testing.assert_close(out.cpu(), lin.cpu()(x.cpu()))


def test_module_to_and_back_keeps_parameters():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    ref = [p.clone() for p in m.parameters()]
    m.to("neuron")
    assert all(p.device.type == "neuron" for p in m.parameters())
    m.to("cpu")
    for a, b in zip(m.parameters(), ref):
        assert torch.equal(a, b)
    m.neuron()  # the generated method, like .cuda()
    assert next(m.parameters()).is_neuron


class _TiedLM(nn.Module):
    """An embedding and an LM head sharing one weight (GPT-2, nanoGPT, Llama with tied embeddings)."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(11, 6)
        self.lm_head = nn.Linear(6, 11, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        return self.lm_head(torch.tanh(self.wte(idx)))


def test_moving_a_module_keeps_its_parameters_and_their_ties():
    torch.manual_seed(0)
    m = _TiedLM()
    ref = copy.deepcopy(m)
    weight = m.wte.weight
    opt = torch.optim.SGD(m.parameters(), lr=0.5)  # built before .to(), as CUDA code often does
    m.to("neuron")
    assert m.lm_head.weight is m.wte.weight is weight and weight.device.type == "neuron"
    assert list(m.state_dict()) == list(ref.state_dict())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    idx = torch.tensor([[1, 4, 7], [2, 9, 3]])
    for model, o, device in ((m, opt, "neuron"), (ref, ref_opt, "cpu")):
        nn.functional.cross_entropy(model(idx.to(device)).flatten(0, 1), idx.flatten().to(device)).backward()
        o.step()
    torch.testing.assert_close(m.wte.weight.grad.cpu(), ref.wte.weight.grad)
    torch.testing.assert_close(m.wte.weight.detach().cpu(), ref.wte.weight.detach())
    m.cpu()  # and back: still one parameter, with its gradient
    assert m.lm_head.weight is m.wte.weight is weight and weight.grad.device.type == "cpu"
    m.neuron()
    assert m.lm_head.weight is m.wte.weight is weight
    with torch.device("meta"):
        lazy = _TiedLM()
    lazy.to_empty(device="neuron")
    assert lazy.lm_head.weight is lazy.wte.weight
    assert not torch.__future__.get_swap_module_params_on_conversion()  # a CPU-only program converts as before


def test_moving_a_module_under_inference_mode_or_no_grad_keeps_its_parameters():
    # A generator copying a model to the device inside torch.inference_mode() (a model made there too: its
    # parameters are inference tensors, without an autograd edge): the same values and Parameter objects, no error.
    for ctx, made_inside in ((torch.inference_mode, False), (torch.inference_mode, True), (torch.no_grad, False)):
        torch.manual_seed(0)
        with ctx() if made_inside else contextlib.nullcontext():
            m = _TiedLM()
        weight = m.wte.weight
        with ctx():
            m.to("neuron")
            out = m(torch.tensor([[1, 4, 7]], device="neuron")).cpu()
        torch.manual_seed(0)
        ref = _TiedLM()
        with torch.no_grad():
            want = ref(torch.tensor([[1, 4, 7]]))
        assert m.wte.weight is weight and m.lm_head.weight is weight and weight.device.type == "neuron"
        torch.testing.assert_close(out, want)


def test_moving_a_module_after_a_forward_keeps_its_parameters():
    # The guide's Step 3: `expected = model(x)` on CPU, then `model.to('neuron')`. The output's autograd graph
    # still holds the parameters it saved for backward (PyTorch's swap refuses such a tensor); the module must
    # still keep its Parameter objects (ties, an optimizer made before), silently, and train as on CPU.
    import warnings
    import weakref

    torch.manual_seed(0)
    m = _TiedLM()
    ref = copy.deepcopy(m)
    idx = torch.tensor([[1, 4, 7], [2, 9, 3]])
    expected = m(idx)
    assert m.lm_head.weight._use_count() > 2  # held by the graph (AccumulateGrad + saved for backward)
    weight = m.wte.weight
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.to("neuron")
    assert m.lm_head.weight is m.wte.weight is weight and weight.device.type == "neuron"
    torch.testing.assert_close(m(idx.to("neuron")).detach().cpu(), expected.detach())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for model, o, device in ((m, opt, "neuron"), (ref, ref_opt, "cpu")):
        nn.functional.cross_entropy(model(idx.to(device)).flatten(0, 1), idx.flatten().to(device)).backward()
        o.step()
    torch.testing.assert_close(m.wte.weight.grad.cpu(), ref.wte.weight.grad)
    torch.testing.assert_close(m.wte.weight.detach().cpu(), ref.wte.weight.detach())
    # Backward through the graph built before the move would accumulate into a parameter that has moved: an
    # error, not a gradient lost.
    with pytest.raises(RuntimeError, match="before its module moved"):
        expected.sum().backward()
    # A Python weak reference (a compiled model's guards) still refuses the swap: new Parameters, with a warning.
    lin = nn.Linear(3, 3)
    held = weakref.ref(lin.weight)
    with pytest.warns(UserWarning, match="new Parameter objects"):
        lin.to("neuron")
    assert lin.weight is not held() and lin.weight.device.type == "neuron"


class _Gate(nn.Module):
    """A module with no tensors whose conversion stops until the test lets it go on: a model converting in one
    thread is held halfway (the modules before the gate moved, those after it not yet)."""

    def __init__(self):
        super().__init__()
        self.reached, self.go_on = threading.Event(), threading.Event()

    def _apply(self, fn, recurse=True):
        self.reached.set()
        assert self.go_on.wait(60), "the test never let the conversion go on"
        return super()._apply(fn, recurse)

    def forward(self, x):
        return x


def _held_model():
    """A tied model with a gate between its embedding and its LM head (whose bias moves after the gate), and
    its parameters and gradients as they are before the move."""
    m = nn.Sequential(nn.Embedding(11, 6), _Gate(), nn.Linear(6, 11))
    m[2].weight = m[0].weight
    nn.functional.cross_entropy(m(torch.tensor([1, 4, 7])), torch.tensor([2, 9, 3])).backward()
    return m, [(p, p.grad) for p in m.parameters()]


def _in_a_thread(fn):
    errors = []

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            errors.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def _kept(m, before):
    """Each Parameter and its gradient are the objects they were, on the device, and the tie holds."""
    assert m[2].weight is m[0].weight
    assert [(p, p.grad) for p in m.parameters()] == before  # `==` on tuples of tensors compares identity first
    assert all(p.device.type == "neuron" and p.grad.device.type == "neuron" for p, _ in before)


def test_a_conversion_changes_nothing_another_thread_sees():
    # Another thread, while a model converts: PyTorch's swap setting is the user's and torch.utils.swap_tensors
    # is PyTorch's (which refuses a tensor an autograd graph holds; the conversion's own swap does not).
    swap = torch.utils.swap_tensors
    m, before = _held_model()
    thread, errors = _in_a_thread(lambda: m.to("neuron"))
    try:
        assert m[1].reached.wait(60)
        assert not torch.__future__.get_swap_module_params_on_conversion()
        assert torch.utils.swap_tensors is swap
        w = nn.Parameter(torch.ones(3, 3))
        held = torch.ones(2, 3, requires_grad=True) @ w @ w  # w saved for backward
        with pytest.raises(RuntimeError, match="use_count"):
            torch.utils.swap_tensors(w, nn.Parameter(torch.zeros(3, 3)))
        del held
    finally:
        m[1].go_on.set()
        thread.join(60)
    assert not errors, errors
    _kept(m, before)


def test_two_threads_convert_models_at_once():
    # Two models convert in two threads, both held halfway; the one that started first finishes first, then
    # the other goes on: both keep their Parameters, gradients and ties, and PyTorch's swap function and
    # setting are untouched.
    swap = torch.utils.swap_tensors
    first, first_before = _held_model()
    second, second_before = _held_model()
    threads = []
    try:
        for m in (first, second):
            threads.append(_in_a_thread(lambda m=m: m.to("neuron")))
            assert m[1].reached.wait(60)
        for m, (thread, _) in zip((first, second), threads):
            m[1].go_on.set()
            thread.join(60)
    finally:
        for m in (first, second):
            m[1].go_on.set()
    assert not [e for _, errors in threads for e in errors]
    _kept(first, first_before)
    _kept(second, second_before)
    assert torch.utils.swap_tensors is swap and not torch.__future__.get_swap_module_params_on_conversion()


class _TinyGPT2(nn.Module):
    """GPT-2's shape, tiny: token + position embeddings, pre-norm blocks with causal attention and a GELU MLP,
    dropout after embeddings, attention and projections, the LM head tied to the token embedding, and each
    block under activation checkpointing (its dropout is recomputed in the backward pass)."""

    def __init__(self, vocab=37, n_embd=16, n_head=2, n_layer=2, block=8, p=0.1):
        super().__init__()
        self.n_head, self.p = n_head, p
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({
                "ln_1": nn.LayerNorm(n_embd), "c_attn": nn.Linear(n_embd, 3 * n_embd),
                "c_proj": nn.Linear(n_embd, n_embd), "ln_2": nn.LayerNorm(n_embd),
                "c_fc": nn.Linear(n_embd, 4 * n_embd), "mlp_proj": nn.Linear(4 * n_embd, n_embd),
            })
            for _ in range(n_layer)
        )
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def _block(self, b, x):
        B, T, C = x.shape
        q, k, v = b["c_attn"](b["ln_1"](x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (k.size(-1) ** -0.5)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = nn.functional.dropout(att.masked_fill(~causal, float("-inf")).softmax(-1), self.p, self.training)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + nn.functional.dropout(b["c_proj"](y), self.p, self.training)
        h = b["mlp_proj"](nn.functional.gelu(b["c_fc"](b["ln_2"](x)), approximate="tanh"))
        return x + nn.functional.dropout(h, self.p, self.training)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for b in self.blocks:
            x = torch.utils.checkpoint.checkpoint(self._block, b, x, use_reentrant=False)
        logits = self.lm_head(self.ln_f(x))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _gpt2_run(device, p=0.1, steps=3, backend=None):
    """Losses, per-step gradients and the AdamW-updated weights of the tiny GPT-2 (same seeds on any device),
    the model run through torch.compile(backend=backend) if one is given ("default": `torch.compile(model)`)."""
    torch.manual_seed(0)
    model = _TinyGPT2(p=p)
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, 37, (steps, 2, 9), generator=gen)
    model.to(device).train()
    assert model.lm_head.weight is model.wte.weight and "lm_head.weight" in model.state_dict()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    step = model if backend is None else torch.compile(model) if backend == "default" else torch.compile(
        model, backend=backend)
    torch.manual_seed(2)  # the dropout masks: the CPU's generator on CPU, the device's on the device
    losses, grads = [], []
    for batch in data.to(device):
        opt.zero_grad()
        loss = step(batch[:, :-1], batch[:, 1:])
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
        grads.append({n: q.grad.detach().cpu() for n, q in model.named_parameters()})
    assert model.lm_head.weight is model.wte.weight
    return torch.stack(losses), grads, {n: t.detach().cpu() for n, t in model.state_dict().items()}


def _key_bias(n_embd=16):
    """The key part of each block's `c_attn.bias`: its gradient is exactly zero in exact arithmetic (softmax is
    invariant to adding q.b_k, one constant per row, to all of a row's scores), so what backward computes
    there is rounding noise, whose bits depend on the order of float reductions."""
    return slice(n_embd, 2 * n_embd)


def _assert_same_run(got, want, noise=1e-6):
    """Equal up to float reduction order. The device runs CPU kernels, but with the team size of its thread
    policy (device/threads.py), which shrinks while other processes keep cores busy; some ATen reductions
    (LayerNorm's weight/bias gradients, ...) split their work by thread count, so the order of float
    additions, and the last bits of the results, can differ from the CPU's (about 1e-7 here). The tolerances
    below are two orders of magnitude above that and far below what any real divergence (a weight untied,
    dropout replayed with other masks, a late read) changes: 1e-2 and more.
    One place is excluded: AdamW scales each update by 1/sqrt(v), so where a gradient is rounding noise (the
    key bias, see _key_bias) the update is +-lr whatever the noise's size: its updated value is arbitrary on
    any device (on the CPU itself with another thread count). We check that those gradients are noise on
    both sides and leave those entries out of the weights compared."""
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    for g, w in zip(got[1], want[1]):
        assert g.keys() == w.keys()
        for name in w:
            torch.testing.assert_close(g[name], w[name], atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
            if name.endswith("c_attn.bias"):
                for grad in (g[name], w[name]):
                    assert grad[_key_bias()].abs().max() < noise, f"{name}: the key bias's gradient is not noise"
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        a, b = got[2][name].clone(), want[2][name].clone()
        if name.endswith("c_attn.bias"):
            a[_key_bias()] = b[_key_bias()] = 0
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def _pin_device_team(monkeypatch, n: int) -> None:
    """The device's thread team fixed at n threads (NATIVELAB_THREADS=n), whatever the machine's load."""
    from nativelab.device import state

    monkeypatch.setattr(state.device, "threads", n)


def test_gpt2_style_training_with_tied_weights_dropout_and_checkpointing_matches_cpu(monkeypatch):
    # Every silent divergence of the device (untied weights, dropout replayed with other masks, late reads)
    # shows up here as a different loss, gradient or updated weight. The device's team is pinned to the CPU's
    # thread count: the same reduction order as the CPU run, and the same bits whatever the machine's load.
    _pin_device_team(monkeypatch, torch.get_num_threads())
    _assert_same_run(_gpt2_run("neuron"), _gpt2_run("cpu"))


def test_gpt2_run_under_load_differs_from_cpu_only_by_reduction_order(monkeypatch):
    # What the thread policy does under load (a team of one while another process keeps a core busy) changes
    # the order of float reductions only (here: the key bias's noise, AdamW's +-lr steps on it, ~1e-7 elsewhere).
    _pin_device_team(monkeypatch, 1)
    _assert_same_run(_gpt2_run("neuron"), _gpt2_run("cpu"))


@pytest.mark.slow
def test_gpt2_style_training_compiled_for_the_device_matches_cpu(monkeypatch):
    # The same run through torch.compile(backend="neuron"): Dynamo + AOTAutograd graphs, the checkpointed
    # blocks' dropout replayed in the backward graph from the device generator's saved state (AOTAutograd's
    # run_and_save_rng_state / run_with_rng_state, see compiler/random_ops.py). Inductor's own random numbers
    # differ from eager's on any device (they do on CPU too); `fallback_random` is PyTorch's switch for
    # comparing compiled random ops with eager, so the reference is the plain eager CPU run.
    import torch._inductor.config

    torch._dynamo.reset()
    _pin_device_team(monkeypatch, torch.get_num_threads())
    try:
        with torch._inductor.config.patch(fallback_random=True):
            got = _gpt2_run("neuron", backend="neuron")
    finally:
        torch._dynamo.reset()
    _assert_same_run(got, _gpt2_run("cpu"))


@pytest.mark.slow
def test_gpt2_style_training_compiled_with_the_default_backend_matches_cpu(monkeypatch):
    # nanoGPT's `model = torch.compile(model)`: no backend, so Inductor, which generates no code for the device
    # (it asserted `scheduling_ctor`); the device's graphs go to the neuron backend with a warning saying so.
    import torch._inductor.config

    from nativelab import compiler
    from nativelab.compiler import default_backend

    torch._dynamo.reset()
    _pin_device_team(monkeypatch, torch.get_num_threads())
    monkeypatch.setattr(default_backend, "_warned", False)
    before = compiler.stats()["default_backend_graphs"]
    try:
        with torch._inductor.config.patch(fallback_random=True), pytest.warns(UserWarning, match="backend='neuron'"):
            got = _gpt2_run("neuron", backend="default")
    finally:
        torch._dynamo.reset()
    assert compiler.stats()["default_backend_graphs"] - before == 1  # Dynamo's one graph (AOTAutograd splits it)
    _assert_same_run(got, _gpt2_run("cpu"))
