"""The core tier's model: base's Llama (llama_base/llama.py) built from this folder's TransformerBlock, whose
MLP, RoPE and attention call nki_ops.py's kernels."""

import nki_ops
from llama_base.llama import Llama as BaseLlama
from nativelab.kernels.nki import prepared

from .transformer_block import TransformerBlock


class Llama(BaseLlama):
    Block = TransformerBlock

    def setup_cache(self, batch_size: int = 1) -> None:
        """The static KV cache; and, for the NKI kernels, each MLP weight laid out for the Tensor Engine now,
        after the weights are loaded and cast, rather than at its first call (nki_mlp passes module.weight;
        `prepared` keeps the copy beside it and lays the weight out again if it is later written in place)."""
        super().setup_cache(batch_size)
        if nki_ops.KERNELS == "nki":
            for layer in self.layers:
                for proj in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
                    prepared(proj.weight)
