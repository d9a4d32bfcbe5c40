"""``vbcluster report``: one self-contained HTML file (PNGs embedded as base64, and written beside it).

A summary table (learner, model, kind of bound, iterations, data passes, K, clusters found
(:data:`pipeline.runs.directory.CLUSTERS_FOUND`), ELBO per row, metrics); the ELBO per row against data
passes, one
panel per group of runs whose
bounds compare (same store, model and kind of bound: :mod:`pipeline.runs.report_curves`), side by side;
for every run the sorted cluster sizes (expected rows per component, like the E[v] bar plot of
Lim & Jiang 2024), a contingency heat map against the store's labels when it has them, a 2-D PCA
scatter of a sample of rows coloured by cluster, for ``image:`` stores the segmentation, and its
clusters with their sizes and most typical rows (ids, image thumbnails: :mod:`pipeline.runs.report_clusters`,
found by :mod:`pipeline.runs.typical` in the pass that labels the rows). Plots
are drawn with matplotlib's Agg backend, their text at least :data:`MIN_FONT_PT`; the run table's text
cells wrap (it fits 1200 px), and an image is never shown so narrow that its text is under
:data:`READABLE_PX` on screen (on a phone it scrolls sideways instead).

Everything is written into a temporary directory that is renamed into place when complete; a run
directory without results is refused before anything is written. Every report directory holds the
marker file ``.vbcluster-report``: an existing ``--out`` directory is replaced only when it holds it
(or is empty, or is a report of a vbcluster that wrote no marker), never a directory of the user's.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.files import leftovers
from pipeline.files.atomic import named_oserror
from pipeline.runs.directory import (
    ASSIGNMENTS,
    CLUSTERS_FOUND,
    POSTERIOR,
    RESULT,
    load_run_model,
    publish_dir,
    read_result,
    verify_posterior,
)
from pipeline.runs.lowrank_model import LOWRANK_FILE, LowRankModel, is_lowrank_run
from pipeline.runs.report_clusters import CSS as CLUSTERS_CSS
from pipeline.runs.report_clusters import EXEMPLARS, clusters_html
from pipeline.runs.report_curves import (
    bound_label,
    data_passes,
    elbo_figures,
    k_cell,
    model_label,
    run_prior,
    selection_note,
)
from pipeline.runs.report_plots import (
    DPI,
    contingency_plot,
    sizes_plot,
)
from pipeline.runs.typical import typical_rows
from vbcore.errors import InputError

REPORT_DIR = "report"
REPORT_HTML = "report.html"
MARKER = ".vbcluster-report"  # in every report directory: the only kind of directory report replaces
SAMPLE_ROWS = 3000
MIN_FONT_PT = 9  # the smallest text in any plot (tick labels, legends)
#: every plot's text sizes: at DPI, 9 pt is 13.75 px of the PNG
FONTS = {"font.size": 10, "axes.titlesize": 10, "axes.labelsize": 10, "xtick.labelsize": MIN_FONT_PT,
         "ytick.labelsize": MIN_FONT_PT, "legend.fontsize": MIN_FONT_PT, "figure.titlesize": 10}
READABLE_PX = 9  # the smallest text on screen: an image is never drawn narrower than this allows


def _check_run(run_dir: Path) -> dict[str, Any]:
    model_file = LOWRANK_FILE if is_lowrank_run(run_dir) else POSTERIOR
    missing = [n for n in (RESULT, model_file) if not (run_dir / n).is_file()]
    if missing:
        raise InputError(f"{run_dir}: no {' or '.join(missing)}: not a finished vbcluster run directory "
                         "(run `vbcluster fit` or `vbcluster resume` first)")
    verify_posterior(run_dir)  # the posterior is the one result.json describes (its sha256)
    r = read_result(run_dir)
    for key in ("n_rows", "n_features", "n_components"):  # numbers the page and the plots compute with
        v = r.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InputError(f"{run_dir / RESULT}: {key} must be a positive integer, got {v!r:.60}; "
                             "the file was edited or damaged: refit the run")
    return r


def display(text: str) -> str:
    """A path or name as the page and the plots show it: undecodable bytes (a run directory whose
    name is not UTF-8, read by Python as surrogate escapes) become U+FFFD instead of failing the
    UTF-8 page."""
    return os.fsencode(text).decode("utf-8", errors="replace")


def write_report(run_dirs: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
                 out: str | os.PathLike[str] | None = None, *, sample: int = SAMPLE_ROWS,
                 seed: int = 0, engine: Any = None) -> Path:
    """Write ``report.html`` and its PNGs; returns the HTML file's path.

    Parameters
    ----------
    run_dirs : path or list of paths
        Finished run directories (result.json and posterior.npz).
    out : path, optional
        The report directory; default ``RUN_DIR/report`` of the first run. A report written before
        (it holds the :data:`MARKER` file) is replaced whole; any other existing, non-empty directory
        is refused.
    sample : int
        Rows drawn (seeded) for the PCA scatter.
    engine : pipeline engine, optional
        Where the pass over the rows (their labels and each cluster's most typical rows) runs: a
        :class:`~pipeline.engine.engines.DaskEngine` maps it over the chunks on its workers; default
        in-process, streaming the chunks.
    """
    import matplotlib

    matplotlib.use("Agg")
    dirs = [Path(d) for d in ([run_dirs] if isinstance(run_dirs, (str, os.PathLike)) else run_dirs)]
    if not dirs:
        raise InputError("report: no run directory given")
    results = [_check_run(d) for d in dirs]  # every run checked before anything is written
    target = Path(out) if out is not None else dirs[0] / REPORT_DIR
    check_replaceable(target)  # only a report vbcluster wrote is ever replaced
    try:
        leftovers.clean(target)  # the .report.tmp-* of a killed report (its writer is gone)
        tmp = leftovers.make_temp(target)  # its writer recorded, for the next report to clean
    except OSError as exc:  # disk full, permission denied: the file named
        raise named_oserror(exc, target) from exc
    try:
        (tmp / MARKER).write_text(json.dumps({"written_by": "vbcluster report",
                                              "runs": [str(d) for d in dirs]}))
        with matplotlib.rc_context({"text.parse_math": False, **FONTS}):  # a '$' in a name is text, not TeX
            _write_pages(dirs, results, tmp, sample, seed, engine)
        publish_dir(tmp, target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        leftovers.release(tmp)
        if isinstance(exc, OSError):  # disk full while writing a plot or the page: name the report
            raise named_oserror(exc, target) from exc
        raise
    leftovers.release(tmp)
    return target / REPORT_HTML


def _write_pages(dirs: list[Path], results: list[dict[str, Any]], tmp: Path, sample: int, seed: int,
                 engine: Any) -> None:
    """The plots and the page, into the temporary report directory ``tmp``."""
    sections = []
    panels = elbo_figures(dirs, results, [_name(d, r) for d, r in zip(dirs, results, strict=True)], tmp)
    figures = [(name, caption) for name, caption, _ in panels]
    for i, (d, r) in enumerate(zip(dirs, results, strict=True)):
        sections.append(_run_section(i, d, r, tmp, sample, seed, engine))
    panel = {i: (name[5:-4] or "-") if len(panels) > 1 else "-" for name, _, members in panels
             for i in members}
    page = _html(dirs, results, figures, sections, tmp, panel)
    (tmp / REPORT_HTML).write_text(page, encoding="utf-8")


def check_replaceable(target: Path) -> None:
    """Refuse to replace ``target`` unless it is free, an empty directory, or a report vbcluster wrote:
    one holding the :data:`MARKER` file, or (written before the marker) nothing but ``report.html``
    titled "vbcluster report" and PNG files."""
    if target.is_symlink():
        raise InputError(f"{target} is a symbolic link; refusing to replace it with a report: choose another "
                         "--out")
    if not target.exists():
        return
    if not target.is_dir():
        raise InputError(f"{target} exists and is not a directory; refusing to replace it with a report: "
                         "choose another --out")
    entries = sorted(p.name for p in target.iterdir())
    if not entries or MARKER in entries or _old_report(target, entries):
        return
    held = ", ".join(entries[:3]) + (" ..." if len(entries) > 3 else "")
    raise InputError(f"{target} exists and is not a vbcluster report (no {MARKER} file; it holds {held}); "
                     "refusing to replace it: choose another --out, or remove the directory yourself")


def _old_report(target: Path, entries: list[str]) -> bool:
    """A report of a vbcluster that wrote no marker: report.html (its title) and PNGs only."""
    if REPORT_HTML not in entries or not all(n == REPORT_HTML or n.endswith(".png") for n in entries):
        return False
    try:
        with open(target / REPORT_HTML, encoding="utf-8", errors="replace") as f:
            return "<title>vbcluster report</title>" in f.read(4096)
    except OSError:
        return False


# ---- plots --------------------------------------------------------------------------------------
def _name(d: Path, r: dict[str, Any]) -> str:
    return display(f"{d.resolve().name} ({r.get('learner', '?')})")


def _cluster_colours(pred: np.ndarray, top: int = 20) -> tuple[np.ndarray, list[int]]:
    import matplotlib

    ids, counts = np.unique(pred, return_counts=True)
    biggest = [int(i) for i in ids[np.argsort(-counts, kind="stable")][:top]]
    cmap = matplotlib.colormaps["tab20"]
    colours = np.tile(np.array([[0.75, 0.75, 0.75, 0.5]]), (len(pred), 1))
    for j, c in enumerate(biggest):
        colours[pred == c] = cmap(j % 20)
    return colours, biggest


def _pca_plot(X: np.ndarray, pred: np.ndarray, means: np.ndarray, title: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    mu = X.mean(0)
    _, s, vt = np.linalg.svd(X - mu, full_matrices=False)
    P = vt[:2].T
    Z = (X - mu) @ P
    var = (s[:2] ** 2) / max((s**2).sum(), 1e-300)
    colours, biggest = _cluster_colours(pred)
    fig, ax = plt.subplots(figsize=(7, 6))
    ax.scatter(Z[:, 0], Z[:, 1], c=colours, s=6, linewidths=0)
    M = (means - mu) @ P
    used = np.unique(pred)
    ax.scatter(M[used, 0], M[used, 1], marker="x", c="black", s=30, label="cluster means")
    ax.set_xlabel(f"PC 1 ({100 * var[0]:.1f}% of variance)")
    ax.set_ylabel(f"PC 2 ({100 * var[1]:.1f}% of variance)" if len(var) > 1 else "PC 2")
    more = "" if len(used) <= len(biggest) else f"; the {len(biggest)} largest clusters coloured, others grey"
    ax.set_title(f"{title}: {len(X)} sampled rows{more}")
    ax.legend(loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _segmentation_plot(store: Any, pred: np.ndarray, means: np.ndarray, title: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    h, w = (int(v) for v in store.attrs["extractor_params"]["shape"])
    X = store.read()
    ids = store.read_ids()
    pix = np.asarray(ids if ids is not None else np.arange(len(X)), dtype=np.int64)
    rgb = np.zeros((h * w, 3))
    rgb[pix] = (X[:, :3] + 1.0) / 2.0  # features hold colour c as c/127.5 - 1
    seg = np.zeros((h * w, 3))
    seg[pix] = (means[pred, :3] + 1.0) / 2.0  # each pixel painted with its cluster's mean colour
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 5.5 * h / max(w, 1) + 1))
    a1.imshow(np.clip(rgb.reshape(h, w, 3), 0, 1))
    a1.set_title("image (as stored)")
    a2.imshow(np.clip(seg.reshape(h, w, 3), 0, 1))
    a2.set_title(f"{title}: segmentation, {len(np.unique(pred))} clusters (mean colours)")
    for a in (a1, a2):
        a.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


# ---- one run ------------------------------------------------------------------------------------
def _run_section(i: int, d: Path, r: dict[str, Any], tmp: Path, sample: int, seed: int,
                 engine: Any) -> dict[str, Any]:
    from pipeline.engine.sources import StoreSource
    from pipeline.store.features import FeatureStore

    title = display(d.resolve().name)
    figs: list[tuple[str, str]] = []
    notes: list[str] = []
    trunc = r.get("truncation") or {}
    if trunc.get("limit_hit"):
        from vbcore.errors import truncation_message

        notes.append("warning: " + truncation_message(trunc))
    if (chosen := selection_note(r)) is not None:
        notes.append(chosen)
    sizes_plot(r, title, tmp / f"run{i}-sizes.png")
    figs.append((f"run{i}-sizes.png", "Cluster sizes (expected rows per component, sorted)"))
    try:
        src = StoreSource(r["store"])
        if src.fingerprint != r.get("store_fingerprint"):
            raise InputError(f"{r['store']} changed since the fit (fingerprint differs)")
    except Exception as exc:  # noqa: BLE001 - the store may be gone or changed: plots from result.json only
        notes.append(f"store plots skipped: {exc}")
        return {"dir": d, "result": r, "figs": figs, "notes": notes}
    model = load_run_model(d)  # one pass: labels and each cluster's top rows
    typical = model.typical_rows(src, EXEMPLARS, engine) if isinstance(model, LowRankModel) \
        else typical_rows(model, src, EXEMPLARS, engine)
    pred = _stored_assignments(d, r)
    if pred is None:
        pred = typical.labels
    else:
        notes.append(f"clusters read from {r['store']}/{ASSIGNMENTS}/{d.resolve().name}")
    labels, weights = src.labels(), src.all_weights()
    if labels is not None:
        names = FeatureStore.open(r["store"]).attrs.get("extractor_params", {}).get("classes")
        names = names if isinstance(names, list) else None  # (a synthetic store's is its class count)
        contingency_plot(labels, pred, title, tmp / f"run{i}-contingency.png", weights, names)
        figs.append((f"run{i}-contingency.png", "Contingency against the store's labels"))
    else:
        notes.append("the store has no labels: no contingency table")
    held = np.arange(src.n_rows) if weights is None else np.flatnonzero(weights > 0)  # (no weight-0 row)
    rows = np.sort(np.random.default_rng(seed).choice(held, size=min(sample, held.size), replace=False))
    store = FeatureStore.open(r["store"])
    clusters = clusters_html(store, typical, r.get("counts"))
    X = np.asarray(store.features.get_orthogonal_selection((rows, slice(None))), dtype=np.float64)
    means = np.asarray(model.means_, dtype=np.float64)
    if model.projection_ is not None:  # a fit on projected rows (pca): its means in the store's space
        means = model.projection_.inverse(means)
    _pca_plot(X, pred[rows], means, title, tmp / f"run{i}-pca.png")
    figs.append((f"run{i}-pca.png", "PCA of a sample of rows, coloured by cluster"))
    if store.attrs.get("extractor") == "pixels-rgb-rowcol":
        _segmentation_plot(store, pred, means, title, tmp / f"run{i}-segmentation.png")
        figs.append((f"run{i}-segmentation.png", "Segmentation (image store)"))
    return {"dir": d, "result": r, "figs": figs, "notes": notes, "clusters": clusters}


def _stored_assignments(d: Path, r: dict[str, Any]) -> np.ndarray | None:
    """The labels `vbcluster assign` wrote for this run, when they belong to it and to this store."""
    import zarr

    path = Path(r["store"]) / ASSIGNMENTS / d.resolve().name
    if not (path / "zarr.json").is_file():
        return None
    g = zarr.open_group(str(path), mode="r")
    if (g.attrs.get("run_dir") != str(d.resolve())
            or g.attrs.get("store_fingerprint") != r.get("store_fingerprint")
            or g.attrs.get("posterior_sha256") != r.get("posterior_sha256")):  # not from an older fit
        return None
    arr = g["labels"]
    labels = np.asarray(arr[:]) if isinstance(arr, zarr.Array) else None
    if labels is None:
        return None
    return labels if labels.shape == (int(r["n_rows"]),) else None


# ---- HTML ---------------------------------------------------------------------------------------
def _img(tmp: Path, name: str, caption: str) -> str:
    """A plot, embedded; never drawn narrower than the width at which its smallest text
    (MIN_FONT_PT at DPI) is READABLE_PX on screen: on a phone the figure scrolls sideways instead."""
    from PIL import Image

    data = (tmp / name).read_bytes()
    with Image.open(tmp / name) as im:
        width = im.size[0]
    min_width = min(width, math.ceil(width * READABLE_PX / (MIN_FONT_PT * DPI / 72)))
    encoded = base64.b64encode(data).decode("ascii")
    return (f'<figure><img alt="{html.escape(caption)}" style="--minw:{min_width}px" '
            f'src="data:image/png;base64,{encoded}">'
            f"<figcaption>{html.escape(caption)} ({html.escape(name)})</figcaption></figure>")


def _fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "-"
    return html.escape(format(v, spec) if spec else str(v))


CSS = (
    "body{font-family:sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;line-height:1.4}"
    ".scroll{overflow-x:auto;-webkit-overflow-scrolling:touch;max-width:100%}"
    "table{border-collapse:collapse;font-size:85%}td,th{border:1px solid #ccc;padding:3px 5px;"
    "text-align:right;white-space:nowrap}th{background:#f3f3f3;white-space:normal}td.l,th.l{text-align:left}"
    "td.l{white-space:normal;overflow-wrap:anywhere;min-width:4em}"
    "img{max-width:100%;height:auto;min-width:var(--minw,0)}figure{margin:1em 0;overflow-x:auto}"
    "figcaption{color:#555;font-size:90%}"
    "h2{font-size:1.2em;overflow-wrap:anywhere}p{overflow-wrap:anywhere}"
    ".panels{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,480px),1fr));gap:0 1em}"
    "@media (max-width:700px){body{padding:0 .5em;font-size:15px}table{font-size:80%}h1{font-size:1.4em}}"
)
COLUMNS = ("run", "learner", "model", "bound", "ELBO panel", "iterations", "data passes", "K",
           "clusters found", "ELBO per row", "NMI", "ACC", "ARI", "seconds", "warm start from")
LEFT = {COLUMNS.index(c) for c in ("run", "learner", "model", "bound", "warm start from")}  # text: wraps


def _row(d: Path, r: dict[str, Any], panel: str) -> str:
    m = r.get("metrics") or {}
    passes, _ = data_passes(d, r)
    elbo = float(r["elbo"]) / float(r["n_rows"]) if r.get("n_rows") else None
    cells = (display(d.resolve().name), r.get("learner"), model_label(r, run_prior(d)), bound_label(r), panel,
             r.get("n_iter"),
             _fmt(float(passes[-1]), ".3g"), k_cell(r), r.get("n_effective"), _fmt(elbo, ".6g"),
             _fmt(m.get("nmi"), ".3f"), _fmt(m.get("acc"), ".3f"),
             _fmt(m.get("ari"), ".3f"), _fmt(r.get("seconds"), ".1f"),
             Path(r["warm_start_from"]).name if r.get("warm_start_from") else None)
    return "<tr>" + "".join(f"<td{' class=l' if j in LEFT else ''}>{_fmt(c)}</td>"
                            for j, c in enumerate(cells)) + "</tr>"


def _html(dirs: list[Path], results: list[dict[str, Any]], figures: list[tuple[str, str]],
          sections: list[dict[str, Any]], tmp: Path, panel: dict[int, str]) -> str:
    head = "".join(f"<th{' class=l' if j in LEFT else ''}>{c}</th>" for j, c in enumerate(COLUMNS))
    body = [_row(d, r, panel[i]) for i, (d, r) in enumerate(zip(dirs, results, strict=True))]
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>vbcluster report</title><style>{CSS}{CLUSTERS_CSS}</style></head><body>",
        f"<h1>vbcluster report</h1><p>written {html.escape(time.strftime('%Y-%m-%d %H:%M:%S %Z'))}. "
        "ELBO per row: the evidence lower bound divided by the store's rows, in nats; bounds compare "
        "only within one ELBO panel (same store, model and kind of bound). K: the truncation asked "
        f"for; {html.escape(CLUSTERS_FOUND)}. Data passes: rows read divided by the store's rows.</p>",
        f"<div class='scroll'><table><tr>{head}</tr>{''.join(body)}</table></div>",
    ]
    if len(figures) > 1:
        parts.append("<p>The runs bound different models or use different kinds of bound, so their ELBOs "
                     "are drawn in separate panels, one per group that compares (the table's ELBO panel)."
                     "</p>")
    parts += ["<div class='panels'>", *(_img(tmp, n, c) for n, c in figures), "</div>"]
    for s in sections:
        r = s["result"]
        parts.append(f"<h2>{html.escape(_name(s['dir'], r))}</h2><p>store {_fmt(display(str(r['store'])))}, "
                     f"{_fmt(r['n_rows'])} rows x {_fmt(r['n_features'])} features; run directory "
                     f"{_fmt(display(str(s['dir'].resolve())))}</p>")
        parts += [f"<p><em>{html.escape(n)}</em></p>" for n in s["notes"]]
        parts += [_img(tmp, n, c) for n, c in s["figs"]]
        parts.append(s.get("clusters", ""))
    parts.append("</body></html>")
    return "\n".join(parts)
