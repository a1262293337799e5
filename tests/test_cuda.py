"""CUDA: the library ops on CUDA tensors (their Triton targets, through the kernel interface) against the
references on realistic shapes, `nativelab run --device cuda` end to end, and the experimental tier's CUDA
graph decode against the same decode run eagerly. Skipped without a GPU (bench/gpu.sh runs them on one),
except the first test: `import nativelab` must work where the emulator cannot register (no C++ compiler to
build its runtime)."""

import textwrap

import pytest
import torch
import torch.nn.functional as F

from conftest import run_python

from nativelab.kernels import ops as K
from nativelab.kernels.ops.sample import _sample, seed_state
from nativelab.models.llama import Generator, Llama, Sampling

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
PROMPT = [1, 15043, 29892, 590, 1024, 338]


@pytest.mark.slow  # a fresh interpreter
def test_import_survives_an_emulator_that_cannot_register(tmp_path):
    """No C++ compiler to build the device's runtime (simulated: an empty build cache and a missing compiler):
    one warning that says so, no `neuron`, CPU / CUDA work on."""
    code = textwrap.dedent(
        """
        import warnings
        import torch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import nativelab
        print("registered", nativelab.device.is_registered())
        said = [str(w.message) for w in caught if "emulated neuron device is unavailable" in str(w.message)]
        print("warned", len(said) == 1 and "no C++ compiler" in said[0])
        from nativelab.apps import run
        r = run.main(["--device", "cpu", "--size", "tiny", "--tokens", "4", "--warmup", "0", "--greedy"])
        print("generated", r[0]["tokens"])
        try:
            run.main(["--device", "neuron", "--size", "tiny"])
        except SystemExit:
            print("refused")
        """
    )
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "NATIVELAB_EMULATE": "1",  # try, also beside a GPU
           "NATIVELAB_CPP_CACHE_DIR": str(tmp_path / "cpp"), "CXX": str(tmp_path / "no-such-c++")}
    r = run_python(code, env)
    assert r.returncode == 0, r.stderr[-3000:]
    for line in ("registered False", "warned True", "generated 4", "refused"):
        assert line in r.stdout.splitlines(), (line, r.stdout)
    assert "the emulated device is not registered" in r.stderr


class _Replay:
    """A CPU stand-in for the captured CUDA graph: a replay runs the static step once more."""

    def __init__(self, step):
        self.replay = step


@pytest.mark.parametrize("tier", ["base", pytest.param("core", marks=pytest.mark.slow)])  # core: top-p sampler
def test_the_static_decode_step_reproduces_the_decode_loop(tier):
    """What the experimental tier captures on CUDA (static token / position buffers, the next token fed back
    and recorded on the device) gives the tokens of the ordinary decode loop, run after run."""
    m = Llama.random("tiny", tier, seed=0)
    m.setup_cache()
    s = Sampling(greedy=tier == "base", seed=3)
    want = Generator(m, s).generate([10, 200, 33, 7], 10)
    g = Generator(m, s)
    g.cuda_graph, g._graph = True, _Replay(g._static_step())
    assert g.generate([10, 200, 33, 7], 10) == want
    assert g.generate([10, 200, 33, 7], 10) == want


def cuda(*shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def f32(*ts):
    return [t.float() if t is not None else None for t in ts]


def close(got, want, dtype, tol=2**-6):
    """float32 tight (TF32 off); bfloat16 within a few rounding steps of the result's size."""
    if dtype == torch.float32:
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-4, atol=1e-4)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * float(want.abs().max()))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


DT = [torch.float32, torch.bfloat16]


@gpu
@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("b,t", [(2, 37), (1, 1)])  # prefill rows; one decode row (the fused kernels)
def test_rmsnorm_rope_qkv_mlp(dtype, b, t):
    x, nw = cuda(b, t, 512, dtype=dtype), cuda(512, dtype=dtype)
    close(K.rmsnorm(x, nw), K.reference_rmsnorm(*f32(x, nw)), dtype)
    q, cos, sin = cuda(b, 8, t, 64, dtype=dtype), cuda(t, 64, dtype=dtype), cuda(t, 64, dtype=dtype)
    close(K.rope(q, cos, sin), K.reference_rope(*f32(q, cos, sin)), dtype)
    wq, wk, wv = cuda(2048, 512, dtype=dtype, scale=0.04), cuda(512, 512, dtype=dtype, scale=0.04), \
        cuda(512, 512, dtype=dtype, scale=0.04)
    for got, want in zip(K.qkv(x, nw, wq, wk, wv, cos, sin, 32, 8),
                         K.reference_qkv(*f32(x, nw, wq, wk, wv, cos, sin), 32, 8)):
        close(got, want, dtype)
    g, u, d = cuda(2048, 512, dtype=dtype, scale=0.04), cuda(2048, 512, dtype=dtype, scale=0.04), \
        cuda(512, 2048, dtype=dtype, scale=0.02)
    close(K.mlp(x, g, u, d, nw, 1e-5, True), K.reference_mlp(*f32(x, g, u, d, nw), 1e-5, True), dtype)
    close(K.mlp(x, g, u, d), K.reference_mlp(*f32(x, g, u, d)), dtype)


@gpu
@pytest.mark.parametrize("dtype", DT)
def test_attention_prefill_and_decode(dtype):
    q, k, v = cuda(2, 16, 300, 64, dtype=dtype), cuda(2, 4, 300, 64, dtype=dtype), cuda(2, 4, 300, 64, dtype=dtype)
    close(K.attention_cte(q, k, v), K.reference_attention_cte(*f32(q, k, v)), dtype)
    kc, vc = cuda(2, 4, 512, 64, dtype=dtype), cuda(2, 4, 512, 64, dtype=dtype)
    qn, kn, vn = cuda(2, 16, 1, 64, dtype=dtype), cuda(2, 4, 1, 64, dtype=dtype), cuda(2, 4, 1, 64, dtype=dtype)
    pos = torch.tensor([300], device="cuda")
    kr, vr = kc.float(), vc.float()
    want = K.reference_attention_tkg(*f32(qn, kn, vn), kr, vr, pos)
    close(K.attention_tkg(qn, kn, vn, kc, vc, pos), want, dtype)
    assert torch.equal(kc.float(), kr) and torch.equal(vc.float(), vr)


def _small(tier: str, dtype=torch.float32) -> Llama:
    m = Llama.random("small", tier, seed=0).to(dtype).eval().to("cuda")
    m.setup_cache()
    return m


@gpu
def test_transformer_tkg_small_model():
    m = _small("experimental")
    w = m.decode_weights()
    pos = torch.tensor([40], device="cuda")
    x = m.embed_tokens(torch.tensor([[7]], device="cuda"))
    rows = (x, pos, m.rope_cos[pos], m.rope_sin[pos])
    ref_w = w._replace(k_caches=[c.clone() for c in w.k_caches], v_caches=[c.clone() for c in w.v_caches])
    with torch.inference_mode():
        got = K.transformer_tkg(*rows, *w.flat(), 8, 8, 1e-5)
        want = K.reference_transformer_tkg(*rows, ref_w, 8, 8, 1e-5)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


@gpu
@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0), (0.8, 0, 0.9), (0.7, 50, 0.95)])
def test_sample_matches_the_cpu_kernel_over_32000(temperature, top_k, top_p):
    logits = torch.randn(2, 32000, device="cuda") * 4
    st = seed_state(3, "cuda")
    allowed = K.reference_sample_mask(logits.cpu(), max(temperature, 1e-6), top_k, top_p)
    for step in range(5):
        got = K.sample(logits, st, temperature, top_k, top_p).cpu()
        assert got.tolist() == _sample(logits.cpu(), torch.tensor([3, step]), temperature, top_k, top_p).tolist()
        assert allowed.gather(1, got.view(-1, 1)).all()
    assert st.tolist() == [3, 5]


@gpu
@pytest.mark.parametrize("dtype", DT)
def test_cross_entropy_and_linear_cross_entropy_with_backward(dtype):
    logits = cuda(64, 32000, dtype=dtype, scale=2.0).requires_grad_()
    target = torch.randint(0, 32000, (64,), device="cuda").to(torch.int32)
    target[5] = -100
    ref_in = logits.detach().float().requires_grad_()
    loss, want = K.cross_entropy(logits, target), F.cross_entropy(ref_in, target.long())
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-4)
    loss.backward()
    want.backward()
    close(logits.grad, ref_in.grad, dtype)
    h, w = cuda(128, 512, dtype=dtype).requires_grad_(), cuda(32000, 512, dtype=dtype, scale=0.05).requires_grad_()
    hr, wr = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    t = torch.randint(0, 32000, (128,), device="cuda")
    loss, want = K.linear_cross_entropy(h, w, t), K.reference_linear_cross_entropy(hr, wr, t)
    torch.testing.assert_close(loss, want, rtol=2e-3 if dtype == torch.bfloat16 else 1e-4, atol=1e-3)
    loss.backward()
    want.backward()
    close(h.grad, hr.grad, dtype, tol=2**-5)
    close(w.grad, wr.grad, dtype, tol=2**-5)


@gpu
@pytest.mark.parametrize("greedy", [True, False])
def test_cuda_graph_decode_equals_eager_decode(greedy):
    s = Sampling(greedy=greedy, temperature=0.8, top_p=0.9, seed=5)
    eager = Generator(_small("experimental"), s, cuda_graph=False).generate(PROMPT, 24)
    g = Generator(_small("experimental"), s)
    assert g.cuda_graph  # the default for the experimental tier on CUDA
    assert g.generate(PROMPT, 24) == eager
    assert g.generate(PROMPT, 24) == eager  # replays again from the start: cache, position, counter reset


@gpu
def test_tiers_on_cuda_match_the_cpu_model_float32():
    """Greedy float32: every tier on CUDA says what the plain PyTorch model says on the CPU."""
    cpu = Llama.random("small", "base", seed=0).eval()
    cpu.setup_cache()
    want = Generator(cpu, Sampling()).generate(PROMPT, 16)
    for tier in ("base", "core", "experimental"):
        assert Generator(_small(tier), Sampling()).generate(PROMPT, 16) == want, tier


@gpu
def test_run_cuda_end_to_end(tmp_path):
    out = tmp_path / "r.json"
    r = run_python(
        "import sys; from nativelab.cli import main; "
        "sys.exit(main(['run', '--model', 'all', '--device', 'cuda', '--greedy', '--tokens', '12', '--warmup', "
        f"'1', '--dtype', 'float32', '--json', {str(out)!r}]))",
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Decode  : one CUDA graph replay per token" in r.stdout
    assert "Tokens: every tier gives the same 12 tokens" in r.stdout
    import json

    results = json.loads(out.read_text())
    assert [x["device"] for x in results] == ["cuda"] * 3 and all(x["tokens"] == 12 for x in results)
