"""The experimental tier's kernel signature by name (kernels/ops/decode_weights.py): `DecodeWeights` is the one
place that lists the whole-step kernels' tensors; the ops carry them as two flat lists, and the traced
reference, the C++ plan (decode and prefill) and the Triton twin read them back by name."""

import difflib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import nativelab
from nativelab.kernels.cpu import build
from nativelab.kernels.ops.decode_weights import SOURCES, DecodeWeights
from nativelab.models.llama import Llama


def _model():
    m = Llama.random("tiny", "experimental", seed=0).eval()
    m.setup_cache()
    return m


def test_the_fields_are_the_models_tensors_by_name():
    """Each field holds the module tensor it names (the same objects, per layer in layer order); flat() and
    unflatten() give back the same objects under the same names; weights and caches are apart."""
    m = _model()
    w = m.decode_weights()
    assert w.n_layers == m.cfg.n_layers
    assert w.embed is m.embed_tokens.weight and w.final_norm is m.norm.weight and w.lm_head is m.lm_head.weight
    for i, layer in enumerate(m.layers):
        assert w.wqs[i] is layer.self_attn.q_proj.weight and w.downs[i] is layer.mlp.down_proj.weight
        assert w.input_norms[i] is layer.input_layernorm.weight and w.k_caches[i] is layer.self_attn.k_cache
    weights, caches = w.flat()
    assert {id(t) for t in caches} == {id(layer.self_attn.k_cache) for layer in m.layers} | {
        id(layer.self_attn.v_cache) for layer in m.layers}
    assert not {id(t) for t in weights} & {id(t) for t in caches}
    back = DecodeWeights.unflatten(weights, caches)
    for name in DecodeWeights._fields:
        a, b = getattr(w, name), getattr(back, name)
        assert (a is b) if isinstance(a, torch.Tensor) else all(x is y for x, y in zip(a, b, strict=True)), name
    assert list(w.named()) == list(DecodeWeights._fields)
    assert all(len(v) == (m.cfg.n_layers if s.per_layer else 1) for v, s in zip(w.named().values(), SOURCES))


def _plan_args(m):
    c = m.cfg
    return m.rope_cos, m.rope_sin, c.n_heads, c.n_kv_heads, c.norm_eps


def test_the_cpp_plan_binds_every_field_by_name():
    """The C++ code reads only fields DecodeWeights has, binds them all (those it does not read too), and names
    a missing field, a short per-layer list or a tensor in the wrong dtype."""
    ext = build.extension()
    if ext is None:
        pytest.skip("no C++ toolchain")
    m = _model()
    w = m.decode_weights()
    assert set(ext.fields_read()) <= set(DecodeWeights._fields)
    assert sorted(ext.DecodePlan(w.named(), *_plan_args(m)).names()) == sorted(DecodeWeights._fields)
    named = w.named()
    del named["wos"]
    with pytest.raises(RuntimeError, match="the weights have no field 'wos'"):
        ext.DecodePlan(named, *_plan_args(m))
    with pytest.raises(RuntimeError, match=r"ups: one tensor per layer \(2\)"):
        ext.DecodePlan(w._replace(ups=w.ups[:1]).named(), *_plan_args(m))
    with pytest.raises(RuntimeError, match="post_norms: contiguous, in the embedding's dtype"):
        ext.DecodePlan(w._replace(post_norms=[t.double() for t in w.post_norms]).named(), *_plan_args(m))


def test_the_compiled_step_binds_its_plan_once(monkeypatch):
    """torch.compile traces `model.decode_weights()` without a graph break, so the compiled experimental step
    is one kernel op over the model's own tensors and its host plan is bound once, not at every step (an
    operator.attrgetter there broke the graph: the step ran on fresh copies and bound a plan per token)."""
    if build.extension() is None:
        pytest.skip("no C++ toolchain")
    from nativelab.kernels.cpu import decode
    from nativelab.kernels.ops import transformer
    from nativelab.models.llama import Generator, Sampling

    binds = []
    real = decode.transformer_tkg_token.bind
    monkeypatch.setattr(decode.transformer_tkg_token, "bind", lambda *a: binds.append(1) or real(*a))
    transformer.transformer_tkg_token_kernel._bound.clear()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = Llama.random("tiny", seed=0).copy_as("experimental", torch.float32, "neuron")
    gen = Generator(model, Sampling(greedy=True)).compile()
    with build.host_kernels(True), torch.inference_mode():
        gen.generate([1, 2, 3], 5)  # the prompt's prefill and four decode steps
    assert not torch._dynamo.utils.counters["graph_break"]
    assert binds == [1]


# Run on a copy of the package whose only change is one more DecodeWeights field (the edit below): the traced
# kernel (prefill and decode), the C++ plan (which runs both) and the model all take it with no other edit.
_ONE_EDIT = '    dummies: Annotated[list[Tensor], Source("input_layernorm.weight")]  # the test\'s dummy weight\n'
_AFTER = "    downs: Annotated[list[Tensor], Source(\"mlp.down_proj.weight\")]  # (dim, ffn)\n"

_SCRIPT = r"""
import json, sys
import torch
import nativelab
from nativelab.kernels.cpu import build
from nativelab.kernels.ops import transformer as T
from nativelab.models.llama import Generator, Llama, Sampling

assert nativelab.__file__.startswith(sys.argv[1]), nativelab.__file__  # the edited copy
from nativelab.models.llama.model import lab2_on_path
lab2_on_path()
import nki_ops
nki_ops.use("cpu")  # the library's CPU kernels, which read DecodeWeights (the NKI step reads DecodeStack)
src = Llama.random("tiny", seed=0)
seen = []  # (tokens per step, dummies) as the traced kernel's reference reads them, by name
real = T.reference_transformer_tkg
def spy(x, pos, cos, sin, w, *rest):
    seen.append([x.shape[1], len(w.dummies)])
    return real(x, pos, cos, sin, w, *rest)
T.reference_transformer_tkg = spy
tokens, names, refused = {}, None, None
for on in (False, True):
    with build.host_kernels(on):
        model = src.copy_as("experimental", torch.float32, "neuron")
        w = model.decode_weights()
        assert all(d is n for d, n in zip(w.dummies, w.input_norms, strict=True))
        T.transformer_tkg_token_kernel._bound.clear()
        with torch.no_grad():
            tokens[on] = Generator(model, Sampling(greedy=True)).generate([1, 2, 3, 4, 5], 4)  # prefill, decode
        if on:
            (step, _), = T.transformer_tkg_token_kernel._bound.values()  # the one plan both ran on
            names = sorted(step.plan.names())
            c = model.cfg
            bad = w._replace(dummies=[t.double().cpu() for t in w.dummies])
            try:
                build.extension().DecodePlan({k: [t.cpu() for t in v] for k, v in bad.named().items()},
                                             model.rope_cos.cpu(), model.rope_sin.cpu(), c.n_heads, c.n_kv_heads,
                                             c.norm_eps)
            except RuntimeError as e:
                refused = str(e)
base = Generator(src.copy_as("base", torch.float32, "neuron"), Sampling(greedy=True)).generate([1, 2, 3, 4, 5], 4)
print(json.dumps(dict(seen=seen, names=names, refused=refused, traced=tokens[False], host=tokens[True], base=base,
                      fields=list(T.DecodeWeights._fields))))
"""


@pytest.mark.slow  # a fresh interpreter on a copy of the package; two traced compiles of a tiny model
def test_one_more_field_is_the_only_edit_every_path_needs(tmp_path):
    """One line added to DecodeWeights (a per-layer dummy weight, the input norms again) and nothing else changed:
    on the experimental tier's CPU kernels (--kernels cpu), the model hands it over (`decode_weights()`), the traced kernel's reference reads it by name in the prompt's
    prefill and in a decode step, the C++ plan that runs both binds it (and refuses it in the wrong dtype, by
    name), and the tokens stay the base tier's, with the hand-written kernel and with the traced one."""
    if build.extension() is None:
        pytest.skip("no C++ toolchain")
    pkg = Path(nativelab.__file__).parent
    copy = tmp_path / "nativelab"
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__"))  # lab2's link copied as files
    target = copy / "kernels" / "ops" / "decode_weights.py"
    before = target.read_text()
    assert before.count(_AFTER) == 1, "the DecodeWeights field this test inserts after has moved"
    target.write_text(before.replace(_AFTER, _AFTER + _ONE_EDIT))
    changed = [d for d in difflib.unified_diff(before.splitlines(), target.read_text().splitlines(), lineterm="", n=0)
               if d[:1] in "+-" and not d.startswith(("+++", "---"))]
    assert changed == ["+" + _ONE_EDIT.rstrip("\n")]  # the whole edit
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", _SCRIPT, str(copy)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    n_layers = Llama.from_size("tiny").cfg.n_layers
    assert "dummies" in got["fields"]
    assert got["seen"] == [[5, n_layers], [1, n_layers]]  # the traced prefill and decode step (each traced once)
    assert got["names"] == sorted(got["fields"])  # the C++ plan bound it
    assert got["refused"] and "dummies: contiguous, in the embedding's dtype" in got["refused"]
    assert got["traced"] == got["host"] == got["base"]
