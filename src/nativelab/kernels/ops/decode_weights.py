"""The experimental tier's kernel signature, by name: every tensor of a model that the whole-step kernels
(`transformer_tkg`, `transformer_tkg_token`: a decode step or a prompt's prefill) read or write.

`DecodeWeights` is the one place that says which tensors they are, where each comes from in the Llama modules,
and in what order they travel. A custom op's schema can only say lists, so the ops take two flat lists:
`weights` (read only: baked into the traced kernel as constants, bound once by the C++ plan) and `caches`
(written by every step). `flat()` makes them, field by field in the order below (a per-layer field spliced in
layer order); `unflatten` gives the structure back, and every implementation reads it by name: the traced
reference, the C++ kernels (`named()`: a dict the C++ code reads once per model, csrc/decode.cpp `bind_model`),
the Triton twin. A new weight (a bias, a QK-norm) is one field here and the code that uses it; no list order,
argument position or schema elsewhere changes."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Annotated, NamedTuple

from torch import Tensor


@dataclass(frozen=True)
class Source:
    """Where a field comes from: `path` on the model (`per_layer` False) or on each of `model.layers`;
    `written`: the kernels write it (a KV cache), so it travels in `caches`, never baked."""
    path: str
    per_layer: bool = True
    written: bool = False


def _model(path: str) -> Source:
    return Source(path, per_layer=False)


class DecodeWeights(NamedTuple):
    """A Llama's tensors for the whole-step kernels: per-model tensors, and lists holding one tensor per layer."""
    embed: Annotated[Tensor, _model("embed_tokens.weight")]  # (vocab, dim)
    input_norms: Annotated[list[Tensor], Source("input_layernorm.weight")]  # (dim,)
    wqs: Annotated[list[Tensor], Source("self_attn.q_proj.weight")]  # (heads * head_dim, dim)
    wks: Annotated[list[Tensor], Source("self_attn.k_proj.weight")]  # (kv_heads * head_dim, dim)
    wvs: Annotated[list[Tensor], Source("self_attn.v_proj.weight")]  # (kv_heads * head_dim, dim)
    wos: Annotated[list[Tensor], Source("self_attn.o_proj.weight")]  # (dim, heads * head_dim)
    post_norms: Annotated[list[Tensor], Source("post_attention_layernorm.weight")]  # (dim,)
    gates: Annotated[list[Tensor], Source("mlp.gate_proj.weight")]  # (ffn, dim)
    ups: Annotated[list[Tensor], Source("mlp.up_proj.weight")]  # (ffn, dim)
    downs: Annotated[list[Tensor], Source("mlp.down_proj.weight")]  # (dim, ffn)
    final_norm: Annotated[Tensor, _model("norm.weight")]  # (dim,)
    lm_head: Annotated[Tensor, _model("lm_head.weight")]  # (vocab, dim)
    k_caches: Annotated[list[Tensor], Source("self_attn.k_cache", written=True)]  # (B, kv_heads, max_seq, head_dim)
    v_caches: Annotated[list[Tensor], Source("self_attn.v_cache", written=True)]  # (B, kv_heads, max_seq, head_dim)

    @classmethod
    def of(cls, model) -> DecodeWeights:
        """The tensors of a Llama (`model.layers[i]`'s modules, the model's own), as they are now."""
        layers = model.layers
        return cls(*[[_attribute(layer, path) for layer in layers] if s.per_layer else _attribute(model, path)
                     for s, path in zip(SOURCES, _PATHS)])

    @property
    def n_layers(self) -> int:
        return len(self[_FIRST_PER_LAYER])

    def flat(self) -> tuple[list[Tensor], list[Tensor]]:
        """(weights, caches): the ops' two lists, fields in order, a per-layer field's tensors in layer order."""
        weights, caches = [], []
        for s, v in zip(SOURCES, self):
            (caches if s.written else weights).extend(v if s.per_layer else (v,))
        return weights, caches

    @classmethod
    def unflatten(cls, weights: list[Tensor], caches: list[Tensor]) -> DecodeWeights:
        """The structure `flat()` made these lists from; a list of the wrong length is a ValueError naming it."""
        per_model = sum(not s.per_layer for s in SOURCES)
        per_layer_weights = sum(s.per_layer and not s.written for s in SOURCES)
        n, rest = divmod(len(weights) - per_model, per_layer_weights)
        if n < 1 or rest:
            raise ValueError(f"weights: expected {per_model} + {per_layer_weights} x layers tensors "
                             f"(DecodeWeights.flat()), got {len(weights)}")
        if len(caches) != _N_WRITTEN * n:
            raise ValueError(f"caches: expected {_N_WRITTEN} x {n} layers tensors (DecodeWeights.flat()), "
                             f"got {len(caches)}")
        fields, at = [], {False: 0, True: 0}
        for s in SOURCES:
            src, i = (caches if s.written else weights), at[s.written]
            fields.append(src[i:i + n] if s.per_layer else src[i])
            at[s.written] += n if s.per_layer else 1
        return cls(*fields)

    def named(self) -> dict[str, list[Tensor]]:
        """Every field by name, a per-model tensor as a one-element list (what the C++ kernels bind by name)."""
        return {name: list(v) if s.per_layer else [v] for name, s, v in zip(self._fields, SOURCES, self)}

    def check(self, hidden: int) -> None:
        """Every per-layer list holds one tensor per layer; the LM head is [vocab, hidden]. ValueError naming
        the field otherwise."""
        n = self.n_layers
        for name, s, v in zip(self._fields, SOURCES, self):
            if s.per_layer and len(v) != n:
                raise ValueError(f"{name}: expected one tensor per layer ({n}), got {len(v)}")
        if self.lm_head.dim() != 2 or self.lm_head.shape[1] != hidden:
            raise ValueError(f"lm_head: expected [vocab, {hidden}], got {tuple(self.lm_head.shape)}")


def _attribute(obj, path: tuple[str, ...]):
    """obj.a.b for path ("a", "b"): plain getattr, which torch.compile traces (it cannot call an
    operator.attrgetter: a graph break there cost the compiled experimental step its bound plan, 560 -> 200
    tok/s)."""
    for name in path:
        obj = getattr(obj, name)
    return obj


# Each field's Source, in field order (read from the annotations above: they are the one table).
SOURCES: tuple[Source, ...] = tuple(typing.get_type_hints(DecodeWeights, include_extras=True)[f].__metadata__[0]
                                    for f in DecodeWeights._fields)
_PATHS = tuple(tuple(s.path.split(".")) for s in SOURCES)
_FIRST_PER_LAYER = next(i for i, s in enumerate(SOURCES) if s.per_layer)
_N_WRITTEN = sum(s.written for s in SOURCES)
