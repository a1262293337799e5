"""nki.typing: the annotations kernels put on their parameters and tiles (`x: nt.tensor`,
`out: nt.mutable_tensor`, `qk: nt.tensor[m, n]`). They document; a trace reads nothing from them."""

from __future__ import annotations

__all__ = ["tensor", "mutable_tensor", "scalar"]


class _Annotation:
    """An annotation that may be subscripted with a shape or a dtype (`nt.tensor[128, 512]`)."""

    def __class_getitem__(cls, _shape):
        return cls


class tensor(_Annotation):  # noqa: N801 - NKI's name
    """A tensor argument or tile."""


class mutable_tensor(tensor):  # noqa: N801
    """A tensor argument the kernel writes."""


class scalar(_Annotation):  # noqa: N801
    """A plain number argument."""
