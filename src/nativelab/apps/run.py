"""`nativelab run`: the guide's Lab 2 benchmark (`python run.py --model base --compile --greedy`).

`nativelab run ARGS` runs Lab 2's own run.py (labs/lab2/run.py, packaged as nativelab/lab2/run.py) with ARGS,
as `python run.py ARGS` in the lab's folder does; its tiers are the folder's code. This module holds what run.py
shares with the rest of the package: the flags, the weights, the prompt, the fences, the untimed figures
(device traffic and the est. trn2 tok/s) and the table.

`--device cuda` runs the same on a GPU: the library kernels in Triton, `--compile` with Inductor, and the
experimental tier's decode step replayed as one CUDA graph per token.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

import torch

import nativelab
from ..check import Check
from ..device.config import DEVICE_NAME
from ..files import write_atomic
from ..models.llama import SIZES, TIERS, Generator, Llama, check_fits
from ..models.llama import checkpoint
from ..models.llama.model import lab2_on_path
from ..models.llama.tokenizer import Tokenizer
from ..profile import plots as _plots
from ..profile import session_active, traffic_per_token

REAL_SIZES = ("smollm2-135m",)

DESCRIPTIONS = {
    "base": "Baseline (pure PyTorch ops, RoPE, static KV cache)",
    "core": "NKI core (CTE prefill + TKG decode, static KV cache)",
    "experimental": "NKI experimental (CTE prefill + megakernel decode, static KV cache)",
}
DEFAULT_PROMPT = [1, 15043, 29892, 590, 1024, 338]  # a fixed prompt for random-weight models
# What --kernels cpu is for: the library's CPU kernels called directly, skipping the NKI kernels' checks and
# estimates; the default's NKI kernels lower to the same code (kernels/nki/host.py), so the two runs compare what
# the NKI layer costs on the CPU (bench/lab2.py measures both in one run).
KERNELS_CPU = ("cpu calls the library's CPU kernels directly (PyTorch compiled by Inductor, hand-written C++ for the "
               "one-token step), without the NKI kernels' checks and estimate: the baseline that shows what the NKI "
               "layer costs here")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="nativelab run", description="The Lab 2 Llama benchmark.")
    ap.add_argument("--model", default="base", choices=[*TIERS, "all"])
    ap.add_argument("--compile", action="store_true",
                    help='torch.compile the model steps (backend "neuron"; Inductor on cuda)')
    ap.add_argument("--greedy", action="store_true", help="greedy decoding (default: top-p sampling)")
    ap.add_argument("--size", default="small", choices=[*sorted(SIZES), *REAL_SIZES],
                    help="random-weight tiny/small, or smollm2-135m: the real SmolLM2-135M-Instruct (offline)")
    ap.add_argument("--model-path", default=None, help="a local Hugging Face Llama checkpoint directory")
    ap.add_argument("--tokens", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5,
                    help="timed runs of --tokens tokens each; the median is reported (one run is ~0.1-0.5 s)")
    ap.add_argument("--device", default=DEVICE_NAME, choices=[DEVICE_NAME, "cpu", "cuda"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--prompt", default=None,
                    help="text (models with a tokenizer) or comma-separated token ids (random-weight models)")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernels", default="nki", choices=["nki", "cpu"],
                    help="what nki_ops.py's kernels run. nki (default): the NKI kernels (nativelab.kernels.nki: "
                         "nki.language / nki.isa code, what would run on Trainium), each launch checked against "
                         "Trainium2's limits and estimated from its trace, its values computed by what it lowers to on "
                         "this CPU (kernels/nki/host.py; NATIVELAB_NKI_LOWER=0: the kernel's own traced code, "
                         "compiled, slower). " + KERNELS_CPU)
    ap.add_argument("--estimate", action=argparse.BooleanOptionalAction, default=None,
                    help="estimate each tier's Trainium2 tok/s and where its token's time would go (the porting "
                         "check's estimate of one more, untimed generation, under which the kernels run their traced "
                         "code). Default: on with --model all (the table's est. trn2 column), off for one tier")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    ap.add_argument("--plot", default="lab2_tiers.png", help="--model all: a PNG bar chart of tok/s per tier")
    args = ap.parse_args(argv)
    if args.estimate is None:
        args.estimate = args.model == "all"
    if args.tokens < 1:
        ap.error("--tokens must be at least 1")
    if args.repeat < 1 or args.warmup < 0:
        ap.error("--repeat must be >= 1 and --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available to this PyTorch")
    if args.device == DEVICE_NAME and not (nativelab.device.is_registered() or nativelab.device.real_neuron_installed()):
        ap.error("--device neuron: the emulated device is not registered (see the warning at import)")
    if args.model == "all" and not os.path.isdir(os.path.dirname(args.plot) or "."):
        ap.error(f"--plot: directory {os.path.dirname(args.plot)!r} does not exist")
    return args


DEFAULT_TEXT = "The capital of France is"


def prompt_ids(args, vocab: int, tokenizer: Tokenizer | None = None) -> list[int]:
    if tokenizer is not None:
        return tokenizer.encode(args.prompt if args.prompt is not None else DEFAULT_TEXT)
    if args.prompt is None:
        return [t % vocab for t in DEFAULT_PROMPT]
    try:
        ids = [int(t) for t in args.prompt.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"--prompt: expected comma-separated token ids, got {args.prompt!r}") from None
    return ids


def sync(device: str) -> None:
    if device == DEVICE_NAME:
        torch.neuron.synchronize()
    elif device == "cuda":
        torch.cuda.synchronize()


GUIDE_TOK_S = {"base": 359.0, "core": 435.3, "experimental": 537.4}  # the guide's trn2 figures (compiled, greedy)


def lab2_run():
    """Lab 2's run.py (labs/lab2/run.py, packaged as nativelab/lab2/run.py), the code `nativelab run` runs."""
    path = lab2_on_path() / "run.py"
    mod = sys.modules.get(_LAB2_RUN)
    if mod is None or getattr(mod, "__file__", None) != str(path):
        spec = importlib.util.spec_from_file_location(_LAB2_RUN, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[_LAB2_RUN] = mod
        spec.loader.exec_module(mod)
    return mod


_LAB2_RUN = "nativelab_lab2_run"


def main(argv=None) -> list[dict]:
    """`nativelab run`: Lab 2's run.py with these arguments (as `python run.py ...` in the lab's folder)."""
    return lab2_run().main(argv)


def load_weights(args) -> tuple[Llama, Tokenizer | None]:
    """The weights every tier shares, after checking that the prompt and --tokens fit (one clear line if not)."""
    if args.size in SIZES and args.model_path is None:  # check the request before building anything
        check_request(args, SIZES[args.size], of=f"size {args.size!r}")
    weights, tokenizer = load_model(args)
    if tokenizer is not None:
        check_request(args, weights.cfg, tokenizer=tokenizer)
    return weights, tokenizer


def tiers_of(args) -> list[str]:
    return list(TIERS) if args.model == "all" else [args.model]


def trn2_estimate(gen: Generator, prompt: list[int], tokens: int) -> dict | None:
    """The Trainium2 estimate of one generation: the porting check's first-order estimate (check/estimate.py:
    the kernels' work, graph launches, kernel boundaries, fallbacks, syncs and the host loop, each from a
    published figure but the host loop's, the one fitted constant; see check/hardware.py), as tok/s, ms per
    token by part and the largest units of work. None where the emulator stepped aside, or while a check or profiling
    session already records (`nativelab check -- run ...`): the extra generation would be part of what it
    measures."""
    if not nativelab.device.is_registered() or session_active():
        return None
    with Check("est. trn2", tokens=True) as c:
        gen.generate(prompt, tokens)
    report = c.report()
    return {"tok_per_s": report.rate(), **per_token(report.estimate)}


def per_token(e: dict) -> dict:
    """An estimate (check/estimate.py's) as ms per token by part and its five largest units of work per token."""
    per = max(e["per"] or 1, 1)
    return {"ms_per_token": {k: v * 1e3 for k, v in e["parts_per"].items()},
            "top_work_ms_per_token": {k: v * 1e3 / per for k, v in list(e["by_work"].items())[:5]}}


def untimed_figures(gen: Generator, prompt: list[int], args) -> dict:
    """After the timed runs: device bytes per token (the profiler's traffic counter) and, with --estimate, the
    est. trn2 tok/s and its ms per token by part, each from one more generation (their counters would slow the
    timed ones)."""
    on_device = args.device == DEVICE_NAME
    est = trn2_estimate(gen, prompt, args.tokens) if on_device and args.estimate else None
    return {
        "device_bytes_per_token": traffic_per_token(lambda: gen.generate(prompt, args.tokens)) if on_device else None,
        "est_trn2_tok_per_s": est["tok_per_s"] if est else None,
        "est_trn2_ms_per_token": est["ms_per_token"] if est else None,
        "est_trn2_top_work_ms_per_token": est["top_work_ms_per_token"] if est else None,
    }


def finish(results: list[dict], args) -> list[dict]:
    """With several tiers the table and the plot; --json."""
    if len(results) > 1:
        print_table(results)
        _plots.plot_throughput([r["model"] for r in results], [statistics.median(r["tok_per_s"]) for r in results],
                               args.plot, title=f"Lab 2 tiers ({args.size}, {args.dtype}, "
                               f"{'compiled' if args.compile else 'eager'}, {'greedy' if args.greedy else 'top-p'})",
                               est_ms_per_token=[r["est_trn2_ms_per_token"] for r in results]
                               if all(r.get("est_trn2_ms_per_token") for r in results) else None)
        print(f"Plot: {args.plot}")
    if any(r.get("est_trn2_ms_per_token") for r in results):  # --estimate: where each tier's token goes
        print_estimate_parts(results)
    if args.json:
        write_atomic(Path(args.json), json.dumps(results, indent=2).encode())
    return results


def check_request(args, cfg, of: str | None = None, tokenizer: Tokenizer | None = None) -> None:
    """Exit with one clear line if the prompt and --tokens do not fit in the model's KV cache."""
    try:
        check_fits(cfg, len(prompt_ids(args, cfg.vocab_size, tokenizer)), args.tokens, of=of)
    except ValueError as e:
        raise SystemExit(f"nativelab run: {e}") from None


def load_model(args) -> tuple[Llama, Tokenizer | None]:
    """The weights every tier shares: random from a seed, the shipped SmolLM2, or a local checkpoint."""
    if args.model_path is not None:
        try:
            return checkpoint.load_hf(args.model_path), None
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"nativelab run: --model-path: {e}") from None
    if args.size == "smollm2-135m":
        try:
            model, tok = checkpoint.load_gguf(checkpoint.smollm2_path())
        except (FileNotFoundError, ImportError, ValueError) as e:
            raise SystemExit(f"nativelab run: {e}") from None
        return model, Tokenizer(tok)
    torch.manual_seed(args.seed)
    return Llama.random(args.size, seed=args.seed), None


def print_table(results: list[dict]) -> None:
    base = statistics.median(results[0]["tok_per_s"])
    est_col = any(r.get("est_trn2_tok_per_s") is not None for r in results)  # with --estimate
    est_head = f" {'est. trn2 tok/s':>16}" if est_col else ""
    print(f"{'Variant':<14} {'Throughput (tok/s)':>26} {'vs. base':>9}{est_head} {'guide trn2':>11} "
          f"{'Device MB/token':>16}  CPU fallback ops")
    for r in results:
        med, lo, hi = statistics.median(r["tok_per_s"]), min(r["tok_per_s"]), max(r["tok_per_s"])
        span = f"{med:.1f} ({lo:.1f}-{hi:.1f})"
        traffic, est = r.get("device_bytes_per_token"), r.get("est_trn2_tok_per_s")
        mb = f"{traffic / 1e6:.3f}" if traffic is not None else "-"
        est_s = (f" {f'{est:.1f}' if est is not None else '-':>16}") if est_col else ""
        guide = GUIDE_TOK_S.get(r["model"]) if r.get("compile") and r.get("greedy") else None  # the guide's setting
        guide_s = f"{guide:.1f}" if guide is not None else "-"
        print(f"{r['model']:<14} {span:>26} {med / base:>8.2f}x{est_s} {guide_s:>11} {mb:>16}  {r['fallback_ops']}")
    for r in results:
        for w in r["timed_section"]["warnings"]:
            print(f"Warning ({r['model']}): {w}")
    print(f"\n{token_agreement(results)}")


def print_estimate_parts(results: list[dict]) -> None:
    """Where the estimate puts each tier's token: ms per token by part (check/estimate.py's parts; a part no
    tier spends time in is left out), the total, and each tier's largest units of device work."""
    with_est = [r for r in results if r.get("est_trn2_ms_per_token")]
    parts = [p for p in with_est[0]["est_trn2_ms_per_token"]
             if any(r["est_trn2_ms_per_token"].get(p) for r in with_est)]
    print(f"\n{'est. trn2 ms/token':<22}" + "".join(f" {r['model']:>13}" for r in with_est))
    for p in parts:
        print(f"{p:<22}" + "".join(f" {r['est_trn2_ms_per_token'].get(p, 0.0):>13.3f}" for r in with_est))
    print(f"{'total':<22}" + "".join(f" {sum(r['est_trn2_ms_per_token'].values()):>13.3f}" for r in with_est))
    for r in with_est:
        top = ", ".join(f"{name} {ms:.3f}" for name, ms in r["est_trn2_top_work_ms_per_token"].items())
        print(f"largest work ({r['model']}, ms/token): {top}")


def token_agreement(results: list[dict]) -> str:
    """How far the tiers' tokens agree with the first tier's: one greedy token that differs changes the
    context, and every token after it may differ too, so the count is of the first steps."""
    ref = results[0]["generated"]
    firsts = []
    for r in results[1:]:
        same = 0
        while same < min(len(ref), len(r["generated"])) and r["generated"][same] == ref[same]:
            same += 1
        firsts.append(same)
    agree = min(firsts, default=len(ref))
    if agree == len(ref) and all(len(r["generated"]) == len(ref) for r in results):
        return f"Tokens: every tier gives the same {len(ref)} tokens"
    per_tier = ", ".join(f"{r['model']} {n}" for r, n in zip(results[1:], firsts))
    why = ("bf16 rounding differs between tiers" if results[0]["dtype"] == "bfloat16" else
           "fp32 summation order differs between tiers")
    return (f"Tokens: the tiers agree with {results[0]['model']} for the first {agree} of {len(ref)} steps "
            f"({per_tier}); {why}, and a token that differs changes the rest")
