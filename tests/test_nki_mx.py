"""NeuronCore-v4's MX instructions (nisa.quantize_mx, nisa.nc_matmul_mx) and the packed types, traced for
trn3 (NEURON_PLATFORM_TARGET_OVERRIDE), against references written here from AWS's API pages: the E8M0 block
scale 2^(floor(log2 amax) - (Emax - 1)) per 8 partitions x 4 values, saturation, round-to-nearest-even, the
quadrant layout of the scales, fp32 accumulation; their limits as one error each, their cost from the rules."""

import inspect

import pytest
import torch

from nativelab import nki, settings
from nativelab.nki import isa as nisa
from nativelab.nki import language as nl

sim = nki.simulate
FP8 = {nl.float8_e4m3fn_x4: (torch.float8_e4m3fn, 8, 448.0), nl.float8_e5m2_x4: (torch.float8_e5m2, 15, 57344.0)}


@pytest.fixture
def trn3():
    with settings.PLATFORM_TARGET.set("trn3"):
        yield


def _line_of(fn, text):
    lines, start = inspect.getsourcelines(fn.fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _reference_quantize(x, mx_dtype):
    """(fp8 values [P, F], scale codes [P / 8, F / 4]) of x (fp32 [P, F]) as the quantize_mx page states."""
    element, emax, largest = FP8[mx_dtype]
    p, f = x.shape
    amax = x.reshape(p // 8, 8, f // 4, 4).abs().amax(dim=(1, 3)).double()
    _, e = torch.frexp(amax)  # amax = m 2^e, m in [0.5, 1): floor(log2 amax) = e - 1
    codes = torch.where(amax == 0, 0, (e - 1) - (emax - 1) + 127).clamp(0, 254)
    scale = torch.pow(2.0, codes.double() - 127).repeat_interleave(8, 0).repeat_interleave(4, 1)
    q = (x.double() / scale).clamp(-largest, largest).float().to(element)
    return q, codes.to(torch.uint8)


def _quadrant_rows(p):
    """The scale tile's partition of each group of 8 data partitions: quadrant q's in 32q .. 32q+3."""
    return [32 * (g // 4) + g % 4 for g in range(p // 8)]


@nki.jit
def _quantize(x, mx_dtype):
    p, f = x.shape
    t = nl.load(x)
    q = nl.ndarray((p, f // 4), dtype=mx_dtype, buffer=nl.sbuf)
    s = nl.ndarray((p, f // 4), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.memset(s, 0)
    nisa.quantize_mx(dst=q, src=t, dst_scale=s)
    out_q = nl.ndarray((p, f // 4), dtype=mx_dtype, buffer=nl.shared_hbm)
    out_s = nl.ndarray((p, f // 4), dtype=nl.uint8, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out_q, src=q)
    nisa.dma_copy(dst=out_s, src=s)
    return out_q, out_s


def _mixed(p, f, seed=0):
    """bf16 values whose groups span many magnitudes, one group all zero, one with a value beyond 448."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(p, f, generator=g) * torch.pow(2.0, torch.randint(-20, 20, (p // 8, 1, f // 4, 1), generator=g)
                                                    .float()).expand(p // 8, 8, f // 4, 4).reshape(p, f)
    x[:8, :4] = 0
    x[8, 4] = 1000.0
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("mx_dtype", list(FP8), ids=lambda d: d.name)
def test_quantize_mx_scales_rounds_and_places_scales_by_quadrant(trn3, mx_dtype):
    x = _mixed(64, 32)
    bits, scales = sim(_quantize)(x, mx_dtype)
    assert bits.shape == (64, 8) and bits.dtype == torch.int32 and scales.dtype == torch.uint8
    ref_q, ref_codes = _reference_quantize(x.float(), mx_dtype)
    values = bits.view(FP8[mx_dtype][0])  # four values an element, the first in the lowest byte
    assert torch.equal(values.view(torch.uint8), ref_q.view(torch.uint8))
    rows = _quadrant_rows(64)
    assert torch.equal(scales[rows], ref_codes)
    others = [r for r in range(64) if r not in rows]
    assert not scales[others].any()  # the rest of the scale tile is left alone
    assert ref_codes[0, 0] == 0  # the all-zero group: 2^-127


@nki.jit
def _matmul_offline(stationary, moving, s_scale, m_scale, mx_dtype, out_dtype):
    """Packed data and scales from HBM (uint8 / int bits viewed as the MX type), one nc_matmul_mx."""
    k = stationary.shape[0]
    m = stationary.shape[1] * stationary.dtype.itemsize // mx_dtype.itemsize  # packed elements a partition
    n = moving.shape[1] * moving.dtype.itemsize // mx_dtype.itemsize
    st = nl.ndarray((k, m), dtype=mx_dtype, buffer=nl.sbuf)
    mv = nl.ndarray((k, n), dtype=mx_dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=st, src=stationary.ap(pattern=[[m, k], [1, m]], dtype=mx_dtype))
    nisa.dma_copy(dst=mv, src=moving.ap(pattern=[[n, k], [1, n]], dtype=mx_dtype))
    ss = nl.ndarray(s_scale.shape, dtype=s_scale.dtype, buffer=nl.sbuf)
    ms = nl.ndarray(m_scale.shape, dtype=m_scale.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ss, src=s_scale)
    nisa.dma_copy(dst=ms, src=m_scale)
    acc = nl.ndarray((m, n), dtype=out_dtype, buffer=nl.psum)
    nisa.nc_matmul_mx(acc, st, mv, ss, ms)
    res = nl.ndarray((m, n), dtype=out_dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    out = nl.ndarray((m, n), dtype=out_dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def _e2m1(nibbles):
    """OCP E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit; exponent 0 is subnormal (0 or 0.5)."""
    s, e, m = (nibbles >> 3) & 1, (nibbles >> 1) & 3, nibbles & 1
    mag = torch.where(e == 0, 0.5 * m, torch.pow(2.0, (e - 1).double()) * (1 + 0.5 * m))
    return torch.where(s == 1, -mag, mag)


def _random_mx(k, f, kind, g):
    """(bits as the kernel's HBM argument, their values [k, f, 4] in float64)."""
    if kind == "fp4":
        nib = torch.randint(0, 16, (k, f, 4), generator=g)
        word = (nib << torch.tensor([0, 4, 8, 12])).sum(-1)
        bits = (word - (word >= 32768) * 65536).to(torch.int16)  # 16 bits: four nibbles, the first lowest
        return bits, _e2m1(nib)
    element = FP8[kind][0]
    v = (torch.randn(k, f, 4, generator=g) * 8).to(element)
    v = torch.where(v.float().isfinite(), v.float(), 0.0).to(element)
    return v.view(torch.uint8).reshape(k, f * 4), v.double()


def _scales(k, f, g):
    """Scale codes in the SBUF layout ([k, f]: quadrant rows used, the rest 0) and per data partition."""
    codes = torch.randint(120, 134, (k // 8, f), generator=g, dtype=torch.uint8)
    tile = torch.zeros(k, f, dtype=torch.uint8)
    tile[_quadrant_rows(k)] = codes
    return tile, torch.pow(2.0, codes.double() - 127).repeat_interleave(8, 0)


@pytest.mark.parametrize("kind,out_dtype", [(nl.float8_e4m3fn_x4, torch.float32), (nl.float8_e5m2_x4, torch.bfloat16),
                                            ("fp4", torch.float32)], ids=["e4m3-fp32", "e5m2-bf16", "fp4-fp32"])
def test_nc_matmul_mx_dequantizes_each_group_and_accumulates_in_fp32(trn3, kind, out_dtype):
    g = torch.Generator().manual_seed(1)
    k, m, n = 64, 32, 48
    mx_dtype = nl.float4_e2m1fn_x4 if kind == "fp4" else kind
    s_bits, s_vals = _random_mx(k, m, kind, g)
    m_bits, m_vals = _random_mx(k, n, kind, g)
    s_tile, s_factor = _scales(k, m, g)
    m_tile, m_factor = _scales(k, n, g)
    out = sim(_matmul_offline)(s_bits, m_bits, s_tile, m_tile.view(torch.float8_e8m0fnu), mx_dtype, out_dtype)
    sv, mv = s_vals * s_factor[:, :, None], m_vals * m_factor[:, :, None]
    ref = torch.einsum("kmj,knj->mn", sv, mv)  # exact in float64
    assert out.dtype == out_dtype
    # an fp32 sum of 4K products is within 4K * 2^-24 of the sum of their magnitudes; a bf16 dst rounds once more
    bound = torch.einsum("kmj,knj->mn", sv.abs(), mv.abs()) * (4 * k * 2.0 ** -24)
    if out_dtype == torch.bfloat16:
        bound = bound + ref.abs() * 2.0 ** -8
    assert ((out.double() - ref).abs() <= bound).all()
    assert (out.double() != 0).float().mean() > 0.9  # the values are not trivially zero


@nki.jit
def _quantize_matmul(a, b):
    """Both operands quantized on chip (a: [K, M * 4], b: [K, N * 4] bf16), then one nc_matmul_mx."""
    k, m4 = a.shape
    n4 = b.shape[1]
    ta, tb = nl.load(a), nl.load(b)
    qa = nl.ndarray((k, m4 // 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    qb = nl.ndarray((k, n4 // 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    sa = nl.ndarray((k, m4 // 4), dtype=nl.uint8, buffer=nl.sbuf)
    sb = nl.ndarray((k, n4 // 4), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=qa, src=ta, dst_scale=sa)
    nisa.quantize_mx(dst=qb, src=tb, dst_scale=sb)
    acc = nl.ndarray((m4 // 4, n4 // 4), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=acc, stationary=qa, moving=qb, stationary_scale=sa, moving_scale=sb)
    out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, nl.copy(acc))
    return out


def _quantize_matmul_reference(a, b):
    qa, ca = _reference_quantize(a.float(), nl.float8_e4m3fn_x4)
    qb, cb = _reference_quantize(b.float(), nl.float8_e4m3fn_x4)

    def dequant(q, c):  # [K, F, 4] values times their group's scale
        k, f4 = q.shape
        factor = torch.pow(2.0, c.double() - 127).repeat_interleave(8, 0)
        return q.double().reshape(k, f4 // 4, 4) * factor[:, :, None]

    return torch.einsum("kmj,knj->mn", dequant(qa, ca), dequant(qb, cb)).float()


@pytest.mark.slow  # compiles two kernels
def test_quantize_then_matmul_mx_on_cpu_and_neuron_tensors(trn3, tmp_path, monkeypatch):
    """The MX round trip interpreted on CPU tensors (two quadrants) and compiled on the device's: one value."""
    a, b = _mixed(64, 32, seed=2), _mixed(64, 64, seed=3)
    ref = _quantize_matmul_reference(a, b)
    torch.testing.assert_close(sim(_quantize_matmul)(a, b), ref, rtol=1e-5, atol=1e-3)
    monkeypatch.setenv("NATIVELAB_CACHE_DIR", str(tmp_path / "neff"))
    torch.testing.assert_close(_quantize_matmul(a.to("neuron"), b.to("neuron")).cpu(), ref, rtol=1e-5, atol=1e-3)


def test_on_trainium2_the_mx_instructions_are_an_error_at_their_line():
    assert settings.PLATFORM_TARGET.get() == 3 and nisa.get_nc_version() == nisa.nc_version.gen3
    with pytest.raises(nki.NkiError) as e:
        sim(_quantize)(_mixed(32, 16), nl.float8_e4m3fn_x4)
    msg = str(e.value)
    assert f"test_nki_mx.py:{_line_of(_quantize, 'nisa.quantize_mx(')}" in msg and "NeuronCore-v4" in msg, msg
    assert "NEURON_PLATFORM_TARGET_OVERRIDE=trn3" in msg


def test_the_target_follows_nkis_variable(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    assert nisa.get_nc_version() == nisa.nc_version.gen4
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(ValueError, match="NEURON_PLATFORM_TARGET_OVERRIDE='trn1': expected trn2, gen3, trn3 or gen4"):
        nisa.get_nc_version()


@nki.jit
def _version_plus(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    gen = 4 if nisa.get_nc_version() == nisa.nc_version.gen4 else 3
    nl.store(out, nl.add(nl.load(x), float(gen)))
    return out


def test_a_kernel_is_traced_again_for_another_target():
    # one signature, launched compiled for trn2, then trn3, then trn2: each launch runs its target's trace
    x = torch.zeros(4, 8)
    assert torch.equal(_version_plus(x), x + 3)
    with settings.PLATFORM_TARGET.set("trn3"):
        assert torch.equal(_version_plus(x), x + 4)
    assert torch.equal(_version_plus(x), x + 3)


@nki.jit
def _bad_partitions(x):
    t = nl.load(x)
    q = nl.ndarray((48, 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    s = nl.ndarray((48, 4), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=q, src=t, dst_scale=s)  # LIMIT
    return x


@nki.jit
def _bad_moving(st, mv):
    a = nl.ndarray((32, 2), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    b = nl.ndarray((32, 4100), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    sa = nl.ndarray((4, 2), dtype=nl.uint8, buffer=nl.sbuf)
    sb = nl.ndarray((4, 4100), dtype=nl.uint8, buffer=nl.sbuf)
    acc = nl.ndarray((2, 4100), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(acc, a, b, sa, sb)  # LIMIT
    return st


@pytest.mark.parametrize("kernel,args,expected", [
    (_bad_partitions, (torch.zeros(48, 16, dtype=torch.bfloat16),), ["quantize_mx", "48 partitions", "a multiple of 32"]),
    (_bad_moving, (torch.zeros(1), torch.zeros(1)), ["nc_matmul_mx", "moving free size 4100", "exceeds 4096"]),
])
def test_mx_limits_name_line_value_and_limit(trn3, kernel, args, expected):
    with pytest.raises(nki.NkiError) as e:
        sim(kernel)(*args)
    wanted = [f"test_nki_mx.py:{_line_of(kernel, '# LIMIT')}", *expected]
    assert [w for w in wanted if w not in str(e.value)] == [], str(e.value)


def test_mx_costs_follow_the_rules(trn3):
    """quantize_mx: max(F, 64) Vector cycles over src's F elements per partition (the one-input rule) at
    0.96 GHz; nc_matmul_mx: a bf16 MultiplyMoving's max(N, 64) Tensor cycles at 2.4 GHz, 4x the rows."""
    est = _quantize_matmul.estimate(torch.empty(128, 64, dtype=torch.bfloat16), torch.empty(128, 512, dtype=torch.bfloat16))
    took = [(name, end - start) for name, _, start, end, _ in est.events]
    q = [t for name, t in took if name == "quantize_mx"]
    assert q == [pytest.approx(64 / 0.96e9), pytest.approx(512 / 0.96e9)]
    mm = [t for name, t in took if name == "nc_matmul_mx"]
    assert mm == [pytest.approx(128 / 2.4e9)]  # N = 512 / 4 packed columns
