"""The report's plots of one run's clusters: their sizes and the contingency of classes and clusters
(used by :mod:`pipeline.runs.report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vbcore.data.metrics import acc, contingency, nmi

MAX_HEATMAP = 60  # rows / columns of the contingency table drawn (largest classes / clusters)
USED_COLOUR = "#1f77b4"  # clusters with at least one expected row
EMPTY_COLOUR = "#ff7f0e"  # kept components with less than one expected row (hatched)
DPI = 110  # of every plot's PNG


def sizes_title(r: dict[str, Any]) -> str:
    """'F clusters found of K = 80 components, P pruned during the fit': F is result.json's
    ``n_effective`` (:data:`pipeline.runs.directory.CLUSTERS_FOUND`), K the truncation asked for, or the
    one it
    grew to (result.json's ``truncation``)."""
    counts = np.asarray(r["counts"], dtype=np.float64)
    grown = (r.get("truncation") or {}).get("final")
    k = int(grown or r.get("n_components") or len(counts))  # pruned components have no count in result.json
    found = int(r["n_effective"]) if r.get("n_effective") is not None else int(np.sum(counts >= 1.0))
    pruned = f", {k - len(counts)} pruned during the fit" if k > len(counts) else ""
    return f"{found} clusters found of K = {k} components{pruned}"


def sizes_plot(r: dict[str, Any], title: str, path: Path) -> None:
    """Expected rows per kept component, sorted, log scale; empty ones (< 1 row) in their own colour."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

    counts = np.sort(np.asarray(r["counts"], dtype=np.float64))[::-1]
    kept = len(counts)
    fig, ax = plt.subplots(figsize=(max(6.0, min(14.0, 0.12 * kept + 4)), 3.8))
    alive = counts >= 1.0
    x = np.arange(1, kept + 1)
    ax.bar(x[alive], counts[alive], color=USED_COLOUR, label="cluster found: >= 1 expected row")
    if (~alive).any():  # drawn at their value, in a colour no used cluster has, with a hatch
        ax.bar(x[~alive], np.maximum(counts[~alive], 1e-3), color=EMPTY_COLOUR, hatch="//",
               edgecolor="#a0522d", label="empty: < 1 expected row")
    ax.axhline(1.0, color="#555", lw=0.8, ls="--")
    ax.set_yscale("log")
    # plain numbers: the log axis's default labels are TeX ($\mathdefault{10^{3}}$), shown raw with
    # text.parse_math off (which keeps a '$' in a run name as text)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("component (sorted by size)")
    ax.set_ylabel("expected rows (log scale)")
    ax.set_title(f"{title}: {sizes_title(r)}")
    # below the axes, never over the bars
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, borderaxespad=0.0, frameon=False)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def contingency_plot(labels: np.ndarray, pred: np.ndarray, title: str, path: Path,
                     weights: np.ndarray | None = None, names: list[str] | None = None) -> list[str]:
    """The contingency heat map of ``labels`` x ``pred`` at ``path``; ``names``: the class names the
    store records (``extractor_params['classes']``, label ``i`` is ``names[i]``), shown on the class
    axis instead of the codes. Returns the class axis's tick labels as drawn."""
    import matplotlib.pyplot as plt

    # weighted rows count w times (0: not at all), as in the fit; the table's rows and columns are
    # the classes and clusters of the rows counted, in np.unique's order (vbcore.data.metrics.contingency)
    table = contingency(labels, pred, weights).astype(np.float64)
    held = slice(None) if weights is None else weights > 0
    classes, clusters = np.unique(labels[held]), np.unique(pred[held])
    # the largest classes and clusters; clusters ordered by the class they mostly hold
    rows = np.argsort(-table.sum(1), kind="stable")[:MAX_HEATMAP]
    rows = np.sort(rows)
    cols = np.argsort(-table.sum(0), kind="stable")[:MAX_HEATMAP]
    sub = table[np.ix_(rows, cols)]
    order = np.lexsort((-sub.max(0), sub.argmax(0)))
    sub = sub[:, order]
    total = sub.sum(1, keepdims=True)
    frac = sub / np.where(total > 0, total, 1.0)
    fig, ax = plt.subplots(figsize=(min(14.0, 3 + 0.22 * sub.shape[1]), min(12.0, 2.5 + 0.22 * sub.shape[0])))
    im = ax.imshow(frac, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xlabel("cluster (ordered by majority class)")
    named = names is not None and all(0 <= int(c) < len(names) for c in classes)
    ax.set_ylabel("class" if named else "class (label)")
    if sub.shape[0] <= 40:
        ax.set_yticks(np.arange(sub.shape[0]), [str(names[int(c)]) if named else str(c)  # type: ignore[index]
                                                for c in classes[rows]])
    if sub.shape[1] <= 40:
        ax.set_xticks(np.arange(sub.shape[1]), [str(c) for c in clusters[cols][order]], rotation=90)
    shown = "" if (len(classes) <= MAX_HEATMAP and len(clusters) <= MAX_HEATMAP) else \
        f" (largest {sub.shape[0]} of {len(classes)} classes, {sub.shape[1]} of {len(clusters)} clusters)"
    ax.set_title(f"{title}: share of each class in each cluster{shown}\n"
                 f"NMI {nmi(labels, pred, weights):.3f}, ACC {acc(labels, pred, weights):.3f}")
    fig.colorbar(im, ax=ax, label="share of the class's rows")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    plt.close(fig)
    return ticks
