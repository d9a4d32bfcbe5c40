"""What the report says about a run's model, its bound and its ELBO curve (used by
:mod:`pipeline.runs.report`).

Two bounds share an axis only when they bound the same quantity: the same data (store fingerprint),
the same model (covariance type, weight type, priors as the fit filled them in, e.g. alpha0 = 1/K
or N, the fixed variance) and the same kind of bound (exact, or a minibatch estimate). The
truncation is not part of the model when the weight concentration does not depend on it (the DP
with ``priors='empirical'``, alpha0 = 1): runs of different K are one model and share an axis.
Hyperparameters re-estimated from the bound (empirical Bayes) are fitted, not set: each run's bound
is a lower bound on the same maximised evidence, so their fitted values are not part of the key.
:func:`comparable_groups` splits runs into such groups; the report draws one panel per group, side
by side. The x axis is in **data passes** (rows read / N): for the full-pass learners the engine
passes recorded in ``iterations.jsonl``, for the minibatch learners ``minibatch / N`` per step (plus
one pass per step with ``elbo='full'``), so a minibatch step and a VB EM iteration are not drawn as
the same amount of work.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: result.json settings that define the model (beyond the data)
MODEL_SETTINGS = ("covariance_type", "weight_concentration_prior_type", "weight_concentration_prior",
                  "mean_precision_prior", "mean_prior", "degrees_of_freedom_prior", "covariance_prior",
                  "fixed_variance", "reg_covar", "prior_defaults")
#: posterior.npz metadata of the prior as used (defaults filled in: alpha0 = 1/K or N, sigma^2, ...)
PRIOR_SCALARS = ("weight_concentration", "mean_precision", "degrees_of_freedom", "fixed_variance")
ITERATIONS_LOG = "iterations.jsonl"
WEIGHTS = {"dirichlet_process": "DP", "dirichlet_distribution": "Dirichlet"}


def learner_of(r: dict[str, Any]) -> Any:
    """The run's registered learner class (None: a learner this installation does not know)."""
    from pipeline.fit.learners import LEARNERS

    return LEARNERS.get(str(r.get("learner")))


def learner_options(r: dict[str, Any]) -> dict[str, Any]:
    """The learner's options as the fit used them: its defaults updated by the run's settings."""
    cls = learner_of(r)
    opts: dict[str, Any] = dict(cls.options) if cls is not None else {}
    opts.update((r.get("settings") or {}).get("learner_options") or {})
    return opts


def is_minibatch(r: dict[str, Any]) -> bool:
    """Whether the run's learner reads one minibatch per iteration (the learners with a ``minibatch``
    option)."""
    return "minibatch" in learner_options(r)


def bound_kind(r: dict[str, Any]) -> str:
    """'exact', or 'minibatch estimate' for the stochastic learners' default ``elbo='minibatch'``."""
    if r.get("bound_kind"):  # written by fits that record it themselves
        return str(r["bound_kind"])
    return "minibatch estimate" if learner_options(r).get("elbo") == "minibatch" else "exact"


def history_se(r: dict[str, Any]) -> np.ndarray | None:
    """The standard errors (nats) of a run's minibatch-estimate ELBO history (NaN where not known),
    or None for exact histories and runs written before they were recorded."""
    se = (r.get("bound") or {}).get("history_se")
    if not se:
        return None
    return np.array([np.nan if v is None else float(v) for v in se], dtype=np.float64)


def bound_label(r: dict[str, Any]) -> str:
    """The report's "bound" cell: the kind, and for estimates their median standard error per row."""
    kind, se = bound_kind(r), history_se(r)
    if se is None or not np.isfinite(se).any() or not r.get("n_rows"):
        return kind
    return f"{kind} (SE {np.nanmedian(se) / float(r['n_rows']):.2g}/row)"


def run_prior(run_dir: Path) -> dict[str, Any]:
    """The prior's scalars as the fit used them (defaults filled in), from posterior.npz's metadata."""
    from pipeline.runs.directory import POSTERIOR

    try:
        with np.load(Path(run_dir) / POSTERIOR, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
    except (OSError, KeyError, ValueError):
        return {}
    empirical = set(meta.get("empirical") or [])
    return {k: meta.get(k) for k in PRIOR_SCALARS if k not in empirical}


def model_label(r: dict[str, Any], prior: dict[str, Any]) -> str:
    """A short description of the model, e.g. 'diag, DP, alpha0 = 0.0125'."""
    s = r.get("settings") or {}
    weights = WEIGHTS.get(str(s.get("weight_concentration_prior_type")), "?")
    text = f"{s.get('covariance_type', '?')}, {weights}"
    if prior.get("weight_concentration") is not None:
        text += f", alpha0 = {float(prior['weight_concentration']):.4g}"
    if s.get("covariance_type") == "fixed" and prior.get("fixed_variance") is not None:
        text += f", sigma^2 = {float(prior['fixed_variance']):.4g}"
    custom = [k for k in ("mean_precision_prior", "mean_prior", "degrees_of_freedom_prior",
                          "covariance_prior") if s.get(k) is not None]
    if s.get("prior_defaults") in ("empirical", "bound"):
        text += ", empirical Bayes" + (" (nu0 too)" if s.get("prior_defaults") == "bound" else "")
    return text + (f" (set: {', '.join(custom)})" if custom else "")


def k_cell(r: dict[str, Any]) -> str:
    """K as the report and the fit summary show it: the truncation, ``start -> final`` where it grew,
    with ``(limit)`` where the answer touched a limit (result.json's ``truncation``)."""
    t = r.get("truncation") or {}
    k = str(r.get("n_components"))
    if t.get("final") is not None and t.get("final") != t.get("start"):
        k = f"{t['start']} -> {t['final']}"
    return k + (" (limit)" if t.get("limit_hit") else "")


def model_key(r: dict[str, Any], prior: dict[str, Any]) -> tuple[str, ...]:
    """Runs with equal keys bound the same evidence with the same kind of bound."""
    s = r.get("settings") or {}
    return (str(r.get("store_fingerprint")), *(json.dumps(s.get(k), sort_keys=True) for k in MODEL_SETTINGS),
            json.dumps(prior, sort_keys=True), bound_kind(r))


def comparable_groups(results: Sequence[dict[str, Any]], priors: Sequence[dict[str, Any]]) -> list[list[int]]:
    """Indices of the runs grouped by :func:`model_key`, in the order the runs were given."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, (r, prior) in enumerate(zip(results, priors, strict=True)):
        groups.setdefault(model_key(r, prior), []).append(i)
    return list(groups.values())


def _logged_passes(run_dir: Path, n_iter: int) -> np.ndarray | None:
    """Engine passes after each iteration, from iterations.jsonl (the last record per iteration)."""
    path = run_dir / ITERATIONS_LOG
    if not path.is_file():
        return None
    by_iter: dict[int, float] = {}
    # bytes that are not UTF-8 (a damaged or edited log) make their line unreadable, not the report
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
            by_iter[int(rec["iteration"])] = float(rec["passes"])
        except (ValueError, KeyError, TypeError):
            continue
    if not all(i in by_iter for i in range(1, n_iter + 1)):
        return None
    return np.array([by_iter[i] for i in range(1, n_iter + 1)])


def minibatch_step(r: dict[str, Any]) -> float | None:
    """Data passes per iteration of a minibatch learner (``minibatch / N``, plus 1 with
    ``elbo='full'``); None for the full-pass learners."""
    if not is_minibatch(r):
        return None
    opts = learner_options(r)
    per_step = min(float(opts["minibatch"]), float(r["n_rows"])) / float(r["n_rows"])
    return per_step + (1.0 if opts.get("elbo") == "full" else 0.0)


def data_passes(run_dir: Path, r: dict[str, Any]) -> tuple[np.ndarray, str]:
    """x values (data passes after each iteration of the ELBO history) and how they were obtained."""
    n = len(r.get("elbo_history") or [r["elbo"]])
    it = np.arange(1, n + 1, dtype=np.float64)
    per_step = minibatch_step(r)
    if per_step is not None:
        return it * per_step, f"{per_step:.3g} passes per minibatch step"
    logged = _logged_passes(run_dir, n)
    if logged is not None:
        return logged, "engine passes from iterations.jsonl"
    cls = learner_of(r)
    if cls is not None and cls.passes_per_iteration is not None:
        k = int(cls.passes_per_iteration)
        return it * k, "one pass per iteration" if k == 1 else f"{k} passes per iteration"
    return it, "iterations (no iterations.jsonl: passes per iteration unknown)"


def elbo_figures(dirs: Sequence[Path], results: Sequence[dict[str, Any]], names: Sequence[str],
                 folder: Path) -> list[tuple[str, str, list[int]]]:
    """One PNG per group of comparable runs: ELBO per row against data passes.

    Returns ``(file name, caption, indices of the runs drawn)`` per group: ``elbo.png`` when every run
    compares with every other, else ``elbo-A.png``, ``elbo-B.png``, ... (the table's "ELBO panel").
    """
    priors = [run_prior(Path(d)) for d in dirs]
    groups = comparable_groups(results, priors)
    out = []
    for g, members in enumerate(groups):
        letter = chr(65 + g) if g < 26 else f"Z{g}"
        name = "elbo.png" if len(groups) == 1 else f"elbo-{letter}.png"
        r0 = results[members[0]]
        title = f"{model_label(r0, priors[members[0]])}; {bound_kind(r0)} bound"
        _elbo_panel([Path(dirs[i]) for i in members], [results[i] for i in members],
                    [names[i] for i in members], (title if len(groups) == 1 else f"{letter}: {title}"),
                    folder / name)
        caption = ("ELBO per row against data passes" + ("" if len(groups) == 1 else
                   f", panel {letter}: {', '.join(names[i] for i in members)}"))
        out.append((name, caption, members))
    return out


def _elbo_panel(dirs: list[Path], results: list[dict[str, Any]], names: list[str], title: str,
                path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    lows, highs, how = [], [], set()
    for d, r, name in zip(dirs, results, names, strict=True):
        h = np.asarray(r.get("elbo_history") or [r["elbo"]], dtype=np.float64) / float(r["n_rows"])
        x, note = data_passes(d, r)
        how.add(note)
        (line,) = ax.plot(x, h, marker="." if len(h) < 60 else None, label=name)
        se = history_se(r)
        if se is not None and se.shape == h.shape:  # minibatch estimates: +-2 standard errors
            band = 2.0 * se / float(r["n_rows"])
            ax.fill_between(x, h - band, h + band, color=line.get_color(), alpha=0.2, linewidth=0)
        lows.append(np.quantile(h, 0.1))
        highs.append(h.max())
    lo, hi = min(lows), max(highs)
    if hi > lo:  # the first iterations can sit far below the end: show the last 90% of the rise
        ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    steps = {minibatch_step(r) for r in results}
    if len(steps) == 1 and (step := steps.pop()) is not None:  # minibatch runs: steps on the top axis
        scale = 1.0 / step
        top = ax.secondary_xaxis("top", functions=(lambda x: np.multiply(x, scale),
                                                   lambda s: np.multiply(s, step)))
        top.set_xlabel("minibatch steps")
    ax.set_title(title)
    ax.set_xlabel("data passes" + (f" ({next(iter(how))})" if len(how) == 1 else ""))
    ax.set_ylabel("ELBO per row (nats)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def selection_note(r: dict[str, Any]) -> str | None:
    """One line of model selection's candidates (result.json's ``selection``): each one's exact bound
    per row on the screening subsample and, where fitted to all rows, on all rows; the kept one marked."""
    sel = r.get("selection")
    if not sel:
        return None
    from pipeline.fit.select import label

    cells = []
    for c in sel["candidates"]:
        full = "" if c["full_bound"] is None else f", all rows {c['full_bound']:.4f}"
        cells.append(f"{label(c)}/{c['priors']}: screen {c['screen_bound']:.4f}{full}"
                     + (" (kept)" if c["chosen"] else ""))
    norm = sel.get("normalize", "none")
    rows = "" if norm == "none" else f" of the {norm}-normalised rows"
    return (f"model selection ({sel['parts']}; exact bound per row{rows}, {sel['screen_rows']} rows "
            f"screened in {sel['screen_seconds']:.1f} s): " + "; ".join(cells))
