"""The kernel library: each file holds a kernel, its custom op and its plain-PyTorch reference."""

from .attention import attention_cte, attention_tkg, reference_attention_cte, reference_attention_tkg
from .cross_entropy import (
    cross_entropy,
    linear_cross_entropy,
    reference_cross_entropy,
    reference_linear_cross_entropy,
)
from .decode_weights import DecodeWeights
from .mlp import mlp, reference_mlp
from .qkv import qkv, reference_qkv
from .rmsnorm import reference_rmsnorm, rmsnorm
from .rope import reference_rope, rope
from .sample import reference_sample_mask, sample
from .transformer import (
    reference_transformer_tkg,
    reference_transformer_tkg_token,
    transformer_tkg,
    transformer_tkg_token,
)

__all__ = [
    "rmsnorm", "reference_rmsnorm", "rope", "reference_rope", "mlp", "reference_mlp", "qkv", "reference_qkv",
    "sample", "reference_sample_mask", "attention_cte", "reference_attention_cte", "attention_tkg",
    "reference_attention_tkg", "transformer_tkg", "reference_transformer_tkg",
    "transformer_tkg_token", "reference_transformer_tkg_token", "cross_entropy",
    "reference_cross_entropy", "linear_cross_entropy", "reference_linear_cross_entropy", "DecodeWeights",
]
