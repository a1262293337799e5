"""The core tier's model: base's Llama (llama_base/llama.py) built from this folder's TransformerBlock, whose
MLP, RoPE and attention call nki_ops.py's kernels."""

from llama_base.llama import Llama as BaseLlama

from .transformer_block import TransformerBlock


class Llama(BaseLlama):
    Block = TransformerBlock
