"""The experimental tier's layer, for the prompt's logits (`forward` with several tokens; a prompt on CUDA): core's
layer as it is (llama_nki_core/transformer_block.py). A generated token never runs it: self_attention.py runs
every layer of the step in one kernel."""

from llama_nki_core.transformer_block import MLP, RoPE, TransformerBlock

__all__ = ["MLP", "RoPE", "TransformerBlock"]
