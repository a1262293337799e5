"""MX (OCP Microscaling) data in NKI: the 4-packed element types (nl.float8_e4m3fn_x4, nl.float8_e5m2_x4,
nl.float4_e2m1fn_x4), their E8M0 block scales, and the arithmetic nisa.quantize_mx and nisa.nc_matmul_mx do.

As AWS's NKI API pages (nki.isa.quantize_mx, nki.isa.nc_matmul_mx) and its "MXFP Matrix Multiplication" guide
describe them:
  - an `_x4` element packs four values that lie along the contraction axis: the fp8 types are 32 bits (four
    bytes, the first value in the lowest byte), float4_e2m1fn_x4 is 16 bits (four nibbles, lowest first). A
    tile of them is stored here as int32 / int16 (the carrier), and its values read as [..., 4] fp32;
  - a scaling group is 8 partitions x 4 values (one `_x4` element in each of 8 partitions) sharing one E8M0
    scale, 2^(code - 127) (code 255 is NaN); partitions are in quadrants of 32, and the scales of quadrant q
    sit in partitions 32 q .. 32 q + 3 of the scale tile, one per group of 8 data partitions, in the data
    element's free position;
  - quantize_mx's scale is 2^(floor(log2 amax) - (Emax - 1)) over the group (Emax 8 for e4m3fn, 15 for e5m2),
    "two times larger" than OCP's sample conversion so the largest values round without saturating; an
    all-zero group gets code 0 (2^-127). Values are divided by the scale, saturated to the type's largest
    finite value and rounded to nearest even.
"""

from __future__ import annotations

import torch

GROUP_PARTITIONS = 8  # a scaling group: 8 partitions x one _x4 element (4 values) each
QUADRANT = 32  # SBUF partitions per quadrant; a quadrant's scales are in its first 4 partitions
SCALE_BIAS = 127  # E8M0: 2^(code - 127)


class PackedDtype:
    """A 4-packed MX element type. Kernels allocate and view tiles of it; only quantize_mx, nc_matmul_mx
    and data movement (DMA, copies) handle them. `carrier`: the torch dtype its bits are stored in."""

    is_floating_point = False  # the engines do not compute in it: elementwise instructions reject it
    is_complex = False

    def __init__(self, name: str, element, carrier: torch.dtype, emax: int, largest: float):
        self.name, self.element, self.carrier = name, element, carrier
        self.emax, self.largest = emax, largest  # the largest unbiased exponent and finite value of one value
        self.itemsize = torch.empty((), dtype=carrier).element_size()

    def __repr__(self):
        return f"nl.{self.name}"


float8_e4m3fn_x4 = PackedDtype("float8_e4m3fn_x4", torch.float8_e4m3fn, torch.int32, 8, 448.0)
float8_e5m2_x4 = PackedDtype("float8_e5m2_x4", torch.float8_e5m2, torch.int32, 15, 57344.0)
float4_e2m1fn_x4 = PackedDtype("float4_e2m1fn_x4", "float4_e2m1fn", torch.int16, 2, 6.0)
PACKED = (float8_e4m3fn_x4, float8_e5m2_x4, float4_e2m1fn_x4)
QUANTIZED = (float8_e4m3fn_x4, float8_e5m2_x4)  # what quantize_mx writes (no fp4 output)

# E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit; no inf or NaN
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def torch_dtype(dtype):
    """The torch dtype a tile of `dtype` is stored in."""
    return dtype.carrier if isinstance(dtype, PackedDtype) else dtype


def unpack(bits: torch.Tensor, dtype: PackedDtype) -> torch.Tensor:
    """The values of packed elements (`bits` in the carrier dtype, any shape) as fp32, shape (*bits, 4)."""
    if dtype.carrier == torch.int32:
        return bits.contiguous().view(dtype.element).reshape(*bits.shape, 4).float()
    b = bits.to(torch.int32)
    nibbles = torch.stack([(b >> (4 * j)) & 0xF for j in range(4)], dim=-1)
    table = torch.tensor(_E2M1 + tuple(-v for v in _E2M1), dtype=torch.float32, device=bits.device)
    return table[nibbles.long()]


def pack(values: torch.Tensor, dtype: PackedDtype) -> torch.Tensor:
    """fp8 values (..., 4k) rounded already to dtype.element, as packed elements (..., k) in the carrier."""
    return values.to(dtype.element).contiguous().view(torch.int32)


def scale_factor(codes: torch.Tensor) -> torch.Tensor:
    """E8M0 codes (uint8) as fp32 factors 2^(code - 127); code 255 is NaN."""
    c = codes.to(torch.int32)
    f = torch.exp2((c - SCALE_BIAS).float())
    return torch.where(c == 255, torch.full_like(f, float("nan")), f)


def scale_rows(partitions: int) -> list[int]:
    """For each group of 8 data partitions, the scale tile's partition holding its scales."""
    per_quadrant = QUADRANT // GROUP_PARTITIONS
    return [(g // per_quadrant) * QUADRANT + g % per_quadrant for g in range(partitions // GROUP_PARTITIONS)]


def gather_scales(tile, partitions: int, read) -> torch.Tensor:
    """The scale codes of `partitions` data partitions from a scale tile laid out by quadrant: [P / 8, F]
    (`read`: a view of the tile's partitions -> its values)."""
    per_quadrant = QUADRANT // GROUP_PARTITIONS
    groups = partitions // GROUP_PARTITIONS
    parts = [read(tile[q * QUADRANT:q * QUADRANT + min(per_quadrant, groups - q * per_quadrant)])
             for q in range((groups + per_quadrant - 1) // per_quadrant)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def scale_partitions_needed(partitions: int) -> int:
    """How many partitions a scale tile spans for `partitions` data partitions."""
    return scale_rows(partitions)[-1] + 1


def quantize(x: torch.Tensor, dtype: PackedDtype) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_mx's arithmetic on x (P, F) fp32 (P a multiple of 8, F of 4): (packed elements (P, F / 4) in
    the carrier, E8M0 codes (P / 8, F / 4) as uint8, one per group, in group order)."""
    p, f = x.shape
    groups = x.reshape(p // GROUP_PARTITIONS, GROUP_PARTITIONS, f // 4, 4)
    amax = groups.abs().amax(dim=(1, 3))
    exponent = (amax.contiguous().view(torch.int32) >> 23) & 0xFF  # biased: floor(log2 amax) + 127
    codes = (exponent - (dtype.emax - 1)).clamp(0, 254)
    codes = torch.where(amax == 0, torch.zeros_like(codes), codes)
    codes = torch.where(torch.isfinite(amax), codes, torch.full_like(codes, 255))
    # x / 2^(code - 127), as two exact power-of-two factors (either alone could leave fp32's normal range)
    e = SCALE_BIAS - codes
    half = e // 2
    inv = (torch.exp2(half.float()) * torch.exp2((e - half).float()))
    inv = inv[:, None, :, None].expand_as(groups).reshape(p, f)
    q = (x * inv).clamp(-dtype.largest, dtype.largest)
    return pack(q, dtype), codes.to(torch.uint8)
