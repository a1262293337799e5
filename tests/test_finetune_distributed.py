"""`nativelab finetune` under torchrun: FSDP2-sharded full fine-tuning of a tiny Llama (saved to a directory
so every rank can load it) on 2 ranks against one process with the same global batch; the saved model; resume.

Multi-process tests run real torchrun jobs (ranks in tests/finetune_worker.py) and are marked slow; the rest
run in this process."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_distributed import free_port
from test_finetune import tiny_model, tiny_tokenizer

from nativelab.finetune import Config, parallel, run, train

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "finetune_worker.py"
STEPS = 4


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny model + tokenizer as a Hugging Face checkpoint, and a learnable JSONL task."""
    import random

    root = tmp_path_factory.mktemp("ft")
    tiny_model().save_pretrained(root / "tiny")
    tiny_tokenizer().save_pretrained(root / "tiny")
    r = random.Random(0)
    with open(root / "reverse.jsonl", "w") as f:
        for _ in range(40):
            w = "".join(r.choice("abcdef") for _ in range(6))
            f.write(json.dumps({"prompt": f"reverse {w}", "response": w[::-1]}) + "\n")
    return root


def args(files, out, batch_size, *extra):
    return ["--method", "full", "--model-path", files / "tiny", "--dataset", files / "reverse.jsonl",
            "--output-dir", out, "--max-steps", STEPS, "--seq-len", 48, "--batch-size", batch_size,
            "--lr", "1e-3", "--precision", "fp32", "--log-every", 2, "--no-progress", *extra]


def torchrun(argv, nproc=2, env=None, timeout=120, program=(WORKER,)):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--rdzv_backend", "c10d", "--rdzv_endpoint", f"localhost:{free_port()}", *map(str, program)]
    full = dict(os.environ, NATIVELAB_QUIET="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", **(env or {}),
                PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    start = time.perf_counter()
    r = subprocess.run(cmd + [str(a) for a in argv], capture_output=True, text=True, env=full, timeout=timeout,
                       check=False)
    return r, time.perf_counter() - start


@pytest.fixture(scope="module")
def two_ranks(files):
    """Two ranks, 2 examples each per step, a checkpoint after step 2 and a generated sample."""
    out, result = files / "out2", files / "result2.pt"
    r, seconds = torchrun(args(files, out, 2, "--save-every", 2, "--sample-tokens", 4), env={"FT_RESULT": str(result)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    print(f"2-rank run: {seconds:.1f} s")
    return r, torch.load(result, weights_only=False), out


@pytest.mark.slow
def test_two_ranks_match_one_process_and_the_saved_model_reloads(files, two_ranks, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    r, got, out = two_ranks
    model, tok, _ = train.model_mod.load(files / "tiny")
    one = run(Config(**{**train_cfg(files, tmp_path / "one"), "batch_size": 4}), model=model, tokenizer=tok,
              log=lambda *_: None)
    # fp32: the ranks' sums differ from one process's only in summation order
    torch.testing.assert_close(got["losses"], one.losses, rtol=1e-4, atol=0)
    assert got["losses"][-1] < got["losses"][0] and got["eval_after"] < got["eval_before"] - 0.05
    assert got["eval_after"] == pytest.approx(one.eval_after, rel=1e-4)

    # only rank 0 logs: one line per log step, the loss the mean over ranks
    steps = [ln for ln in r.stdout.splitlines() if ln.startswith("step=")]
    assert [s.split()[0] for s in steps] == ["step=2/4", "step=4/4"], r.stdout
    assert r.stdout.count("Held-out loss before") == 1 and "on 2 ranks (neuron, FSDP2)" in r.stdout
    assert "Sample after :" in r.stdout and "batch 4 (2 per rank)" in r.stdout

    assert got["tied"]  # FSDP2 kept the LM head and the embeddings one parameter
    files_ = list(out.glob("model*.safetensors"))
    keys = {k for f in files_ for k in safe_open(f, "pt").keys()}  # noqa: SIM118 (not a dict)
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys  # one copy of the tied weight
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # nothing half-written
    reloaded = AutoModelForCausalLM.from_pretrained(str(out))
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight  # tied again on load
    reloaded = reloaded.to("neuron").eval()
    with torch.no_grad():
        logits = reloaded(input_ids=got["ids"].to("neuron")).logits.cpu()
        ref = one.model.eval()(input_ids=got["ids"].to("neuron")).logits.cpu()
    torch.testing.assert_close(logits, got["logits"], rtol=0, atol=1e-6)  # the sharded model's full state
    torch.testing.assert_close(logits, ref, rtol=1e-3, atol=1e-4)  # and one process's training


def train_cfg(files, out) -> dict:
    return {"method": "full", "dataset": str(files / "reverse.jsonl"), "output_dir": str(out), "max_steps": STEPS,
            "seq_len": 48, "lr": 1e-3, "precision": "fp32", "log_every": 2, "sample_tokens": 0, "progress": False}


@pytest.mark.slow
def test_resume_on_two_ranks_continues_exactly(files, two_ranks):
    from transformers import AutoModelForCausalLM

    _, whole, out = two_ranks
    ckpt = files / "out2-checkpoints"
    assert (ckpt / "LATEST").read_text().strip() == "step_00000002"  # the last step saves the model, not one
    resumed_out, result = files / "resumed", files / "resumed.pt"
    r, _ = torchrun(args(files, resumed_out, 2, "--checkpoint-dir", ckpt, "--resume"), env={"FT_RESULT": str(result)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert f"Resumed from {ckpt / 'step_00000002'} at step 2" in r.stdout
    got = torch.load(result, weights_only=False)
    assert got["losses"] == whole["losses"][2:]  # exactly
    a = dict(AutoModelForCausalLM.from_pretrained(str(out)).named_parameters())
    for name, p in AutoModelForCausalLM.from_pretrained(str(resumed_out)).named_parameters():
        torch.testing.assert_close(p, a[name], rtol=0, atol=0)


@pytest.mark.slow
def test_more_ranks_than_devices_is_one_clear_error(files, tmp_path):
    r, _ = torchrun(args(files, tmp_path / "o", 2), env={"NEURON_RT_NUM_CORES": "1"},
                    program=("-m", "nativelab.cli", "finetune"))
    assert r.returncode != 0
    assert "nativelab finetune: error: LOCAL_RANK=1 needs neuron:1, but this host has 1 logical NeuronCores" in r.stderr
    assert r.stderr.count("Traceback") <= 1 and not (tmp_path / "o").exists()  # torchrun's own summary only


@pytest.mark.slow
@pytest.mark.parametrize("script,method", [("run_full_finetune_hf.sh", "full"), ("run_lora_finetune_hf.sh", "lora")])
def test_lab_scripts_with_nproc(files, tmp_path, script, method):
    """NPROC=2 ./labs/lab1/run_*_finetune_hf.sh: torchrun, two ranks, the guide's lines once, a model / adapter
    that loads (LoRA: FSDP2 over frozen base weights and trainable adapters alike)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "coder"
    env = dict(os.environ, MODEL_PATH=str(files / "tiny"), OUTPUT_DIR=str(out), PYTHON=sys.executable, NPROC="2",
               HF_HUB_OFFLINE="1", NATIVELAB_QUIET="1", OMP_NUM_THREADS="1",
               # absolute: a relative PYTHONPATH=src would miss this tree from cwd=tmp_path
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(["bash", str(ROOT / "labs" / "lab1" / script), "--dataset", str(files / "reverse.jsonl"),
                        "--max-steps", "2", "--seq-len", "48", "--batch-size", "2", "--log-every", "1", "--lr", "3e-3",
                        "--sample-tokens", "0", "--precision", "fp32", "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("step=")]
    assert steps == ["step=1/2", "step=2/2"], r.stdout
    assert f"({method}, " in r.stdout and "on 2 ranks" in r.stdout
    if method == "full":
        assert "Training completed. Model saved to" in r.stdout
        assert AutoModelForCausalLM.from_pretrained(str(out)).config.num_hidden_layers == 2
    else:
        lora = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(files / "tiny")), str(out))
        trained = [p for n, p in lora.named_parameters() if "lora_B" in n]
        assert len(trained) == 8 and all(p.abs().max() > 0 for p in trained)  # B starts at zero


# -- in this process -----------------------------------------------------------------------------------------


def test_decoder_layers_are_found_inside_peft_too():
    from peft import LoraConfig, get_peft_model

    m = tiny_model()
    assert parallel.decoder_layers(m) == list(m.model.layers)
    p = get_peft_model(tiny_model(), LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    assert [type(x).__name__ for x in parallel.decoder_layers(p)] == ["LlamaDecoderLayer"] * 2
    assert parallel._tied_aliases(m) == ["lm_head.weight"]


def test_global_batch_larger_than_the_data_is_refused(files):
    cfg = Config(dataset=str(files / "reverse.jsonl"), batch_size=20, seq_len=48, progress=False)
    with pytest.raises(ValueError, match="--batch-size 20 on 2 ranks needs 40 training examples per step; "
                                         "the training split has 36"):
        train.prepare(cfg, tiny_model(), tiny_tokenizer(), ranks=2)


def test_a_single_process_checkpoint_is_named_when_resumed_under_torchrun(tmp_path):
    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3" / "trainer_state.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="a single-process checkpoint: resume it without torchrun"):
        parallel.find_checkpoint(str(tmp_path / "checkpoint-3"), tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        parallel.find_checkpoint("latest", tmp_path / "none")
