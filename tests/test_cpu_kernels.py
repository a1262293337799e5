"""The hand-written CPU decode kernels (kernels/cpu/csrc/decode.cpp) against their PyTorch references, for every
vector-ISA build this machine can run (AVX-512, AVX2, the portable default), fp32 and bf16, odd sizes, GQA."""

import importlib

import pytest
import torch

from nativelab.device import cpu_info
from nativelab.kernels import ops as K
from nativelab.kernels.cpu import build, decode
from nativelab.kernels.ops.attention import reference_attention_tkg
from nativelab.kernels.ops.decode_weights import DecodeWeights
from nativelab.kernels.ops.mlp import reference_mlp
from nativelab.kernels.ops.qkv import reference_qkv
from nativelab.kernels.ops.sample import _race, _sample, _uniform, reference_sample_mask
from nativelab.kernels.ops.transformer import reference_transformer_tkg

pytestmark = pytest.mark.slow  # builds the C++ extension once per ISA (cached on disk afterwards)


def _runnable_isas():
    flags = cpu_info._cpuinfo()[1]
    out = ["DEFAULT"]
    if {"avx2", "fma", "f16c"} <= flags:
        out.append("AVX2")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        out.append("AVX512")
    return out


@pytest.fixture(params=_runnable_isas())
def ext(request):
    mod = build.extension(request.param)
    if mod is None:
        pytest.skip("no C++ toolchain")
    assert mod.isa() == request.param
    return mod


TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# k: whole 64-byte lines of a row, a leftover vector (61, 48: 16 bf16 on AVX2, 32 on AVX-512), a scalar tail
@pytest.mark.parametrize("n,k", [(37, 133), (1, 7), (513, 64), (96, 2048), (21, 61), (10, 48)])
def test_matvec(ext, dtype, n, k):
    torch.manual_seed(n * k)
    w, h = torch.randn(n, k).to(dtype), torch.randn(k).to(dtype)
    out = torch.empty(n, dtype=dtype)
    ext.matvec_out(w, h, out)
    ref = (w.float() @ h.float()).to(dtype)  # exact products, fp32 accumulation, rounded once
    torch.testing.assert_close(out, ref, **TOL[dtype])


@pytest.mark.parametrize("n,k", [(37, 133), (21, 61), (10, 48), (96, 2048)])
def test_bf16_matvec_sums_the_exact_products(ext, n, k):
    """bf16 rows are widened by bit operations on pairs of weights (the even and odd columns apart) against a
    reordered copy of h: each output must still be the sum of the exact products w[r, c] * h[c], rounded once
    to bf16 (within one bf16 rounding of the float64 sum), with an fp32 h that bf16 cannot hold."""
    torch.manual_seed(k)
    w, h = torch.randn(n, k).to(torch.bfloat16), torch.randn(k)
    out = torch.empty(n, dtype=torch.bfloat16)
    ext.matvec_out(w, h, out)
    ref = w.double() @ h.double()
    torch.testing.assert_close(out.double(), ref, rtol=2**-8, atol=1e-4)


def _decoder(dtype, n_layers=2, dim=72, n_heads=6, n_kv=2, ffn=100, vocab=131, seq=16):
    torch.manual_seed(0)
    d = dim // n_heads
    r = lambda *s: (torch.randn(*s) * s[-1] ** -0.5).to(dtype)  # noqa: E731
    layers = dict(
        input_norms=[1 + 0.1 * r(dim) for _ in range(n_layers)], wqs=[r(n_heads * d, dim) for _ in range(n_layers)],
        wks=[r(n_kv * d, dim) for _ in range(n_layers)], wvs=[r(n_kv * d, dim) for _ in range(n_layers)],
        wos=[r(dim, n_heads * d) for _ in range(n_layers)], post_norms=[1 + 0.1 * r(dim) for _ in range(n_layers)],
        gates=[r(ffn, dim) for _ in range(n_layers)], ups=[r(ffn, dim) for _ in range(n_layers)],
        downs=[r(dim, ffn) for _ in range(n_layers)],
        k_caches=[torch.randn(1, n_kv, seq, d).to(dtype) for _ in range(n_layers)],
        v_caches=[torch.randn(1, n_kv, seq, d).to(dtype) for _ in range(n_layers)],
    )
    angles = torch.randn(1, d // 2)
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    out = dict(x=torch.randn(1, 1, dim).to(dtype), cos=cos, sin=sin, **layers, final_norm=1 + 0.1 * r(dim),
               lm_head=r(vocab, dim), n_heads=n_heads, n_kv_heads=n_kv)
    return dict(out, embed=r(vocab, dim))


def _weights(a, caches_from=None, embed=None) -> DecodeWeights:
    """_decoder's tensors by name (its caches, or those of `caches_from`; its embedding, or `embed`)."""
    c = caches_from or a
    return DecodeWeights(**{f: c[f] if f in ("k_caches", "v_caches") else a[f] for f in DecodeWeights._fields}
                         | ({} if embed is None else {"embed": embed}))


def _args(a, pos, caches_from=None):
    """transformer_tkg's arguments (and the C++ transformer_decode's, with the weights named)."""
    return (a["x"], pos, a["cos"], a["sin"], *_weights(a, caches_from).flat(), a["n_heads"], a["n_kv_heads"], 1e-5)


def _ref_args(a, pos, caches_from=None):
    """reference_transformer_tkg's."""
    return (a["x"], pos, a["cos"], a["sin"], _weights(a, caches_from), a["n_heads"], a["n_kv_heads"], 1e-5)


def _ext_args(a, pos, caches_from=None):
    """The C++ transformer_decode's."""
    return (a["x"], pos, a["cos"], a["sin"], _weights(a, caches_from).named(), a["n_heads"], a["n_kv_heads"], 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pos_value,pos_dtype", [(0, torch.int64), (9, torch.int32), (15, torch.int64)])
def test_transformer_decode_step(ext, dtype, pos_value, pos_dtype):
    a = _decoder(dtype)
    pos = torch.tensor([pos_value], dtype=pos_dtype)
    ours = {k: [t.clone() for t in a[k]] for k in ("k_caches", "v_caches")}
    out = torch.empty(1, 1, a["lm_head"].shape[0], dtype=dtype)
    ext.transformer_decode(*_ext_args(a, pos, ours), out)
    # reference: the same step in fp32 on the upcast inputs (bf16 storage rounding aside, the exact computation)
    f = {k: ([t.float() for t in v] if isinstance(v, list) else v.float() if isinstance(v, torch.Tensor) else v)
         for k, v in a.items()}
    ref = reference_transformer_tkg(*_ref_args(f, pos.long()))
    scale = ref.abs().max().item()
    tol = 1e-4 if dtype == torch.float32 else 4e-2
    assert (out.float() - ref).abs().max().item() <= tol * max(scale, 1.0)
    for k in ("k_caches", "v_caches"):
        for mine, theirs in zip(ours[k], f[k]):
            torch.testing.assert_close(mine.float(), theirs, **TOL[dtype])  # the new position written, the rest kept


def _f32(t):
    return t.float()


def _close(got, ref, dtype):
    """Within the dtype's rounding of the largest value (the reference is the exact fp32 computation)."""
    tol = 1e-4 if dtype == torch.float32 else 4e-2
    assert (got.float() - ref).abs().max().item() <= tol * max(ref.abs().max().item(), 1.0)


# The core tier's one-token kernels, odd sizes and grouped-query attention (6 query heads over 2 KV heads).
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qkv_decode(ext, dtype):
    a = _decoder(dtype)
    n_heads, n_kv = a["n_heads"], a["n_kv_heads"]
    d = a["wqs"][0].shape[0] // n_heads
    q, k, v = (torch.empty(1, n, 1, d, dtype=dtype) for n in (n_heads, n_kv, n_kv))
    args = (a["x"], a["input_norms"][0], a["wqs"][0], a["wks"][0], a["wvs"][0], a["cos"], a["sin"])
    ext.qkv_decode(*args, n_heads, n_kv, 1e-5, q, k, v)
    refs = reference_qkv(*map(_f32, args), n_heads, n_kv, 1e-5)
    for got, ref in zip((q, k, v), refs):
        _close(got, ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pos_value", [0, 7, 15])
def test_attention_decode(ext, dtype, pos_value):
    a = _decoder(dtype)
    n_heads, n_kv = a["n_heads"], a["n_kv_heads"]
    d = a["wqs"][0].shape[0] // n_heads
    torch.manual_seed(pos_value)
    q, k, v = (torch.randn(1, n, 1, d).to(dtype) for n in (n_heads, n_kv, n_kv))
    kc, vc = a["k_caches"][0].clone(), a["v_caches"][0].clone()
    ref_kc, ref_vc = kc.float(), vc.float()
    pos = torch.tensor([pos_value])
    out = torch.empty(1, n_heads, 1, d, dtype=dtype)
    ext.attention_decode(q, k, v, kc, vc, pos, out)
    ref = reference_attention_tkg(q.float(), k.float(), v.float(), ref_kc, ref_vc, pos)
    _close(out, ref, dtype)
    torch.testing.assert_close(kc.float(), ref_kc, **TOL[dtype])  # the new position written, the rest kept
    torch.testing.assert_close(vc.float(), ref_vc, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("residual", [False, True])
def test_mlp_decode(ext, dtype, residual):
    a = _decoder(dtype)
    args = (a["x"], a["gates"][1], a["ups"][1], a["downs"][1], a["post_norms"][1])
    out = torch.empty_like(a["x"])
    ext.mlp_decode(*args, 1e-5, residual, out)
    _close(out, reference_mlp(*map(_f32, args), 1e-5, residual), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("residual", [False, True])
def test_mlp_decode_without_norm(ext, dtype, residual):
    """The core tier's MLP (Lab 2's nki_mlp: the block normalizes first): no norm weight, h = x."""
    a = _decoder(dtype)
    args = (a["x"], a["gates"][1], a["ups"][1], a["downs"][1])
    out = torch.empty_like(a["x"])
    ext.mlp_decode(*args, None, 0.0, residual, out)
    _close(out, reference_mlp(*map(_f32, args), None, 0.0, residual), dtype)


def test_bad_input_is_a_clear_error(ext):
    a = _decoder(torch.float32)
    out = torch.empty(1, 1, a["lm_head"].shape[0])
    with pytest.raises(RuntimeError, match="pos beyond the cache"):
        ext.transformer_decode(*_ext_args(a, torch.tensor([99])), out)


def test_the_kernel_interface_runs_the_host_kernel_on_the_device(monkeypatch):
    """transformer_tkg on device tensors goes to the hand-written kernel (batch 1, one token) and agrees with
    the traced path it replaces."""
    if build.extension() is None:
        pytest.skip("no C++ toolchain")
    monkeypatch.setenv("NATIVELAB_CPU_KERNELS", "1")
    a = _decoder(torch.float32)
    calls = []
    real = decode.transformer_tkg

    def spy(*args):
        calls.append(1)
        real(*args)

    spy.accepts = decode.transformer_tkg.accepts
    kernel = K.transformer.transformer_tkg_kernel
    monkeypatch.setitem(kernel.targets, "host", spy)
    dev = {k: ([t.to("neuron") for t in v] if isinstance(v, list) else v.to("neuron")
               if isinstance(v, torch.Tensor) else v) for k, v in a.items()}
    pos = torch.tensor([4])
    with torch.no_grad():
        got = K.transformer_tkg(*_args(dev, pos.to("neuron"))).cpu()
        ref = reference_transformer_tkg(*_ref_args(a, pos))
    assert calls == [1]
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dev["k_caches"][1].cpu(), a["k_caches"][1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["qkv", "attention_tkg", "mlp", "mlp_no_norm"])
def test_the_core_kernels_run_their_host_code_on_the_device(monkeypatch, name):
    """The core tier's kernels on one token of device tensors go to their hand-written code and agree with the
    traced path (the reference)."""
    if build.extension() is None:
        pytest.skip("no C++ toolchain")
    monkeypatch.setenv("NATIVELAB_CPU_KERNELS", "1")
    a = _decoder(torch.float32)
    d = a["wqs"][0].shape[0] // a["n_heads"]
    module_name, kernel_name = {"attention_tkg": ("attention", "attention_tkg_kernel"),
                                "mlp_no_norm": ("mlp", "mlp_kernel_no_norm")}.get(name, (name, f"{name}_kernel"))
    module = importlib.import_module(f"nativelab.kernels.ops.{module_name}")
    kernel = getattr(module, kernel_name)
    calls = []
    real = getattr(decode, name)

    def spy(*args):
        calls.append(1)
        real(*args)

    spy.accepts = real.accepts
    monkeypatch.setitem(kernel.targets, "host", spy)
    dev = lambda t: t.to("neuron")  # noqa: E731
    pos = torch.tensor([5])
    with torch.no_grad():
        if name == "qkv":
            args = (a["x"], a["input_norms"][0], a["wqs"][0], a["wks"][0], a["wvs"][0], a["cos"], a["sin"])
            got = K.qkv(*map(dev, args), a["n_heads"], a["n_kv_heads"], 1e-5)
            ref = reference_qkv(*args, a["n_heads"], a["n_kv_heads"], 1e-5)
        elif name == "attention_tkg":
            q, k, v = (torch.randn(1, n, 1, d) for n in (a["n_heads"], a["n_kv_heads"], a["n_kv_heads"]))
            kc, vc = a["k_caches"][0], a["v_caches"][0]
            got = K.attention_tkg(dev(q), dev(k), dev(v), dev(kc), dev(vc), dev(pos))
            ref = reference_attention_tkg(q, k, v, kc.clone(), vc.clone(), pos)
        elif name == "mlp":
            args = (a["x"], a["gates"][0], a["ups"][0], a["downs"][0])
            got = K.mlp(*map(dev, args), dev(a["post_norms"][0]), 1e-5, True)
            ref = reference_mlp(*args, a["post_norms"][0], 1e-5, True)
        else:  # Lab 2's core tier: the block normalizes, nki_mlp gets h
            args = (a["x"], a["gates"][0], a["ups"][0], a["downs"][0])
            got = K.mlp(*map(dev, args))
            ref = reference_mlp(*args)
        got = [t.cpu() for t in got] if isinstance(got, (tuple, list)) else got.cpu()
    assert calls == [1]
    torch.testing.assert_close(got, ref if not isinstance(ref, tuple) else list(ref), rtol=1e-4, atol=1e-4)


def _plan_args(a, vocab_table_dtype=None):
    """The DecodePlan's bound arguments for _decoder's weights: DecodeWeights (an embedding table drawn here),
    and the rest: RoPE tables of 16 rows, the heads, eps."""
    torch.manual_seed(1)
    dtype = a["x"].dtype
    d = a["wqs"][0].shape[0] // a["n_heads"]
    embed = torch.randn(a["lm_head"].shape[0], a["x"].shape[-1]).to(dtype)
    angles = torch.randn(16, d // 2)
    table = vocab_table_dtype or dtype
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(table), torch.cat([angles.sin()] * 2, -1).to(table)
    return _weights(a, embed=embed), (cos, sin, a["n_heads"], a["n_kv_heads"], 1e-5)


@pytest.mark.parametrize("dtype,table", [(torch.float32, None), (torch.bfloat16, None),
                                         (torch.bfloat16, torch.float32)])
def test_decode_plan_is_the_step_from_token_ids(ext, dtype, table):
    """A bound DecodePlan: embedding row + the RoPE rows of its position + the whole step = the reference, its
    greedy token is the logits' argmax, the sampler's counter advances once per greedy step, and it writes
    the caches it was bound to."""
    a = _decoder(dtype)
    w, rest = _plan_args(a, table)
    ref_w = w._replace(k_caches=[t.clone() for t in w.k_caches], v_caches=[t.clone() for t in w.v_caches])
    plan = ext.DecodePlan(w.named(), *rest)
    logits = torch.empty(1, 1, a["lm_head"].shape[0], dtype=dtype)
    out, seed = torch.empty(1, dtype=torch.int64), torch.tensor([7, 3])
    for p, tok in ((5, 17), (6, 130)):
        plan.greedy(torch.tensor([[tok]]), torch.tensor([p]), seed, logits, out)
        ref = K.reference_transformer_tkg_token(torch.tensor([[tok]]), torch.tensor([p]), seed, ref_w, *rest)
        scale = ref.abs().max().item()
        tol = 1e-4 if dtype == torch.float32 else 4e-2
        assert (logits.float() - ref.float()).abs().max().item() <= tol * max(scale, 1.0)
        assert out.item() == logits.float().argmax().item()
    assert seed.tolist() == [7, 5]
    for mine, theirs in zip(w.k_caches + w.v_caches, ref_w.k_caches + ref_w.v_caches):
        torch.testing.assert_close(mine.float(), theirs.float(), **TOL[dtype])
    # the draw: the step's logits and `sample`'s token from them, the counter advancing once
    for p, tok, setting in ((7, 3, (0.8, 0, 0.9)), (8, 64, (1.1, 5, 1.0))):
        state_before = seed.clone()
        plan.draw(torch.tensor([[tok]]), torch.tensor([p]), seed, logits, out, *setting)
        assert out.item() == _sample(logits[:, -1].float(), state_before, *setting).item()
        assert seed.tolist() == [7, state_before[1].item() + 1]
    with pytest.raises(RuntimeError, match="token id out of the vocabulary"):
        plan.step(torch.tensor([[131]]), torch.tensor([1]), logits)
    with pytest.raises(RuntimeError, match="pos beyond the cache"):
        plan.step(torch.tensor([[1]]), torch.tensor([16]), logits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_tok,start", [(1, 4), (2, 0), (7, 3), (5, 11)])  # (5, 11): ends at the cache's last row
def test_decode_plan_prefills_a_prompt(ext, dtype, n_tok, start):
    """A bound DecodePlan given T tokens at consecutive positions (a prompt's prefill, each weight read once for
    all of them): every token's cache rows equal the reference's, the logits are the last token's, its greedy
    token their argmax, the counter advances once; bad positions are clear errors."""
    a = _decoder(dtype)
    w, rest = _plan_args(a)
    ref_w = w._replace(k_caches=[t.clone() for t in w.k_caches], v_caches=[t.clone() for t in w.v_caches])
    plan = ext.DecodePlan(w.named(), *rest)
    vocab = a["lm_head"].shape[0]
    logits = torch.empty(1, 1, vocab, dtype=dtype)
    out, seed = torch.empty(1, dtype=torch.int64), torch.tensor([7, 3])
    tokens = torch.randint(0, vocab, (1, n_tok), generator=torch.Generator().manual_seed(n_tok))
    pos = torch.arange(start, start + n_tok, dtype=torch.int32)
    plan.greedy(tokens, pos, seed, logits, out)
    ref = K.reference_transformer_tkg_token(tokens, pos.long(), seed, ref_w, *rest)[:, -1:]
    tol = 1e-4 if dtype == torch.float32 else 4e-2
    assert (logits.float() - ref.float()).abs().max().item() <= tol * max(ref.abs().max().item(), 1.0)
    assert out.item() == logits.float().argmax().item()
    assert seed.tolist() == [7, 4]
    for mine, theirs in zip(w.k_caches + w.v_caches, ref_w.k_caches + ref_w.v_caches):
        torch.testing.assert_close(mine.float(), theirs.float(), **TOL[dtype])
    with pytest.raises(RuntimeError, match="consecutive"):
        plan.step(torch.tensor([[1, 2, 3]]), torch.tensor([4, 5, 7]), logits)
    with pytest.raises(RuntimeError, match="pos beyond the cache"):
        plan.step(torch.tensor([[1, 2, 3]]), torch.tensor([14, 15, 16]), logits)
    with pytest.raises(RuntimeError, match="one position per token"):
        plan.step(torch.tensor([[1, 2, 3]]), torch.tensor([4, 5]), logits)


# (temperature, top_k, top_p): top-p only, top-k only, both, a top-k of one, neither, greedy
_SETTINGS = [(0.8, 0, 0.9), (1.3, 0, 0.5), (0.7, 40, 1.0), (0.7, 40, 0.9), (1.0, 1, 1.0), (1.0, 0, 1.0), (0.0, 0, 1.0)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab,spread", [(32000, 1.0), (32000, 8.0), (32000, 0.05), (131, 2.0)])
def test_the_draw_is_the_samplers_draw(ext, dtype, vocab, spread):
    """The C++ draw (sample_out, DecodePlan.draw's) = `sample`'s draw in plain PyTorch (`_sample`) on the same
    logits and [seed, counter], for near-uniform, ordinary and widely spread logits, a vocabulary that is no
    multiple of the vector width, every setting; the token is one a sort-based top-k / top-p sampler allows,
    and the counter advances once per draw."""
    torch.manual_seed(vocab + int(spread * 10))
    for row in range(3):
        logits = (torch.randn(1, vocab) * spread).to(dtype)
        for temperature, top_k, top_p in _SETTINGS:
            for seed, counter in ((row, 0), (7 + row, 12345), (-3, 2 ** 40 + row)):
                state = torch.tensor([seed, counter])
                out = torch.empty(1, dtype=torch.int64)
                ext.sample_out(logits, state, temperature, top_k, top_p, out)
                want = _sample(logits.float(), torch.tensor([seed, counter]), temperature, top_k, top_p)
                assert out.item() == want.item(), (temperature, top_k, top_p, seed, counter)
                assert state.tolist() == [seed, counter + 1]
                if temperature > 0:
                    assert reference_sample_mask(logits.float(), temperature, top_k, top_p)[0, out.item()]


def test_the_draw_is_the_traced_sample_kernel(ext):
    """Against the compiled `sample` kernel itself (Inductor's code, whose sums run in another order): the same
    tokens over 40 draws of each setting (seeded runs of the one-kernel step and of `sample` agree)."""
    torch.manual_seed(0)
    logits = torch.randn(1, 32000) * 2
    for temperature, top_k, top_p in ((0.8, 0, 0.9), (0.7, 40, 0.9)):
        mine, theirs = torch.tensor([5, 0]), torch.tensor([5, 0])
        out = torch.empty(1, dtype=torch.int64)
        for _ in range(40):
            ext.sample_out(logits, mine, temperature, top_k, top_p, out)
            assert out.item() == K.sample(logits, theirs, temperature, top_k, top_p).item()
        assert mine.tolist() == theirs.tolist() == [5, 40]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_race_given_its_noise_is_the_samplers(ext, dtype):
    """race_out (the NKI top-p kernel's lowering) = `_race` in plain PyTorch on the same logits and noise, row by
    row, every sampling setting, a vocabulary that is no multiple of the vector width."""
    torch.manual_seed(1)
    logits = (torch.randn(3, 1001) * 2).to(dtype)
    for temperature, top_k, top_p in [s for s in _SETTINGS if s[0] > 0]:
        for counter in range(3):
            noise = -torch.log(_uniform(torch.tensor([9, counter]), logits.shape)).float()
            out = torch.empty(3, 1, dtype=torch.int32)
            ext.race_out(logits, noise, temperature, top_k, top_p, out)
            want = _race(logits, noise, temperature, top_k, top_p)
            assert out.reshape(-1).tolist() == want.tolist(), (temperature, top_k, top_p, counter)


def test_the_draw_rejects_bad_settings(ext):
    out, state = torch.empty(1, dtype=torch.int64), torch.tensor([0, 0])
    with pytest.raises(RuntimeError, match="top_p"):
        ext.sample_out(torch.randn(1, 10), state, 1.0, 0, 1.5, out)
    with pytest.raises(RuntimeError, match="seed_state"):
        ext.sample_out(torch.randn(1, 10), torch.tensor([0, 0, 0]), 1.0, 0, 0.9, out)


def test_the_token_step_binds_its_weights_once(monkeypatch):
    """transformer_tkg_token on device tensors: the kernel interface makes one plan per set of weights (not per
    step), binds again when a weight is re-pointed, agrees with the traced path, and a greedy token equals
    the argmax of the logits the traced path gives."""
    if build.extension() is None:
        pytest.skip("no C++ toolchain")
    monkeypatch.setenv("NATIVELAB_CPU_KERNELS", "1")
    a = _decoder(torch.float32)
    kernel = K.transformer.transformer_tkg_token_kernel
    binds = []
    real = decode.transformer_tkg_token.bind
    monkeypatch.setattr(decode.transformer_tkg_token, "bind", lambda *x: binds.append(1) or real(*x))
    kernel._bound.clear()

    def dev(v):
        return [t.to("neuron") for t in v] if isinstance(v, list) else v.to("neuron") if isinstance(v, torch.Tensor) \
            else v

    w, rest = _plan_args(a)
    w, rest = DecodeWeights(*map(dev, w)), [dev(v) for v in rest]
    seed = torch.tensor([0, 0]).to("neuron")

    def step(tok, p, temperature=0.0, top_k=0):
        return K.transformer_tkg_token(torch.tensor([[tok]]).to("neuron"), torch.tensor([p]).to("neuron"), seed,
                                       *w.flat(), *rest, temperature, top_k, 0.9)

    def steps():  # greedy, top-p, top-k + top-p: the host plan draws in the step's own launch
        return [step(3, 0).item(), step(9, 1).item(), step(4, 2, 0.8).item(), step(6, 3, 1.2, 7).item()]

    with torch.no_grad():
        got = steps()
        assert binds == [1]
        w.wqs[0].data = w.wqs[0].clone()  # re-pointed: bind again
        step(5, 4)
        assert binds == [1, 1]
        with build.host_kernels(False):  # the traced path, from fresh caches
            for c in (*w.k_caches, *w.v_caches):
                c.zero_()
            seed.zero_()
            traced = steps()
    assert got == traced and seed.cpu().tolist() == [0, 4]


def test_the_token_step_takes_a_whole_prompt(monkeypatch):
    """transformer_tkg_token with a prompt (1, T) on device tensors: the bound plan's prefill and the traced
    path draw the same first token (greedy and top-p) and leave the same caches, the decode step after it
    agrees too; positions that do not match the tokens are a clear error."""
    if build.extension() is None:
        pytest.skip("no C++ toolchain")
    a = _decoder(torch.float32)
    w, rest = _plan_args(a)
    dev = lambda v: v.to("neuron") if isinstance(v, torch.Tensor) else [t.to("neuron") for t in v]  # noqa: E731
    w, rest = DecodeWeights(*map(dev, w)), [dev(v) if isinstance(v, torch.Tensor) else v for v in rest]
    seed = torch.tensor([0, 0]).to("neuron")

    def step(toks, start, temperature):
        pos = torch.arange(start, start + len(toks)).to("neuron")
        return K.transformer_tkg_token(torch.tensor([toks]).to("neuron"), pos, seed, *w.flat(), *rest, temperature,
                                       0, 0.9).item()

    runs = []
    with torch.no_grad():
        for on in (True, False):
            with build.host_kernels(on):
                for c in (*w.k_caches, *w.v_caches):
                    c.zero_()
                seed.zero_()
                runs.append(([step([3, 9, 4, 7, 1], 0, 0.0), step([2, 8], 5, 0.8), step([6], 7, 0.0)],
                             [c.cpu().clone() for c in (*w.k_caches, *w.v_caches)]))
        with pytest.raises(ValueError, match=r"pos: expected one position per token, shape \(2,\)"):
            K.transformer_tkg_token(torch.tensor([[1, 2]]).to("neuron"), torch.tensor([0]).to("neuron"), seed,
                                    *w.flat(), *rest, 0.0, 0, 0.9)
    (host, host_caches), (traced, traced_caches) = runs
    assert host == traced
    for mine, theirs in zip(host_caches, traced_caches):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("greedy", [True, False])
def test_the_compiled_experimental_tier_agrees_with_its_traced_kernel(greedy):
    """The compiled experimental tier in inference mode (its one-kernel step runs while the queue drains, on
    host views made there: inference tensors) gives the same tokens with the hand-written kernel and with the
    traced one (NATIVELAB_CPU_KERNELS=0, the RoPE tables are inputs there, not baked): greedy, the base tier's;
    top-p, the host plan's draw in its step's launch and the traced `_sample` in the traced step's."""
    from nativelab.models.llama import Generator, Llama, Sampling

    src = Llama.random("tiny")
    sampling = Sampling(greedy=greedy, temperature=0.8, top_p=0.9, seed=3)
    got = []
    for on in (True, False):
        with build.host_kernels(on):
            torch._dynamo.reset()
            g = Generator(src.copy_as("experimental", torch.float32, "neuron"), sampling).compile()
            with torch.inference_mode():
                got.append(g.generate([1, 2, 3], 6))
    if greedy:
        want = Generator(src.copy_as("base", torch.float32, "neuron"), sampling).generate([1, 2, 3], 6)
        assert got == [want, want]
    else:
        assert got[0] == got[1] and len(got[0]) == 6


def test_the_one_kernel_step_counts_its_device_traffic(monkeypatch):
    """The profiler's traffic count of the experimental tier's hand-written step (its plan's own account): a
    generated token reads at least every weight and the whole KV cache, and the prompt's launch reads the same
    weights once, not once per prompt token (formula from the model's tensors)."""
    if build.extension() is None:
        pytest.skip("no C++ toolchain")
    from nativelab.models.llama import Generator, Llama, Sampling
    from nativelab.profile import traffic_per_token

    monkeypatch.setenv("NATIVELAB_CPU_KERNELS", "1")
    model = Llama.random("tiny").copy_as("experimental", torch.float32, "neuron")
    import nki_ops  # on the path once the tier is loaded
    monkeypatch.setattr(nki_ops, "KERNELS", "cpu")  # the C++ step called directly (the NKI step takes a token a launch)
    gen = Generator(model, Sampling(greedy=True))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # the tied LM head once
    caches = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if "cache" in n)
    prompt, n = [1, 2, 3, 4, 5, 6, 7, 8], 4
    per_token = traffic_per_token(lambda: gen.generate(prompt, n))
    # n launches (the prompt's and n - 1 decode steps), each reading every weight and cache once
    assert per_token >= weights + caches
    assert per_token < 1.5 * (weights + caches)
