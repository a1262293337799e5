"""Lab 2's folder as the guide lays it out (labs/lab2): the guide's commands as printed, run in a copy of the
folder, and the tiers' code is the folder's (an edit there changes what runs)."""

import ast
import difflib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAB2 = ROOT / "labs" / "lab2"


def _copy(tmp_path) -> pathlib.Path:
    lab = tmp_path / "lab2"
    shutil.copytree(LAB2, lab, ignore=shutil.ignore_patterns("__pycache__", "*.png", "*.json"))
    return lab


def _run(lab: pathlib.Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python run.py ARGS` in the folder, as the guide types it."""
    env = dict(os.environ, NATIVELAB_QUIET="1")
    r = subprocess.run([sys.executable, "run.py", *args], cwd=lab, capture_output=True, text=True, env=env,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_the_folder_is_the_guides_tree():
    for f in ("run.py", "nki_ops.py", "profile_utils.py", "llama_base/llama.py", "llama_base/self_attention.py",
              "llama_base/transformer_block.py", "llama_nki_core/llama_nki.py", "llama_nki_core/self_attention.py",
              "llama_nki_core/transformer_block.py", "llama_nki_experimental/llama_nki.py",
              "llama_nki_experimental/self_attention.py", "llama_nki_experimental/transformer_block.py"):
        assert (LAB2 / f).is_file(), f
    # the package runs these files: its lab folder is this one (a link in a checkout, a copy in a wheel)
    import nativelab.models.llama.model as model

    assert (model.LAB2 / "llama_base" / "llama.py").read_text() == (LAB2 / "llama_base" / "llama.py").read_text()


def test_head_30_of_nki_ops_shows_the_registration_pattern():
    head = "".join((LAB2 / "nki_ops.py").read_text().splitlines(keepends=True)[:30])
    assert "wrap_nki(" in head and "@nki_op(" in head and "def nki_mlp(" in head


def _changed(a: str, b: str) -> tuple[list[str], list[str]]:
    diff = difflib.unified_diff((LAB2 / a).read_text().splitlines(), (LAB2 / b).read_text().splitlines(), n=0,
                                lineterm="")
    lines = [x for x in diff if not x.startswith(("---", "+++", "@@"))]
    return [x[1:].strip() for x in lines if x[0] == "-"], [x[1:].strip() for x in lines if x[0] == "+"]


def test_step2_diff_is_the_mlp_and_rope_replacement():
    removed, added = _changed("llama_base/transformer_block.py", "llama_nki_core/transformer_block.py")
    assert removed == ["half = x.shape[-1] // 2", "rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)",
                       "return (x * cos + rotated * sin).type_as(x)",
                       "gate = F.silu(self.gate_proj(x))", "up = self.up_proj(x)",
                       "down = self.down_proj(gate * up)", "return down"]
    assert added == ["from nki_ops import nki_mlp, nki_rope", "return nki_rope(x, cos, sin)",
                     "return nki_mlp(", "x,", "self.gate_proj.weight,", "self.up_proj.weight,",
                     "self.down_proj.weight", ")"]
    if shutil.which("diff"):  # the guide's command, as printed
        r = subprocess.run(["diff", "llama_base/transformer_block.py", "llama_nki_core/transformer_block.py"],
                           cwd=LAB2, capture_output=True, text=True)
        assert r.returncode == 1 and "> from nki_ops import nki_mlp" in r.stdout and "nki_mlp(" in r.stdout


def test_step7_attention_diff_is_the_attention_replacement():
    """self_attention.py: core's differs from base's in its import and the body of `attend` only."""
    base = (LAB2 / "llama_base" / "self_attention.py").read_text()
    core = (LAB2 / "llama_nki_core" / "self_attention.py").read_text()
    assert core.count("from nki_ops import nki_attn\n") == 1
    core = core.replace("from nki_ops import nki_attn\n", "")
    assert core.split("    def attend(")[0] == base.split("    def attend(")[0]
    assert core.split("    def attend(")[1].strip().endswith(
        "return nki_attn(q, k, v, self.k_cache, self.v_cache, input_pos)")


def _tokens(lab: pathlib.Path, *args: str) -> dict[str, list[int]]:
    out = lab / "r.json"
    _run(lab, *args, "--json", str(out), "--plot", str(lab / "p.png"))
    return {r["model"]: r["generated"] for r in json.loads(out.read_text())}


def _hf_greedy(prompt: list[int], n: int) -> list[int]:
    """An independent reference: Hugging Face's Llama on the same random weights, greedy, float32, on the CPU."""
    import torch
    import transformers

    from nativelab.models.llama import Llama

    src = Llama.random("tiny", seed=0)
    c = src.cfg
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.dim, num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads, intermediate_size=c.intermediate_size, max_position_embeddings=c.max_seq_len,
        rope_theta=c.rope_base, rms_norm_eps=c.norm_eps, tie_word_embeddings=True)).eval()
    sd = {("lm_head.weight" if k == "lm_head.weight" else f"model.{k}"): v for k, v in src.state_dict().items()}
    hf.load_state_dict(sd, strict=False)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


@pytest.mark.slow
def test_the_three_folders_say_the_same_in_float32_and_an_edit_changes_what_runs(tmp_path):
    lab = _copy(tmp_path)
    flags = ["--model", "all", "--size", "tiny", "--greedy", "--dtype", "float32", "--tokens", "8", "--warmup", "0",
             "--repeat", "1"]
    tokens = _tokens(lab, *flags)
    reference = _hf_greedy([t % 256 for t in [1, 15043, 29892, 590, 1024, 338]], 8)
    assert tokens == {"base": reference, "core": reference, "experimental": reference}
    # Replace core's nki_mlp with base's MLP in the copy (run.py printing the ops that ran, as Step 6 prints the
    # fallbacks): core now runs base's MLP ops instead of the MLP kernel, and still says base's tokens.
    src = (lab / "run.py").read_text()
    at = src.index("\n", src.index('print(f"\\nGenerated IDs:')) + 1
    (lab / "run.py").write_text(src[:at] + '    print(f"Executed ops: {torch_neuronx.get_executed_ops()}")\n'
                                + src[at:])
    core = ["--model", "core", *flags[2:]]

    def executed(out: str) -> list[str]:
        (line,) = [x for x in out.splitlines() if x.startswith("Executed ops: ")]
        return ast.literal_eval(line.removeprefix("Executed ops: "))  # a list of op names, printed by repr

    before = executed(_run(lab, *core).stdout)
    block = lab / "llama_nki_core" / "transformer_block.py"
    base_mlp = (lab / "llama_base" / "transformer_block.py").read_text()
    end = base_mlp.index("        return down\n") + len("        return down\n")
    body = base_mlp[base_mlp.index("        gate = F.silu"):end]
    text = block.read_text()
    start = text.index("        return nki_mlp(")
    block.write_text(text[:start] + body + text[text.index("        )\n", start) + len("        )\n"):])
    assert "return nki_mlp(" not in block.read_text() and "gate = F.silu(self.gate_proj(x))" in block.read_text()
    after_out = _run(lab, *core, "--json", str(lab / "c.json")).stdout
    after = executed(after_out)
    assert "kernel:mlp_kernel" in before and "aten::silu" not in before  # the NKI kernel's launches
    assert "kernel:mlp_kernel" not in after and "aten::silu" in after
    (edited,) = json.loads((lab / "c.json").read_text())
    assert edited["generated"] == tokens["base"]


@pytest.mark.slow
def test_with_nki_kernels_the_three_folders_say_base_tokens(tmp_path):
    """--kernels nki: core's and experimental's ops run the NKI kernels (kernels/nki: the tracked launches are
    theirs, none of the CPU kernels'), and greedy float32 gives base's tokens, which are Hugging Face's."""
    lab = _copy(tmp_path)
    src = (lab / "run.py").read_text()
    at = src.index("\n", src.index('print(f"\\nGenerated IDs:')) + 1
    (lab / "run.py").write_text(src[:at] + '    print(f"Executed ops: {sorted(torch_neuronx.get_executed_ops())}")\n'
                                + src[at:])
    out = lab / "r.json"
    r = _run(lab, "--model", "all", "--size", "tiny", "--greedy", "--dtype", "float32", "--tokens", "8", "--warmup",
             "0", "--repeat", "1", "--kernels", "nki", "--json", str(out), "--plot", str(lab / "p.png"))
    results = {x["model"]: x for x in json.loads(out.read_text())}
    reference = _hf_greedy([t % 256 for t in [1, 15043, 29892, 590, 1024, 338]], 8)
    assert {m: x["generated"] for m, x in results.items()} == {"base": reference, "core": reference,
                                                              "experimental": reference}
    assert {x["kernels"] for x in results.values()} == {"nki"}
    ran = [ast.literal_eval(x.removeprefix("Executed ops: ")) for x in r.stdout.splitlines()
           if x.startswith("Executed ops: ")]
    kernels = [{op for op in ops if op.startswith("kernel:")} for ops in ran]
    # core draws its token with the library's sampler (the generator's, not an nki_ops kernel)
    assert kernels[1] == {"kernel:mlp_kernel", "kernel:rope_kernel", "kernel:attention_cte_kernel",
                          "kernel:attention_tkg_kernel", "kernel:sample_kernel"}, kernels
    # experimental: the prompt through core's prefill kernels and the sampler's draw (the guide's "CTE prefill"), each
    # generated token the whole step's kernel (no decode attention of its own)
    assert kernels[2] == {"kernel:mlp_kernel", "kernel:rope_kernel", "kernel:attention_cte_kernel",
                          "kernel:sample_kernel", "kernel:transformer_step_kernel"}, kernels
    assert "Kernels : nki" in r.stdout


@pytest.mark.slow
def test_top_p_with_nki_kernels_draws_the_cpu_kernels_tokens(tmp_path):
    """Sampling (Step 5's default, top-p at temperature 0.8) in float32: the experimental tier under --kernels nki
    (the NKI layers and head, then the library's sampler on their logits) draws the same tokens from the same seed
    as under --kernels cpu: the same logits within fp32 rounding and the same noise, the seed's counter advanced
    once per token by both."""
    lab = _copy(tmp_path)
    flags = ["--model", "experimental", "--size", "tiny", "--dtype", "float32", "--tokens", "8", "--warmup", "0",
             "--repeat", "1"]
    tokens = {k: _tokens(lab, *flags, "--kernels", k)["experimental"] for k in ("cpu", "nki")}
    assert tokens["nki"] == tokens["cpu"] and len(set(tokens["cpu"])) > 1, tokens
