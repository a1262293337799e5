"""The kernel interface and library, each kernel against its plain-PyTorch reference."""

import os

import pytest
import torch

import nativelab
from conftest import run_python
from nativelab.kernels import ops
from nativelab.kernels.ops.decode_weights import DecodeWeights
from nativelab.kernels.ops.sample import seed_state

# Kernels compile generated code on first use of each shape: the fast tier keeps rmsnorm, bad input and greedy
# sampling, the rest is slow.

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))


def _on(device, *ts):
    return [t.to(device) for t in ts]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", ["neuron", "cpu"])
def test_rmsnorm(device, dtype):
    torch.manual_seed(0)
    x, w = torch.randn(3, 7, 48, dtype=dtype), torch.randn(48, dtype=dtype)
    got = ops.rmsnorm(*_on(device, x, w), 1e-6)
    assert got.device.type == device
    torch.testing.assert_close(got.cpu(), ops.reference_rmsnorm(x, w, 1e-6), **TOL[dtype])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_out_of_place_and_in_place(dtype):
    torch.manual_seed(0)
    x, cos, sin = torch.randn(2, 3, 5, 8, dtype=dtype), torch.randn(5, 8, dtype=dtype), torch.randn(5, 8, dtype=dtype)
    ref = ops.reference_rope(x, cos, sin)
    xd, cd, sd = _on("neuron", x, cos, sin)
    torch.testing.assert_close(ops.rope(xd, cd, sd).cpu(), ref, **TOL[dtype])
    torch.ops.nativelab.rope_(xd, cd, sd)
    torch.testing.assert_close(xd.cpu(), ref, **TOL[dtype])


@pytest.mark.slow
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mlp(dtype, residual):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 32, dtype=dtype)
    g, u, d = (torch.randn(80, 32, dtype=dtype) * 0.2, torch.randn(80, 32, dtype=dtype) * 0.2,
               torch.randn(32, 80, dtype=dtype) * 0.2)
    n = torch.randn(32, dtype=dtype)
    for norm in (None, n):
        ref = ops.reference_mlp(x, g, u, d, norm, 1e-5, residual)
        args = _on("neuron", x, g, u, d) + ([norm.to("neuron")] if norm is not None else [None])
        torch.testing.assert_close(ops.mlp(*args, 1e-5, residual).cpu(), ref, **TOL[dtype])


@pytest.mark.slow
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
def test_qkv(heads):
    torch.manual_seed(0)
    h, hkv = heads
    d, dim, t = 8, 24, 3
    x, n = torch.randn(2, t, dim), torch.randn(dim)
    wq, wk, wv = torch.randn(h * d, dim), torch.randn(hkv * d, dim), torch.randn(hkv * d, dim)
    cos, sin = torch.randn(t, d), torch.randn(t, d)
    got = ops.qkv(*_on("neuron", x, n, wq, wk, wv, cos, sin), h, hkv)
    for g, r in zip(got, ops.reference_qkv(x, n, wq, wk, wv, cos, sin, h, hkv)):
        torch.testing.assert_close(g.cpu(), r, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_kernels_in_a_compiled_graph_stay_one_node():
    torch.manual_seed(0)
    x, w = torch.randn(4, 16), torch.randn(16)

    def f(x, w):
        return ops.rmsnorm(x * 2, w) + 1

    got = torch.compile(f, backend="neuron")(*_on("neuron", x, w))
    torch.testing.assert_close(got.cpu(), ops.reference_rmsnorm(x * 2, w) + 1, rtol=1e-5, atol=1e-5)
    assert nativelab.get_fallback_ops() == []


def test_bad_input_is_rejected_before_any_work():
    x = torch.randn(2, 4, 16).to("neuron")
    with pytest.raises(ValueError, match=r"weight: dimension 0 must be 16"):
        ops.rmsnorm(x, torch.ones(8).to("neuron"))
    with pytest.raises(ValueError, match="dtype must be float32 or bfloat16"):
        ops.rmsnorm(x.to(torch.int32), torch.ones(16, dtype=torch.int32).to("neuron"))
    with pytest.raises(ValueError, match="one device"):
        ops.rmsnorm(x, torch.ones(16))
    with pytest.raises(ValueError, match="n_heads must be a multiple of n_kv_heads"):
        ops.qkv(x, torch.ones(16), torch.ones(24, 16), torch.ones(16, 16), torch.ones(16, 16),
                torch.ones(4, 8), torch.ones(4, 8), 3, 2)
    with pytest.raises(ValueError, match="top_p"):
        ops.sample(torch.randn(1, 10).to("neuron"), seed_state(0, "neuron"), 1.0, 0, 1.5)


@pytest.mark.slow
@pytest.mark.parametrize("top_k,top_p", [(0, 0.9), (20, 1.0), (50, 0.5)])
def test_sample_stays_in_the_allowed_set_without_fallbacks(top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(3, 1000) * 3
    allowed = ops.reference_sample_mask(logits, 0.7, top_k, top_p)
    state = seed_state(42, "neuron")
    nativelab.clear_op_tracking()
    for _ in range(20):
        tok = ops.sample(logits.to("neuron"), state, 0.7, top_k, top_p).cpu()
        assert all(allowed[r, t] for r, t in enumerate(tok.tolist()))
    assert nativelab.get_fallback_ops() == []  # no sort, multinomial or argmax fallback
    assert state.cpu().tolist() == [42, 20]


@pytest.mark.slow
def test_sample_with_widely_spread_logits_keeps_the_top_p_set():
    # Most probabilities underflow here (the kernel guards against denormals): the nucleus must not change.
    torch.manual_seed(1)
    logits = torch.randn(2, 3000) * 40
    allowed = ops.reference_sample_mask(logits, 0.8, 0, 0.95)
    assert allowed.sum() < 20  # a handful of tokens hold the mass
    state = seed_state(3, "neuron")
    for _ in range(30):
        tok = ops.sample(logits.to("neuron"), state, 0.8, 0, 0.95).cpu()
        assert all(allowed[r, t] for r, t in enumerate(tok.tolist()))


@pytest.mark.slow
def test_sample_frequencies_follow_the_distribution_and_seed_reproduces():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    state = seed_state(7, "neuron")
    draws = torch.stack([ops.sample(logits.to("neuron"), state, 1.0, 0, 1.0) for _ in range(4000)]).cpu()
    freq = torch.bincount(draws.view(-1), minlength=4).float() / 4000
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), rtol=0, atol=0.03)
    again = seed_state(7, "neuron")
    assert torch.equal(torch.stack([ops.sample(logits.to("neuron"), again, 1.0, 0, 1.0) for _ in range(50)]).cpu(),
                       draws[:50])


def test_greedy_sample_is_argmax():
    logits = torch.randn(2, 50)
    got = ops.sample(logits.to("neuron"), seed_state(0, "neuron"), 0.0)
    assert torch.equal(got.cpu(), logits.argmax(-1))


@pytest.mark.slow
def test_kernel_pattern_eager_compiled_and_cache_across_processes():
    code = (
        "import torch, nativelab.compiler as c\n"
        "from nativelab.kernels import wrap_kernel, kernel_op\n"
        "def scale_kernel(a, out):\n"
        "    torch.mul(a, 3, out=out)\n"
        "k = wrap_kernel(scale_kernel)\n"
        "@kernel_op('kcache_test::scale', mutates_args=())\n"
        "def scale(a: torch.Tensor) -> torch.Tensor:\n"
        "    out = torch.empty_like(a); k(a, out); return out\n"
        "a = torch.arange(6.0).to('neuron')\n"
        "assert scale(a).cpu().tolist() == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]\n"
        "s = c.stats(); print(s['cache_hits'], s['cache_misses'])\n"
    )
    env = {"NATIVELAB_CACHE_DIR": os.environ["NATIVELAB_CACHE_DIR"]}
    first, second = run_python(code, env, timeout=300), run_python(code, env, timeout=300)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr[-1500:], second.stderr[-1500:])
    assert first.stdout.split() == ["0", "1"] and second.stdout.split() == ["1", "0"]


@pytest.mark.slow
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_attention_cte_matches_reference_and_sdpa(heads):
    torch.manual_seed(0)
    h, hkv = heads
    q, k, v = torch.randn(2, h, 6, 8), torch.randn(2, hkv, 6, 8), torch.randn(2, hkv, 6, 8)
    got = ops.attention_cte(*_on("neuron", q, k, v)).cpu()
    torch.testing.assert_close(got, ops.reference_attention_cte(q, k, v), rtol=1e-5, atol=1e-5)
    rep = h // hkv
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)
    torch.testing.assert_close(got, sdpa, rtol=1e-4, atol=1e-5)  # an independent reference


@pytest.mark.slow
def test_attention_tkg_writes_the_cache_in_place_and_masks_unfilled_positions():
    torch.manual_seed(0)
    kc, vc = torch.zeros(1, 2, 10, 8), torch.zeros(1, 2, 10, 8)
    kcd, vcd = kc.to("neuron"), vc.to("neuron")
    for step in range(3):
        q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
        pos = torch.tensor([step])
        ref = ops.reference_attention_tkg(q, k, v, kc, vc, pos)
        got = ops.attention_tkg(*_on("neuron", q, k, v), kcd, vcd, pos.to("neuron"))
        torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kcd.cpu(), kc)
    assert kcd.cpu()[:, :, 3:].abs().sum() == 0  # nothing written past the filled positions
    # garbage beyond the filled positions must not change the result
    vcd[:, :, 5:] = 1e4
    got2 = ops.attention_tkg(*_on("neuron", q, k, v), kcd, vcd, torch.tensor([2]).to("neuron"))
    torch.testing.assert_close(got2.cpu(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_transformer_tkg_matches_the_llama_model_over_several_steps():
    from nativelab.models.llama import Llama

    torch.manual_seed(0)
    ref = Llama.from_size("tiny")
    ref.setup_cache()
    dev = Llama.from_size("tiny")
    dev.load_state_dict(ref.state_dict())
    dev.to("neuron")
    dev.setup_cache()
    L = dev.layers
    weights, caches = DecodeWeights.of(dev).flat()  # each tensor from the module it names
    for step, token in enumerate([5, 17, 3]):
        tok, pos = torch.tensor([[token]]), torch.tensor([step])
        expected = ref(tok, pos)
        pd = pos.to("neuron")
        got = ops.transformer_tkg(dev.embed_tokens(tok.to("neuron")), pd, dev.rope_cos[pd], dev.rope_sin[pd], weights,
                                  caches, dev.cfg.n_heads, dev.cfg.n_kv_heads, dev.cfg.norm_eps)
        torch.testing.assert_close(got.cpu(), expected.detach(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(L[1].self_attn.v_cache.cpu(), ref.layers[1].self_attn.v_cache, rtol=1e-5, atol=1e-5)


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is in the test extras
    given = None

if given is not None:

    @pytest.mark.slow
    @settings(max_examples=5, deadline=None)
    @given(rows=st.integers(1, 4), cols=st.sampled_from([2, 6, 16, 30]), half=st.sampled_from([1, 2, 4]))
    def test_rmsnorm_and_rope_any_shape(rows, cols, half):
        torch.manual_seed(rows * 100 + cols)
        x, w = torch.randn(rows, cols), torch.randn(cols)
        torch.testing.assert_close(ops.rmsnorm(*_on("neuron", x, w)).cpu(), ops.reference_rmsnorm(x, w),
                                   rtol=1e-4, atol=1e-5)
        d = 2 * half
        xr, cos, sin = torch.randn(1, rows, cols, d), torch.randn(cols, d), torch.randn(cols, d)
        torch.testing.assert_close(ops.rope(*_on("neuron", xr, cos, sin)).cpu(), ops.reference_rope(xr, cos, sin),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("device", ["neuron", "cpu"])
def test_cross_entropy_loss_and_gradients_with_int32_labels_and_ignore_index(device):
    torch.manual_seed(0)
    logits = torch.randn(8, 40, requires_grad=True)
    target = torch.randint(0, 40, (8,))
    target[3] = -100
    ref = ops.reference_cross_entropy(logits, target)
    ref.backward()
    d = logits.detach().to(device).requires_grad_()
    loss = ops.cross_entropy(d, target.to(torch.int32).to(device))
    loss.backward()
    torch.testing.assert_close(loss.cpu(), ref.detach())
    torch.testing.assert_close(d.grad.cpu(), logits.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_cross_entropy_matches_lm_head_plus_loss(dtype):
    torch.manual_seed(0)
    h = torch.randn(6, 16, dtype=dtype, requires_grad=True)
    w = (torch.randn(50, 16, dtype=dtype) * 0.3).requires_grad_()
    target = torch.randint(0, 50, (6,))
    ref = ops.reference_linear_cross_entropy(h, w, target)
    ref.backward()
    hd, wd = h.detach().to("neuron").requires_grad_(), w.detach().to("neuron").requires_grad_()
    loss = ops.linear_cross_entropy(hd, wd, target.to("neuron"))
    loss.backward()
    torch.testing.assert_close(loss.cpu(), ref.detach().float(), **TOL[dtype])
    torch.testing.assert_close(hd.grad.cpu(), h.grad, **TOL[dtype])
    torch.testing.assert_close(wd.grad.cpu(), w.grad, **TOL[dtype])


@pytest.mark.slow
def test_training_step_with_linear_cross_entropy_compiled():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(30, 16).to("neuron")
    head = torch.nn.Linear(16, 30, bias=False).to("neuron")
    opt = torch.optim.SGD(list(emb.parameters()) + list(head.parameters()), lr=0.5)
    tokens = torch.randint(0, 30, (12,)).to(torch.int32).to("neuron")
    labels = torch.roll(tokens, 1)

    @torch.compile(backend="neuron")
    def loss_fn(tokens, labels):
        return ops.linear_cross_entropy(emb(tokens), head.weight, labels)

    losses = []
    for _ in range(5):
        loss = loss_fn(tokens, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.9, losses


@pytest.mark.slow
def test_meta_tensors_launch_nothing():
    from nativelab.kernels import Kernel

    ran = []
    k = Kernel(lambda a, out: ran.append(a))
    t = torch.empty(2, device="meta")  # meta / fake tensors: a trace is running, no kernel may run
    assert k(t, t) is None and ran == [] and k._compiled == {}


@pytest.mark.slow
def test_inference_bakes_weights_and_follows_in_place_updates():
    torch.manual_seed(0)
    x = torch.randn(1, 2, 16)
    g, u, d = torch.randn(32, 16) * 0.2, torch.randn(32, 16) * 0.2, torch.randn(16, 32) * 0.2
    xd, gd, ud, dd = _on("neuron", x, g, u, d)
    with torch.inference_mode():
        first = ops.mlp(xd, gd, ud, dd).cpu()
        torch.testing.assert_close(first, ops.reference_mlp(x, g, u, d), rtol=1e-4, atol=1e-5)
        gd.mul_(2)  # the weight changes in place: the baked copy must not be used any more
        second = ops.mlp(xd, gd, ud, dd).cpu()
    torch.testing.assert_close(second, ops.reference_mlp(x, g * 2, u, d), rtol=1e-4, atol=1e-5)
    from nativelab.kernels.ops.mlp import mlp_kernel_no_norm

    frozen_keys = [k for k in mlp_kernel_no_norm._compiled if k[2] and k[2][0][0] == gd.data_ptr()]
    assert len(frozen_keys) == 2  # one baked variant per weight version


def _grads_match(op, ref, inputs, grad_out, needs, tol):
    """op on the device and the reference on CPU give the same gradients for the inputs in `needs`."""
    cpu = [t.detach().clone().requires_grad_(n) if isinstance(t, torch.Tensor) else t for t, n in zip(inputs, needs)]
    dev = [t.detach().to("neuron").requires_grad_(n) if isinstance(t, torch.Tensor) else t
           for t, n in zip(inputs, needs)]
    (ref(*cpu) * grad_out).sum().backward()
    out = op(*dev)
    (out * grad_out.to("neuron")).sum().backward()
    for c, d, n in zip(cpu, dev, needs):
        if n:
            torch.testing.assert_close(d.grad.cpu(), c.grad, **tol)
        elif isinstance(d, torch.Tensor):
            assert d.grad is None


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_gradients(dtype):
    torch.manual_seed(0)
    x, w = torch.randn(2, 5, 48, dtype=dtype), torch.randn(48, dtype=dtype)
    g = torch.randn(2, 5, 48, dtype=dtype)
    tol = TOL[dtype] if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    _grads_match(ops.rmsnorm, ops.reference_rmsnorm, [x, w, 1e-6], g, [True, True, False], tol)


@pytest.mark.slow
def test_rope_gradient_on_a_transposed_view():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 8)  # (B, T, H, D) transposed to (B, H, T, D) as Hugging Face attention does
    cos, sin = torch.randn(5, 8), torch.randn(5, 8)
    g = torch.randn(2, 3, 5, 8)
    _grads_match(lambda x, c, s: ops.rope(x.transpose(1, 2), c, s),
                 lambda x, c, s: ops.reference_rope(x.transpose(1, 2), c, s),
                 [x, cos, sin], g, [True, False, False], TOL[torch.float32])


@pytest.mark.slow
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("train_weights", [True, False], ids=["full", "frozen"])
def test_mlp_gradients(residual, train_weights):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32)
    gw, uw, dw = torch.randn(80, 32) * 0.2, torch.randn(80, 32) * 0.2, torch.randn(32, 80) * 0.2
    g = torch.randn(2, 3, 32)
    _grads_match(ops.mlp, ops.reference_mlp, [x, gw, uw, dw, None, 1e-5, residual], g,
                 [True] + [train_weights] * 3 + [False] * 3, TOL[torch.float32])


@pytest.mark.slow
def test_linear_cross_entropy_frozen_head_gives_no_weight_gradient():
    torch.manual_seed(0)
    h, w, target = torch.randn(6, 16), torch.randn(50, 16) * 0.3, torch.randint(0, 50, (6,))
    _grads_match(ops.linear_cross_entropy, ops.reference_linear_cross_entropy, [h, w, target],
                 torch.tensor(1.0), [True, False, False], TOL[torch.float32])


@pytest.mark.slow
def test_weights_stay_inputs_compiles_once_for_changing_weights():
    """Without autograd a kernel bakes its weights (one compiled variant per weight set); inside
    weights_stay_inputs() (fine-tuning's held-out loss and samples) they stay inputs: one variant serves
    every layer's weights, and each call sees the weights' current values."""
    from nativelab.kernels import weights_stay_inputs
    from nativelab.kernels.ops.mlp import mlp_kernel_no_norm, reference_mlp

    torch.manual_seed(0)
    x = torch.randn(3, 16, device="neuron")
    layers = [[torch.randn(32, 16, device="neuron"), torch.randn(32, 16, device="neuron"),
               torch.randn(16, 32, device="neuron")] for _ in range(3)]
    with torch.no_grad():
        before = len(mlp_kernel_no_norm._compiled)
        with weights_stay_inputs():
            for w in layers:
                got = ops.mlp(x, *w)
                torch.testing.assert_close(got.cpu(), reference_mlp(x.cpu(), *[t.cpu() for t in w]))
            layers[0][0].mul_(2)  # an optimizer step, say
            torch.testing.assert_close(ops.mlp(x, *layers[0]).cpu(),
                                       reference_mlp(x.cpu(), *[t.cpu() for t in layers[0]]))
        assert len(mlp_kernel_no_norm._compiled) == before + 1
        for w in layers:  # baked: one variant per weight set
            ops.mlp(x, *w)
        assert len(mlp_kernel_no_norm._compiled) == before + 1 + len(layers)


@pytest.mark.slow
def test_whole_step_kernels_name_a_short_layer_list_or_a_wrong_lm_head():
    """transformer_tkg and transformer_tkg_token check their per-layer lists and LM head before anything runs."""
    from nativelab.models.llama import Llama

    m = Llama.random("tiny", "experimental", seed=0)
    m.setup_cache()
    c, w = m.cfg, m.decode_weights()
    weights, caches = w.flat()
    head = m.lm_head.weight
    tokens, pos = torch.tensor([[3]]), torch.tensor([0])
    with pytest.raises(ValueError, match=r"caches: expected 2 x %d layers tensors" % c.n_layers):
        ops.transformer_tkg_token(tokens, pos, seed_state(0, "cpu"), weights, caches[:-1], m.rope_cos, m.rope_sin,
                                  c.n_heads, c.n_kv_heads, c.norm_eps, 0.0, 0, 1.0)
    with pytest.raises(ValueError, match=r"weights: expected 3 \+ 9 x layers tensors"):
        ops.transformer_tkg_token(tokens, pos, seed_state(0, "cpu"), weights[:-1], caches, m.rope_cos, m.rope_sin,
                                  c.n_heads, c.n_kv_heads, c.norm_eps, 0.0, 0, 1.0)
    short = w._replace(k_caches=w.k_caches[:-1])  # built by name, one layer short
    with pytest.raises(ValueError, match=r"k_caches: expected one tensor per layer"):
        short.check(c.dim)
    x = torch.randn(1, 1, c.dim)
    with pytest.raises(ValueError, match=r"lm_head: expected \[vocab, %d\]" % c.dim):
        ops.transformer_tkg(x, pos, m.rope_cos[:1], m.rope_sin[:1], *w._replace(lm_head=head[:, :-1]).flat(),
                            c.n_heads, c.n_kv_heads, c.norm_eps)
