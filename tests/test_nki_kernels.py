"""The library's NKI kernels (kernels/nki) against their PyTorch references (kernels/ops): interpreted
(nki.simulate), launched eagerly on neuron and CPU tensors, and inside torch.compile(backend="neuron"), in
float32 and bfloat16.

Tolerances follow the references' rounding points. Each kernel rounds where its reference rounds (every
product or sum PyTorch's eager bf16 would round, matmuls accumulated in fp32 and rounded once), so what can
differ is the fp32 summation order: ~1e-6 relative in float32; in bfloat16 an intermediate that lands on a
rounding boundary may round one ulp (2**-8 relative) the other way and carry that into the output, so 2e-2."""

import importlib
import warnings

import pytest
import torch

from nativelab import nki
from nativelab.kernels import nki as nki_kernels
from nativelab.kernels import wrap_nki
from nativelab.kernels.ops import reference_rmsnorm, reference_sample_mask
from nativelab.kernels.ops.attention import reference_attention_cte, reference_attention_tkg
from nativelab.kernels.ops.decode_weights import DecodeWeights
from nativelab.kernels.ops.mlp import reference_mlp
from nativelab.kernels.ops.qkv import reference_qkv
from nativelab.kernels.ops.rope import reference_rope
from nativelab.kernels.ops.transformer import reference_transformer_tkg_token

sample_ops = importlib.import_module("nativelab.kernels.ops.sample")  # the module (the package exports its op)
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    monkeypatch.setenv("NATIVELAB_NKI_LOWER", "0")  # the kernels' own code, compiled (their lowerings: test_nki_lowering)


def _weight(out_features, in_features, dtype):
    """An nn.Linear-like weight: entries of size 1/sqrt(in), so every layer's outputs stay O(1)."""
    return (torch.randn(out_features, in_features) * in_features ** -0.5).to(dtype)


def _rows(t):
    return t.reshape(-1, t.shape[-1])


# name: (the op, its NKI kernel, the op's arguments, the kernel's arguments from them, the reference)
CASES = {
    "add": (nki_kernels.add, nki_kernels.add_kernel,
            lambda dt: (torch.randn(200, 48, dtype=dt), torch.randn(200, 48, dtype=dt)),
            lambda a, b: (a, b), lambda a, b: a + b),
    # K over several tiles (one partial), M and N with partial tiles
    "matmul": (nki_kernels.matmul, nki_kernels.matmul_kernel,
               lambda dt: (torch.randn(200, 300, dtype=dt), torch.randn(300, 700, dtype=dt)),
               lambda a, b: (a, b), lambda a, b: (a.double() @ b.double()).to(a.dtype)),
    "rmsnorm": (nki_kernels.rmsnorm, nki_kernels.rmsnorm_kernel,
                lambda dt: (torch.randn(3, 70, 64, dtype=dt), torch.randn(64, dtype=dt), 1e-5),
                lambda x, w, eps: (_rows(x), w, eps), reference_rmsnorm),
    "softmax": (nki_kernels.softmax, nki_kernels.softmax_kernel,
                lambda dt: (torch.randn(2, 150, 96, dtype=dt) * 4,),
                lambda x: (_rows(x),), nki_kernels.reference_softmax),
    # several heads per 128-row tile (T = 5), and a sequence over two position tiles (T = 200)
    "rope": (nki_kernels.rope, nki_kernels.rope_kernel,
             lambda dt: (torch.randn(2, 3, 5, 16, dtype=dt), torch.randn(5, 16, dtype=dt),
                         torch.randn(5, 16, dtype=dt)),
             lambda x, c, s: (x, c, s), reference_rope),
    "rope_long": (nki_kernels.rope, nki_kernels.rope_kernel,
                  lambda dt: (torch.randn(1, 2, 200, 64, dtype=dt), torch.randn(200, 64, dtype=dt),
                              torch.randn(200, 64, dtype=dt)),
                  lambda x, c, s: (x, c, s), reference_rope),
    # 130 tokens (two tiles), hidden 200 and intermediate 300 (partial tiles of both)
    "mlp": (nki_kernels.mlp, nki_kernels.mlp_kernel,
            lambda dt: (torch.randn(2, 65, 200, dtype=dt), _weight(300, 200, dt), _weight(300, 200, dt),
                        _weight(200, 300, dt)),
            lambda x, g, u, d: (_rows(x), *map(nki_kernels.tiled, (g, u, d))), reference_mlp),
    # grouped-query (4 heads on 2 kv heads), 200 positions: two query tiles, the second's keys past 128
    "attention_cte": (nki_kernels.attention_cte, nki_kernels.attention_cte_kernel,
                      lambda dt: tuple(torch.randn(2, h, 200, 16, dtype=dt) for h in (4, 2, 2)),
                      lambda q, k, v: (q, k, v), reference_attention_cte),
    # norm + projections + RoPE -> (q, k, v): grouped-query, hidden 200 (a partial tile), two sequences of 5
    "qkv": (nki_kernels.qkv, nki_kernels.qkv_kernel,
            lambda dt: (torch.randn(2, 5, 200, dtype=dt), torch.randn(200, dtype=dt), _weight(64, 200, dt),
                        _weight(32, 200, dt), _weight(32, 200, dt), torch.randn(5, 16, dtype=dt),
                        torch.randn(5, 16, dtype=dt), 4, 2, 1e-5),
            lambda x, n, wq, wk, wv, *rest: (x, n, *map(nki_kernels.tiled, (wq, wk, wv)), *rest), reference_qkv),
}


def _case(name, dtype):
    op, kernel, make, to_kernel, reference = CASES[name]
    torch.manual_seed(0)
    args = make(dtype)
    return op, kernel, args, to_kernel(*args), reference(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_interpreted_equals_reference(name, dtype):
    """nki.simulate: the kernel's instructions one by one, no compile."""
    _, kernel, _, kernel_args, expected = _case(name, dtype)
    _close(nki.simulate(kernel)(*kernel_args), expected, dtype)


def _close(got, expected, dtype, plus=0):
    """got == expected (+ plus) within the dtype's tolerance; tuples of outputs compared one by one."""
    if isinstance(expected, tuple):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            _close(g, e, dtype, plus)
        return
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu().reshape(expected.shape), expected.float() + plus if plus else expected,
                               **TOL[dtype], check_dtype=False)


def _plus_one(out):
    return tuple(o + 1 for o in out) if isinstance(out, tuple) else out + 1


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", ["neuron", "cpu"])
@pytest.mark.parametrize("name", list(CASES))
def test_op_eager_and_compiled(name, device, dtype):
    op, _, args, _, expected = _case(name, dtype)
    on = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    got = op(*on)
    assert {g.device.type for g in (got if isinstance(got, tuple) else [got])} == {device}
    _close(got, expected, dtype)
    if device == "neuron" and dtype == torch.bfloat16:  # compiled once per kernel, in the lab's dtype (CI time)
        compiled = torch.compile(lambda *xs: _plus_one(op(*xs)), backend="neuron")
        _close(compiled(*on), expected, dtype, plus=1)


def _decode(dtype, pos, cache_len=600):
    """One decode token: 4 query heads on 2 kv heads, a cache over two 512-key PSUM banks (600 positions)."""
    torch.manual_seed(0)
    q, k_new, v_new = (torch.randn(2, h, 1, 32, dtype=dtype) for h in (4, 2, 2))
    k_cache, v_cache = (torch.randn(2, 2, cache_len, 32, dtype=dtype) for _ in range(2))
    return q, k_new, v_new, k_cache, v_cache, torch.tensor([pos])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pos", [0, 300, 599])
def test_decode_attention_interpreted_equals_reference(dtype, pos):
    """The kernel reads the cache's positions < pos (whatever is at pos and after is masked) and the new token,
    then writes the new token's key and value at pos, as the reference does."""
    q, k_new, v_new, k_cache, v_cache, p = _decode(dtype, pos)
    ref_caches = k_cache.clone(), v_cache.clone()
    expected = reference_attention_tkg(q, k_new, v_new, *ref_caches, p)
    k_cache[:, :, pos:] = float("nan")  # never read: the mask is a select, not a multiply
    v_cache[:, :, pos:] = 1e4
    got = nki.simulate(nki_kernels.attention_tkg_kernel)(q, k_new, v_new, k_cache, v_cache, p)
    torch.testing.assert_close(got, expected, **TOL[dtype])
    for got_cache, want in zip((k_cache, v_cache), ref_caches):
        assert torch.equal(got_cache[:, :, :pos + 1], want[:, :, :pos + 1])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_op_eager_and_compiled_on_neuron(dtype):
    """The op's result and its effect: the output, and k_new / v_new written into the caches at pos."""
    args = _decode(dtype, 300)
    ref_caches = [args[3].clone(), args[4].clone()]
    expected = reference_attention_tkg(*args[:3], *ref_caches, args[5])
    runs = [nki_kernels.attention_tkg]
    if dtype == torch.bfloat16:  # compiled in the lab's dtype only (CI time)
        runs.append(torch.compile(nki_kernels.attention_tkg, backend="neuron"))
    for run in runs:
        on = [a.to("neuron") for a in args]
        got = run(*on)
        torch.testing.assert_close(got.cpu(), expected, **TOL[dtype])
        torch.testing.assert_close(on[3].cpu(), ref_caches[0], rtol=0, atol=0)
        torch.testing.assert_close(on[4].cpu(), ref_caches[1], rtol=0, atol=0)


def test_decode_attention_takes_one_token():
    q, k_new, v_new, k_cache, v_cache, p = _decode(torch.float32, 3, cache_len=8)
    with pytest.raises(ValueError, match="one query token per step"):
        nki_kernels.attention_tkg(q.expand(2, 4, 2, 32), k_new.expand(2, 2, 2, 32), v_new.expand(2, 2, 2, 32),
                                  k_cache, v_cache, torch.tensor([3, 4]))


def _step(dtype, n_layers=2, b=2, dim=200, heads=4, kv_heads=2, d=16, inter=300, cache_len=40, vocab=700):
    """A decode step's inputs: grouped-query layers with partial tiles everywhere, their caches, the head."""
    torch.manual_seed(0)
    layers = [dict(input_norm=torch.randn(dim, dtype=dtype), wq=_weight(heads * d, dim, dtype),
                   wk=_weight(kv_heads * d, dim, dtype), wv=_weight(kv_heads * d, dim, dtype),
                   wo=_weight(dim, heads * d, dtype), post_norm=torch.randn(dim, dtype=dtype),
                   gate=_weight(inter, dim, dtype), up=_weight(inter, dim, dtype), down=_weight(dim, inter, dtype),
                   k_cache=torch.randn(b, kv_heads, cache_len, d, dtype=dtype),
                   v_cache=torch.randn(b, kv_heads, cache_len, d, dtype=dtype)) for _ in range(n_layers)]
    x, cos, sin = torch.randn(b, 1, dim, dtype=dtype), torch.randn(1, d, dtype=dtype), torch.randn(1, d, dtype=dtype)
    return x, cos, sin, layers, torch.randn(dim, dtype=dtype), _weight(vocab, dim, dtype), heads, kv_heads


def _decode_weights(dtype, **shape):
    """_step's layers as a model's DecodeWeights (by name: a new field fails here), with an embedding and RoPE
    tables (one row per cache position)."""
    x, cos, sin, layers, final_norm, head, heads, kv_heads = _step(dtype, **shape)
    per_layer = {field: [c[name] for c in layers] for field, name in (
        ("input_norms", "input_norm"), ("wqs", "wq"), ("wks", "wk"), ("wvs", "wv"), ("wos", "wo"),
        ("post_norms", "post_norm"), ("gates", "gate"), ("ups", "up"), ("downs", "down"),
        ("k_caches", "k_cache"), ("v_caches", "v_cache"))}
    cache_len, d = layers[0]["k_cache"].shape[2], layers[0]["k_cache"].shape[3]
    embed = torch.randn(head.shape[0], head.shape[1], dtype=dtype)
    rope_cos, rope_sin = torch.randn(cache_len, d, dtype=dtype), torch.randn(cache_len, d, dtype=dtype)
    return DecodeWeights(embed=embed, **per_layer, final_norm=final_norm, lm_head=head), rope_cos, rope_sin, heads, \
        kv_heads


def _with_cache_copies(w):
    return w._replace(k_caches=[k.clone() for k in w.k_caches], v_caches=[v.clone() for v in w.v_caches])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transformer_step_interpreted_equals_reference(dtype):
    """One launch of the whole decode step (weights prepared once by DecodeStack.prepare) gives
    reference_transformer_tkg_token's logits, writes its cache rows at pos (and nothing else), returns the first
    largest logit's index as int64 and advances the sampler's counter once; with no hazard or other NKI warning."""
    w, rope_cos, rope_sin, heads, kv_heads = _decode_weights(dtype)
    tokens, pos, seed = torch.tensor([[5], [600]]), torch.tensor([17]), torch.tensor([7, 41])
    ref = _with_cache_copies(w)
    expected = reference_transformer_tkg_token(tokens, pos, seed, ref, rope_cos, rope_sin, heads, kv_heads)[:, -1]
    stack = nki_kernels.DecodeStack.prepare(w, rope_cos, rope_sin, heads)
    with warnings.catch_warnings():
        warnings.simplefilter("error", nki.NkiWarning)
        token, logits = nki.simulate(nki_kernels.transformer_step_kernel)(tokens, pos, seed, *stack, heads,
                                                                          kv_heads, 1e-5)
    _close(logits, expected, dtype)
    assert token.dtype == torch.int64 and token.reshape(-1).tolist() == logits.argmax(-1).tolist()
    assert seed.tolist() == [7, 42]
    for got, want in zip((*w.k_caches, *w.v_caches), (*ref.k_caches, *ref.v_caches)):
        _close(got, want, dtype)


def test_transformer_step_refuses_a_weight_in_pytorchs_layout():
    """A weight the kernel takes prepared, given as nn.Linear.weight ([out, in]), is an error naming the
    layout it expects."""
    w, rope_cos, rope_sin, heads, kv_heads = _decode_weights(torch.float32, n_layers=1)
    stack = nki_kernels.DecodeStack.prepare(w, rope_cos, rope_sin, heads)
    stack = stack._replace(gates=list(w.gates))
    with pytest.raises(ValueError, match=r"gates\[0\] must be \[P, dim / P, intermediate\]"):
        nki.simulate(nki_kernels.transformer_step_kernel)(torch.tensor([[5], [6]]), torch.tensor([3]),
                                                          torch.tensor([0, 0]), *stack, heads, kv_heads, 1e-5)


@pytest.mark.parametrize("kernel, make", [
    ("mlp_kernel", lambda: (torch.randn(3, 200), _weight(300, 200, torch.float32), _weight(300, 200, torch.float32),
                            _weight(200, 300, torch.float32))),
    ("qkv_kernel", lambda: (torch.randn(1, 5, 200), torch.randn(200), _weight(64, 200, torch.float32),
                            _weight(32, 200, torch.float32), _weight(32, 200, torch.float32), torch.randn(5, 16),
                            torch.randn(5, 16), 4, 2, 1e-5))])
def test_kernels_refuse_weights_in_pytorchs_layout(kernel, make):
    """mlp_kernel / qkv_kernel take weights laid out once ([P, K / P, N]); nn.Linear.weight's [out, in] is an
    error naming the layout, before any instruction runs."""
    with pytest.raises(ValueError, match=rf"{kernel}: \w+ must be \[P, dim / P, \w+"):
        nki.simulate(getattr(nki_kernels, kernel))(*make())


def test_prepared_lays_a_weight_out_once_and_again_after_a_write():
    """The ops take nn.Linear.weight and lay it out on its first call: a second call reuses the same copy (no
    transpose at launch), an in-place write (an optimizer step, load_state_dict) makes a fresh one."""
    w = torch.nn.Linear(200, 3, bias=False).weight
    first = nki_kernels.prepared(w)
    assert torch.equal(first, nki_kernels.tiled(w)) and nki_kernels.prepared(w) is first
    with torch.no_grad():
        w.mul_(2)
    again = nki_kernels.prepared(w)
    assert again is not first and torch.equal(again, nki_kernels.tiled(w))


def test_made_once_is_made_again_only_after_a_weight_changes():
    """made_once (the step kernel's prepared stack, asked for at every decode step) returns the last value while the
    weights are the same tensors, unwritten, and the held caches the same objects, whatever was written into them;
    a weight written in place, given new memory (.data), or replaced, and a cache replaced, make it again; the entry
    goes with its tensors."""
    import gc

    from nativelab.kernels.nki import layouts

    w, cache, made = torch.nn.Parameter(torch.randn(4, 4)), torch.zeros(2, 4), []

    def get(weight=None, held=None):
        weight, held = weight if weight is not None else w, held if held is not None else cache
        return nki_kernels.made_once("test", [weight], [held], lambda: made.append(weight.sum().item()) or len(made))

    first = get()
    cache.add_(1.0)  # the kernel writes its caches every step: not a reason to prepare again
    assert get() == first == 1 and made == [w.sum().item()]
    with torch.no_grad():
        w.mul_(2)  # an optimizer step
    assert get() == 2 and made[-1] == w.sum().item()
    w.data = torch.ones(4, 4)  # new memory, same tensor object
    assert get() == 3 and made[-1] == 16.0
    assert get(weight=torch.nn.Parameter(torch.ones(4, 4))) == 4  # another tensor: a new model's weight
    assert get(held=torch.zeros(2, 4)) == 5  # new caches (setup_cache again)
    gc.collect()
    assert "test" not in layouts._made  # the last call's tensors died with it
    assert get() == 6 and get() == 6


def test_mlp_op_launches_no_weight_transpose():
    """The MLP op with nn.Linear weights: its launches' instructions move each weight with one plain DMA (no
    dma_transpose of a weight), equal to the reference."""
    x, g, u, d = torch.randn(2, 200), _weight(300, 200, torch.float32), _weight(300, 200, torch.float32), \
        _weight(200, 300, torch.float32)
    est = nki_kernels.mlp_kernel.estimate(x, *map(nki_kernels.prepared, (g, u, d)))
    transposes = sum(e[0] == "dma_transpose" for e in est.events)
    assert transposes == -(-200 // 128)  # x.T's tiles only: the activations, never a weight
    torch.testing.assert_close(nki_kernels.mlp(x, g, u, d), reference_mlp(x, g, u, d), **TOL[torch.float32])


def test_decode_stack_tiles_put_the_contraction_on_partitions():
    """DecodeStack's layout [P, K / P, N]: element [i, k, n] is w[n, k * P + i], K padded with zeros."""
    w = torch.randn(5, 300)
    t = nki_kernels.tiled(w)
    assert t.shape == (128, 3, 5) and t.is_contiguous()
    assert torch.equal(t.permute(1, 0, 2).reshape(384, 5)[:300], w.t())
    assert not t.permute(1, 0, 2).reshape(384, 5)[300:].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_interpreted_is_torch_argmax_ties_first(dtype):
    """Over two max8 chunks (32000 logits): ties inside a chunk and across chunks give the first index."""
    torch.manual_seed(0)
    logits = torch.randn(3, 32000, dtype=dtype)
    logits[1, [5, 20000]] = 100.0
    logits[2, [30000, 30001]] = 50.0
    got = nki.simulate(nki_kernels.argmax_kernel)(logits).reshape(-1).tolist()
    assert got == logits.argmax(-1).tolist() == [got[0], 5, 30000]


@pytest.mark.slow
def test_transformer_step_on_neuron_eager_and_compiled():
    """The whole-step kernel launched on neuron tensors (compiled, one launch), eagerly and inside a graph
    compiled by the neuron backend: the reference's logits and caches."""
    dtype = torch.bfloat16
    w, rope_cos, rope_sin, heads, kv_heads = _decode_weights(dtype, n_layers=1, b=1)
    tokens, pos = torch.tensor([[5]]), torch.tensor([17])
    ref = _with_cache_copies(w)
    expected = reference_transformer_tkg_token(tokens, pos, torch.tensor([0, 0]), ref, rope_cos, rope_sin, heads,
                                               kv_heads)[:, -1]
    launch = wrap_nki(nki_kernels.transformer_step_kernel)

    def step(tokens, pos, seed, *flat):
        stack = nki_kernels.DecodeStack.unflatten(list(flat[:-2 * len(w.k_caches)]), list(flat[-2 * len(w.k_caches):]))
        return launch(tokens, pos, seed, *stack, heads, kv_heads, 1e-5)

    for run in (step, torch.compile(step, backend="neuron")):
        on = _with_cache_copies(w)
        weights, caches = nki_kernels.DecodeStack.prepare(on, rope_cos, rope_sin, heads).flat()
        dev = [t.to("neuron") for t in (tokens, pos, torch.tensor([0, 0]), *weights, *caches)]
        token, logits = run(*dev)
        _close(logits, expected, dtype)
        assert token.cpu().reshape(-1).tolist() == logits.cpu().argmax(-1).tolist()
        assert dev[2].cpu().tolist() == [0, 1]
        for got, want in zip(dev[-len(caches):], (*ref.k_caches, *ref.v_caches)):
            _close(got.cpu(), want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("top_p", [0.5, 0.9, 1.0])
def test_top_p_interpreted_draws_the_library_samplers_tokens(dtype, top_p):
    """Given the library's noise, the kernel draws what kernels/ops/sample.py draws (32000 logits: the
    probabilities over four chunks), and every token is in the nucleus a sort-based reference allows."""
    torch.manual_seed(0)
    logits = (torch.randn(3, 32000) * 3).to(dtype)
    allowed = reference_sample_mask(logits, 0.8, 0, top_p)
    for counter in range(4):
        state = torch.tensor([7, counter])
        exp_noise = -torch.log(sample_ops._uniform(state, logits.shape)).float()
        got = nki.simulate(nki_kernels.top_p_kernel)(logits, exp_noise, 0.8, top_p).reshape(-1)
        assert got.tolist() == sample_ops._sample(logits, state, 0.8, 0, top_p).tolist()
        assert allowed[torch.arange(3), got].all()


@pytest.mark.slow
def test_top_p_op_on_neuron_advances_the_seed_like_the_library_sampler():
    torch.manual_seed(0)
    logits = torch.randn(2, 1000).to("neuron")
    mine, theirs = sample_ops.seed_state(3, "neuron"), sample_ops.seed_state(3, "neuron")
    for run in (nki_kernels.sample_top_p, torch.compile(nki_kernels.sample_top_p, backend="neuron")):
        for _ in range(2):
            got = run(logits, mine, 0.8, 0.9)
            assert got.cpu().tolist() == sample_ops.sample(logits, theirs, 0.8, 0, 0.9).cpu().tolist()
            assert mine.cpu().tolist() == theirs.cpu().tolist()


def test_transformer_step_compiled_unlowered_for_two_sequences_draws_the_simulated_tokens(monkeypatch):
    """The step kernel's own compiled code (no lowering) for a batch of two: the tokens and logits nki.simulate
    gives. Writing its outputs' rows through as_strided views compiled a wrong token here (2**31 for both rows)
    while its logits were right."""
    monkeypatch.setenv("NATIVELAB_NKI_LOWER", "0")
    dtype = torch.bfloat16
    w, rope_cos, rope_sin, heads, kv_heads = _decode_weights(dtype, n_layers=1, b=2)
    tokens, pos = torch.tensor([[5], [9]]), torch.tensor([17])
    results = []
    for run in (nki.simulate(nki_kernels.transformer_step_kernel), nki_kernels.transformer_step_kernel):
        on = _with_cache_copies(w)
        weights, caches = nki_kernels.DecodeStack.prepare(on, rope_cos, rope_sin, heads).flat()
        args = [tokens.clone(), pos.clone(), torch.tensor([0, 0]), *weights, *caches]
        stack = nki_kernels.DecodeStack.unflatten(list(args[3:-len(caches)]), list(args[-len(caches):]))
        token, logits = run(args[0], args[1], args[2], *stack, heads, kv_heads, 1e-5)
        results.append((token.reshape(-1).tolist(), logits.float()))
    (want, want_logits), (got, got_logits) = results
    assert got == want == want_logits.argmax(-1).tolist() == got_logits.argmax(-1).tolist()
    torch.testing.assert_close(got_logits, want_logits, rtol=0.05, atol=0.05)  # bf16, GEMMs rounded elsewhere
