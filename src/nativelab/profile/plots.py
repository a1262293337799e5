"""PNG plots (matplotlib, Agg backend: no display needed): time by category per variant as stacked bars,
device traffic per token per variant, and tok/s per tier (`nativelab run --model all --plot`)."""

from __future__ import annotations

import io

from ._files import write_atomic
from .categories import CATEGORIES

_COLORS = {
    "matmul": "#4c72b0", "attention": "#dd8452", "normalization": "#55a868", "elementwise": "#c44e52",
    "sampling": "#8172b3", "copy": "#937860", "compiled graph": "#64b5cd", "fused layer": "#da8bc3",
    "fallback": "#e0b000", "host sync": "#8c8c8c", "compile": "#222222",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    _pyplot().close(fig)
    write_atomic(path, buf.getvalue())


def _category_axes(ax, rows) -> None:
    names = [r["name"] for r in rows]
    bottom = [0.0] * len(rows)
    for cat in CATEGORIES:
        vals = [1e3 * r["seconds_per_token_by_category"].get(cat, 0.0) for r in rows]
        if any(vals):
            ax.bar(names, vals, bottom=bottom, label=cat, color=_COLORS.get(cat))
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylim(0, 1.45 * max(bottom, default=0) or 1)  # room for the legend above the bars
    ax.set_ylabel("profiled time per token (ms)")
    ax.set_title("time by category")
    ax.legend(fontsize=7, ncol=2, loc="upper right")


def _traffic_axes(ax, rows) -> None:
    names = [r["name"] for r in rows]
    reads = [r["read_per_token"] / 1e6 for r in rows]
    writes = [r["written_per_token"] / 1e6 for r in rows]
    ax.bar(names, reads, label="read", color="#4c72b0")
    ax.bar(names, writes, bottom=reads, label="written", color="#dd8452")
    for i, (r, w) in enumerate(zip(reads, writes)):  # writes are small next to weight reads: say them
        ax.text(i, r + w, f"{r + w:.2f}\n({w:.2f} written)", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("device memory traffic per token (MB)")
    ax.set_title("traffic per token")
    ax.set_ylim(0, 1.2 * max(r + w for r, w in zip(reads, writes)) or 1)
    ax.legend(fontsize=8, loc="lower right")


def plot_compare(rows: list[dict], path, title: str = "") -> None:
    """Both charts side by side for the variants in `rows` (from `report.compare_rows`)."""
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    _category_axes(a, rows)
    _traffic_axes(b, rows)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def plot_categories(rows: list[dict], path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    _category_axes(ax, rows)
    _save(fig, path)


def plot_traffic(rows: list[dict], path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    _traffic_axes(ax, rows)
    _save(fig, path)


def plot_throughput(names: list[str], tok_per_s: list[float], path, title: str = "",
                    est_ms_per_token: list[dict] | None = None) -> None:
    """tok/s per tier as bars, labelled with the figure and the ratio to the first; with `est_ms_per_token`
    (each tier's estimated Trainium2 ms per token by part), a second panel of those parts as stacked bars."""
    plt = _pyplot()
    if est_ms_per_token:
        fig, (ax, est_ax) = plt.subplots(1, 2, figsize=(12, 4))
    else:
        fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(names, tok_per_s, color=["#8c8c8c", "#4c72b0", "#55a868"][: len(names)] or None)
    for i, v in enumerate(tok_per_s):
        ax.text(i, v, f"{v:.1f} ({v / tok_per_s[0]:.2f}x)", ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("tok/s")
    ax.set_title(title or "throughput per tier")
    if est_ms_per_token:
        _parts_axes(est_ax, names, est_ms_per_token)
    _save(fig, path)


def _parts_axes(ax, names: list[str], parts_per_tier: list[dict]) -> None:
    """Each tier's ms per token stacked by part (parts no tier has are left out), its total on top."""
    parts = [p for p in parts_per_tier[0] if any(d.get(p) for d in parts_per_tier)]
    bottom = [0.0] * len(names)
    cmap = _pyplot().get_cmap("tab10")
    for k, part in enumerate(parts):
        heights = [d.get(part, 0.0) for d in parts_per_tier]
        ax.bar(names, heights, bottom=bottom, label=part, color=cmap(k % 10))
        bottom = [b + h for b, h in zip(bottom, heights)]
    for i, total in enumerate(bottom):
        ax.text(i, total, f"{total:.2f} ms", ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("est. Trainium2 ms / token")
    ax.set_title("where the estimate puts a token's time")
    ax.legend(fontsize=7)
