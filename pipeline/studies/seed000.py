"""Kuusela et al. 2009 (docs/references.md), section V: VB EM, pattern search and gradient
learners on cluster, spiral and image data.

Model and priors exactly as sec. V: full-covariance Gaussian mixture with Dirichlet weights,
``alpha_0 = 1``, ``beta_0 = 1``, ``nu_0 = D``, ``W_0 = 4/D I`` (``covariance_prior = W_0^-1 =
D/4 I``), ``m_0 = 0``. Initialisation as sec. V: K = 8 components (5 for Fig. 4(a)) with means
``m_k ~ N(0, 0.16 I)`` and ``alpha_k = 1``, ``beta_k = 10``, ``nu_k = D``, ``W_k = 4/D I``; the
first E-step from this posterior gives ``resp_init`` (the estimator then takes its M-step, the same
start for every learner). The cost is ``C = -ELBO`` (eq. 42).

Convergence: the paper stops when ``C_{k-1} - C_k < eps N`` on two consecutive iterations; learners
that offer it (learner option ``convergence='seed000'``) use that rule, the others stop on the
estimator's ``tol = eps`` rule ``|C_{k-1} - C_k| < eps N`` once (one iteration earlier at most); the
tables name the rule used (docs/studies.md).

Learners that are not registered in this installation are skipped with a line in the report.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.estimator import VBMixture
from pipeline.studies import Report, available_learners, one_blas_thread, pyplot, save_figure, study_dir
from pipeline.studies.data import cluster_data, image_data, image_features, load_photo, spiral_data
from vbcore.kernels.estep import estep_params, prepare_chunk, responsibilities
from vbcore.model.posterior import Posterior

NAME = "seed000"
GRADIENT_LEARNERS = ("gd", "cg", "ng", "ncg")
MAIN_LEARNERS = ("vbem", "vbem-ps", "ncg")


def paper_prior(d: int) -> dict[str, Any]:
    """VBMixture settings for the priors of Kuusela et al. 2009 sec. V."""
    return dict(
        covariance_type="full", weight_concentration_prior_type="dirichlet_distribution",
        weight_concentration_prior=1.0, mean_precision_prior=1.0, mean_prior=np.zeros(d),
        degrees_of_freedom_prior=float(d), covariance_prior=(d / 4.0) * np.eye(d), reg_covar=0.0,
    )


def paper_initial_posterior(d: int, k: int, rng: np.random.Generator) -> Posterior:
    """The initial q(theta) of sec. V: ``m_k ~ N(0, 0.16 I)``, ``alpha_k = 1``, ``beta_k = 10``,
    ``nu_k = D``, ``W_k = 4/D I`` (so ``E[Lambda_k] = nu_k W_k = 4 I``)."""
    means = 0.4 * rng.standard_normal((k, d))
    return Posterior(
        covariance_type="full", weight_type="dirichlet_distribution",
        weight_concentration=np.ones(k), mean_precision=np.full(k, 10.0), means=means,
        degrees_of_freedom=np.full(k, float(d)), covariances=np.repeat(0.25 * np.eye(d)[None], k, 0),
    )


def paper_resp_init(X: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Responsibilities of the first E-step (eqs. 35-36) from :func:`paper_initial_posterior`."""
    post = paper_initial_posterior(X.shape[1], k, rng)
    shift = np.zeros(X.shape[1])
    r = np.asarray(responsibilities(prepare_chunk(X, shift, "full"), estep_params(post, shift)),
                   dtype=np.float64)
    return r / r.sum(1, keepdims=True)


@dataclass
class Run:
    learner: str
    init: int
    cost: float  #: final C = -ELBO
    seconds: float  #: learning time: the sum of the iterations' wall times (no set-up)
    wall: float  #: wall time of the whole fit (set-up, initialisation and iterations)
    n_iter: int
    passes: int  #: engine passes over the data
    converged: bool
    n_effective: int
    costs: np.ndarray = field(repr=False)  #: C after each iteration
    times: np.ndarray = field(repr=False)  #: cumulative learning seconds at each iteration
    resp: np.ndarray | None = field(default=None, repr=False)
    error: str = ""  #: why the fit failed ("" when it did not)

    @property
    def failed(self) -> bool:
        return bool(self.error)


def learner_options(name: str, eps: float) -> dict[str, Any]:
    """Kuusela et al. 2009's stop rule (``C_{k-1} - C_k < eps N`` on two consecutive iterations) for the
    learners that offer it (option ``convergence='seed000'``); {} for the others, which stop on the
    estimator's ``tol = eps`` rule (``|C_{k-1} - C_k| < eps N`` once)."""
    from pipeline.fit.learners import LEARNERS

    if name in LEARNERS and "convergence" in LEARNERS[name].options:
        return {"convergence": "seed000", "eps": eps}
    return {}


def stop_rule(name: str) -> str:
    return "dC < eps N twice" if learner_options(name, 1.0) else "abs(dC) < eps N once"


def fit_runs(X: np.ndarray, learner: str, n_runs: int, k: int, eps: float, max_iter: int, seed: int,
             keep_resp: bool = False) -> list[Run]:
    """``n_runs`` fits of ``learner`` from the paper's initialisation; initialisation i uses the
    same means for every learner (seeded by (seed, i))."""
    runs = []
    for i in range(n_runs):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(i,)))
        resp0 = paper_resp_init(X, k, rng)
        model = VBMixture(k, tol=eps, max_iter=max_iter, learner=learner, chunk_rows=len(X),
                          learner_options=learner_options(learner, eps), random_state=seed,
                          **paper_prior(X.shape[1]))
        steps: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        try:
            model.fit(X, resp_init=resp0, callback=steps.append)
        except Exception as exc:  # a learner that fails is a result: recorded, not fatal
            wall = time.perf_counter() - t0
            msg = f"{type(exc).__name__}: {exc}".replace("\n", " ").replace("|", "/")[:160]
            warnings.warn(f"{learner} run {i} failed after {len(steps)} iterations: {msg}", stacklevel=2)
            runs.append(Run(learner, i, float("nan"), wall, wall, len(steps), 0, False, 0,
                            np.array([np.nan]), np.array([wall]), None, msg))
            continue
        wall = time.perf_counter() - t0
        times = np.cumsum([s["seconds"] for s in steps]) if steps else np.zeros(1)
        costs = -np.array([s["elbo"] for s in steps]) if steps else np.array([-model.lower_bound_])
        runs.append(Run(learner, i, -float(model.lower_bound_), float(times[-1]), wall,
                        int(model.n_iter_), int(getattr(model, "n_passes_", model.n_iter_)),
                        bool(model.converged_), int(model.n_effective_), costs, times,
                        model.predict_proba(X).astype(np.float32) if keep_resp else None))
    return runs


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def split_learners(wanted: tuple[str, ...]) -> tuple[list[str], list[str]]:
    have = set(available_learners())
    return [w for w in wanted if w in have], [w for w in wanted if w not in have]


def skipped_line(missing: list[str]) -> str:
    return (f"Skipped (not registered in this installation): {', '.join(missing)}."
            if missing else "All requested learners are registered.")


def optima(costs: np.ndarray, tol: float) -> np.ndarray:
    """Distinct optima: sorted final costs merged when within ``tol`` of the group's best."""
    levels: list[float] = []
    for c in np.sort(costs):
        if not levels or c - levels[-1] > tol:
            levels.append(float(c))
    return np.asarray(levels)


def median_curve(runs: list[Run], grid: np.ndarray) -> np.ndarray:
    """Median over runs of the cost at each time of ``grid`` (a run's last cost after it ends)."""
    vals = []
    for r in runs:
        c = np.interp(grid, r.times, r.costs, left=np.nan, right=r.costs[-1])
        vals.append(c)
    return np.nanmedian(np.asarray(vals), axis=0)


def summary_rows(runs_by: dict[str, list[Run]], best: float, tol: float) -> list[list[Any]]:
    """One row per learner; medians over the runs that did not fail."""
    rows = []
    for name, all_runs in runs_by.items():
        runs = [r for r in all_runs if not r.failed]
        failed = len(all_runs) - len(runs)
        if not runs:
            nan = float("nan")
            rows.append([name, stop_rule(name), len(all_runs), 0] + [nan] * 6 + [0, failed, nan])
            continue
        c = np.array([r.cost for r in runs])
        rows.append([name, stop_rule(name), len(all_runs), int(np.sum(c - best <= tol)),
                     float(np.median(c)), float(c.min()),
                     float(np.median([r.n_iter for r in runs])), float(np.median([r.passes for r in runs])),
                     float(np.median([r.seconds for r in runs])), float(np.median([r.wall for r in runs])),
                     int(sum(not r.converged for r in runs)), failed,
                     float(np.median([r.n_effective for r in runs]))])
    return rows


def ok_runs(runs_by: dict[str, list[Run]]) -> dict[str, list[Run]]:
    """The runs that did not fail, for learners with at least one."""
    out = {name: [r for r in runs if not r.failed] for name, runs in runs_by.items()}
    return {name: runs for name, runs in out.items() if runs}


def failures_text(runs_by: dict[str, list[Run]]) -> str:
    bad = [r for runs in runs_by.values() for r in runs if r.failed]
    if not bad:
        return "No run failed."
    return "Failed runs (excluded from medians and plots): " + "; ".join(
        f"{r.learner} init {r.init} after {r.n_iter} iterations: {r.error}" for r in bad)


SUMMARY_COLS = ["learner", "stop_rule", "runs", "runs_at_best", "median_cost", "best_cost",
                "median_iterations", "median_passes", "median_seconds", "median_wall_seconds",
                "not_converged", "failed", "median_effective_K"]


def _curves_plot(runs_by: dict[str, list[Run]], path: Path, title: str, log_time: bool) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    best = min(r.cost for runs in runs_by.values() for r in runs)
    for name, runs in runs_by.items():
        t_end = max(r.times[-1] for r in runs)
        t_start = min(r.times[0] for r in runs)
        grid = np.geomspace(t_start, t_end, 200) if log_time else np.linspace(t_start, t_end, 200)
        axes[0].plot(grid, median_curve(runs, grid) - best + 1e-3, label=name)
        it = max(len(r.costs) for r in runs)
        pad = np.array([np.concatenate([r.costs, np.full(it - len(r.costs), r.costs[-1])]) for r in runs])
        axes[1].plot(np.arange(1, it + 1), np.median(pad, 0) - best + 1e-3, label=name)
    axes[0].set_xlabel("seconds (learning time)")
    axes[1].set_xlabel("iteration")
    for ax in axes:
        ax.set_ylabel("median cost - best cost + 1e-3")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    if log_time:
        axes[0].set_xscale("log")
    axes[1].set_xscale("log")
    fig.suptitle(title)
    save_figure(fig, path)


def _scatter_plot(runs_by: dict[str, list[Run]], path: Path, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for (name, runs), mk in zip(runs_by.items(), "o^sxd+v", strict=False):
        ax.scatter([r.seconds for r in runs], [r.cost for r in runs], marker=mk, label=name, alpha=0.7)
    ax.set_xlabel("seconds to converge (learning time)")
    ax.set_ylabel("final cost C = -ELBO")
    ax.set_title(title)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def _segmentation_plot(photo: np.ndarray, best: Run, second: Run | None, path: Path) -> None:
    plt = pyplot()
    h, w, _ = photo.shape
    rows = [("best", best)] + ([("2nd best", second)] if second is not None else [])
    regions = []
    for label, run in rows:
        assert run.resp is not None
        nk = run.resp.sum(0)
        order = [k for k in np.argsort(-nk) if nk[k] >= 1.0]
        regions.append((label, run, order))
    ncol = 1 + max(len(o) for _, _, o in regions)
    fig, axes = plt.subplots(len(regions), ncol, figsize=(2.2 * ncol, 1.8 * len(regions)), squeeze=False)
    for i, (label, run, order) in enumerate(regions):
        axes[i, 0].imshow(photo)
        axes[i, 0].set_title("photo" if i == 0 else "", fontsize=8)
        for j in range(1, ncol):
            ax = axes[i, j]
            if j - 1 < len(order):
                assert run.resp is not None
                ax.imshow(run.resp[:, order[j - 1]].reshape(h, w), cmap="gray", vmin=0, vmax=1)
                ax.set_title(f"{label}, region {j} (C={run.cost:.1f})", fontsize=7)
        for ax in axes[i]:
            ax.axis("off")
    save_figure(fig, path)


def run(out: Path, *, quick: bool = False, seed: int = 0, n_runs: int | None = None,
        r_values: tuple[float, ...] | None = None, parts: tuple[str, ...] = ("4a", "4d", "spiral", "image"),
        max_iter: int | None = None) -> Path:
    """Run the Kuusela et al. 2009 study into ``out/seed000`` with one BLAS thread (see :func:`_run`)."""
    with one_blas_thread():
        return _run(out, quick=quick, seed=seed, n_runs=n_runs, r_values=r_values, parts=parts,
                    max_iter=max_iter)


@dataclass(frozen=True)
class _Setup:
    """The settings every part of the study shares."""

    folder: Path
    runs_n: int
    iters: int
    seed: int
    eps: float
    eps_4a: float
    tol_per_n: float


def _run(out: Path, *, quick: bool = False, seed: int = 0, n_runs: int | None = None,
         r_values: tuple[float, ...] | None = None, parts: tuple[str, ...] = ("4a", "4d", "spiral", "image"),
         max_iter: int | None = None) -> Path:
    """Run the Kuusela et al. 2009 study into ``out/seed000`` (see the module docstring).

    Parameters
    ----------
    quick : bool
        Small data and 2 runs per learner (seconds).
    n_runs : int, optional
        Initialisations per learner and setting (paper: 30).
    r_values : tuple of float, optional
        The separations R of Fig. 4(d).
    parts : tuple of str
        Which experiments to run: '4a', '4d', 'spiral', 'image'.
    """
    folder = study_dir(out, NAME)
    runs_n = n_runs if n_runs is not None else (2 if quick else 30)
    iters = max_iter if max_iter is not None else (80 if quick else 20_000)
    full_rs = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)
    rs = r_values if r_values is not None else ((0.2, 0.5) if quick else full_rs)
    n_cluster, n_4a, n_spiral = (150, 150, 200) if quick else (1000, 500, 1000)
    img_w, img_h = (24, 16) if quick else (100, 66)
    eps, eps_4a = 1e-8, 1e-7
    rep = Report(folder, "Kuusela et al. 2009: VB EM, pattern search and (natural) conjugate gradient")
    rep.text(
        f"Priors and initialisation of Kuusela et al. 2009 sec. V (alpha_0 = 1, beta_0 = 1, nu_0 = D, "
        f"W_0 = 4/D I, m_0 = 0; K = 8, m_k ~ N(0, 0.16 I), beta_k = 10, nu_k = D, W_k = 4/D I). Cost "
        f"C = -ELBO (exact, all constants). Convergence (column stop_rule): C_(k-1) - C_k < eps N on two "
        f"consecutive iterations for the learners with option convergence='seed000', else "
        f"|C_(k-1) - C_k| < eps N once (eps = {eps:g}; {eps_4a:g} for Fig. 4(a)), at most {iters} "
        f"iterations. {runs_n} initialisations per learner and setting; seed "
        f"{seed}{' (quick)' if quick else ''}. Learners registered: "
        f"{', '.join(available_learners())}. `seconds` = learning time (the sum of the iterations' wall "
        "times from the estimator's per-iteration callback, one BLAS thread, on a shared 2-core machine: "
        "compare ratios within one run); `wall_seconds` adds set-up and initialisation."
    )
    # optima closer than tol_per_n * N in cost count as the same optimum
    st = _Setup(folder, runs_n, iters, seed, eps, eps_4a, 1e-5)

    if "4a" in parts:
        _fig4a(rep, st, n_4a)
    if "4d" in parts:
        _fig4d(rep, st, rs, n_cluster)
    for part, title, make in (
        ("spiral", "Fig. 4(b, e): spiral data", lambda: (spiral_data(
            n_spiral, seed=np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(3,)))), None)),
        ("image", "Fig. 4(c, f) and Fig. 5: image segmentation", lambda: (
            image_features(load_photo(img_w, img_h)), load_photo(img_w, img_h))),
    ):
        if part in parts:
            _data_part(rep, st, part, title, make)
    rep.write()
    return folder




def _fig4a(rep: Report, st: _Setup, n_4a: int) -> None:
    """Fig. 4(a): the gradient learners (and VB EM) on cluster data, R = 0.3, K = 5."""
    learners, missing = split_learners(GRADIENT_LEARNERS + ("vbem",))
    rep.text(f"## Fig. 4(a): gradient learners on cluster data, R = 0.3, N = {n_4a}, K = 5\n\n"
             + skipped_line(missing) + " VB EM is included as a reference.")
    X, _ = cluster_data(0.3, n_4a, seed=_rng(st.seed, 1))
    by = {name: fit_runs(X, name, st.runs_n, 5, st.eps_4a, st.iters, st.seed) for name in learners}
    best = min((r.cost for v in ok_runs(by).values() for r in v), default=float("nan"))
    rep.text(failures_text(by))
    rep.table("fig4a_summary", SUMMARY_COLS, summary_rows(by, best, st.tol_per_n * len(X)),
              "Fig. 4(a) summary")
    _curves_plot(ok_runs(by), st.folder / "fig4a_cost.png", "Fig. 4(a): cluster data R = 0.3", log_time=True)
    rep.image("fig4a_cost.png", "Fig. 4(a): median cost above the best against time and iteration")



def _fig4d(rep: Report, st: _Setup, rs: tuple[float, ...], n_cluster: int) -> None:
    """Fig. 4(d): time to converge against the separation R, K = 8."""
    learners, missing = split_learners(MAIN_LEARNERS)
    rep.text(f"## Fig. 4(d): time to converge against R (N = {n_cluster}, K = 8)\n\n"
             + skipped_line(missing))
    rows = []
    fails: list[str] = []
    for R in rs:
        X, _ = cluster_data(R, n_cluster, seed=np.random.default_rng(
            np.random.SeedSequence(st.seed, spawn_key=(2, int(round(R * 1000))))))
        by = {name: fit_runs(X, name, st.runs_n, 8, st.eps, st.iters, st.seed) for name in learners}
        best = min((r.cost for v in ok_runs(by).values() for r in v), default=float("nan"))
        fails.append(f"R = {R}: " + failures_text(by))
        for row in summary_rows(by, best, st.tol_per_n * len(X)):
            rows.append([R] + row)
    rep.text("\n\n".join(fails))
    rep.table("fig4d_time_vs_R", ["R"] + SUMMARY_COLS, rows, "Fig. 4(d): median time to converge")
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name in learners:
        sel = [r for r in rows if r[1] == name]
        axes[0].plot([r[0] for r in sel], [r[9] for r in sel], "-o", label=name)
        axes[1].plot([r[0] for r in sel], [r[7] for r in sel], "-o", label=name)
    axes[0].set_ylabel("median seconds to converge")
    axes[1].set_ylabel("median iterations to converge")
    for ax in axes:
        ax.set_xlabel("R")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle("Fig. 4(d): cluster data")
    save_figure(fig, st.folder / "fig4d_time_vs_R.png")
    rep.image("fig4d_time_vs_R.png", "Fig. 4(d): median time and iterations to converge against R")



def _data_part(rep: Report, st: _Setup, part: str, title: str, make: Any) -> None:
    """Fig. 4(b, e) (spiral) or Fig. 4(c, f) and Fig. 5 (image segmentation), K = 8."""
    learners, missing = split_learners(MAIN_LEARNERS)
    X, photo = make()
    rep.text(f"## {title} (N = {len(X)}, D = {X.shape[1]}, K = 8)\n\n" + skipped_line(missing))
    by = {name: fit_runs(X, name, st.runs_n, 8, st.eps, st.iters, st.seed, keep_resp=part == "image")
          for name in learners}
    all_costs = np.array([r.cost for v in ok_runs(by).values() for r in v])
    tol = st.tol_per_n * len(X)
    levels = optima(all_costs, tol)
    best = float(levels[0]) if len(levels) else float("nan")
    rep.text(failures_text(by))
    rep.table(f"{part}_summary", SUMMARY_COLS, summary_rows(by, best, tol),
              f"{title}: runs reaching the best optimum (within {st.tol_per_n:g} N = {tol:.3g} nats)")
    rep.table(f"{part}_runs", ["learner", "init", "cost", "cost_minus_best", "seconds", "wall_seconds",
                               "iterations", "passes", "converged", "effective_K", "error"],
              [[r.learner, r.init, r.cost, r.cost - best, r.seconds, r.wall, r.n_iter, r.passes,
                r.converged, r.n_effective, r.error]
               for v in by.values() for r in v], f"{title}: every run")
    rep.text("Distinct optima (cost, runs of each learner there): " + "; ".join(
        f"{lv:.3f}: " + ", ".join(f"{n} {sum(abs(r.cost - lv) <= tol for r in v)}" for n, v in by.items())
        for lv in levels[:5]))
    tag = "4b" if part == "spiral" else "4c"
    _curves_plot(ok_runs(by), st.folder / f"fig{tag}_{part}_cost.png", f"Fig. {tag}: {part}", log_time=False)
    rep.image(f"fig{tag}_{part}_cost.png",
              f"Fig. {tag}: median cost above the best against time and iteration")
    tag = "4e" if part == "spiral" else "4f"
    _scatter_plot(ok_runs(by), st.folder / f"fig{tag}_{part}_final.png",
                  f"Fig. {tag}: final cost and time, {part}")
    rep.image(f"fig{tag}_{part}_final.png", f"Fig. {tag}: final cost against time, every run")
    flat = sorted((r for v in ok_runs(by).values() for r in v), key=lambda r: r.cost)
    if part == "image" and photo is not None and flat:
        best_run = flat[0]
        second = next((r for r in flat if r.cost - best > tol), None)
        _segmentation_plot(photo, best_run, second, st.folder / "fig5_segmentation.png")
        rep.image("fig5_segmentation.png", "Fig. 5: responsibilities of each region (white = 1) at the "
                  "best and second-best optimum")
        img_h, img_w = photo.shape[:2]
        rep.text(f"Photo: scikit-learn's bundled `flower.jpg` resized to {img_w} x {img_h} pixels "
                 "(Lanczos); pixels as (r, g, b, x, y) min-max scaled to [-1, 1].")


__all__ = ["run", "paper_prior", "paper_resp_init", "fit_runs", "optima", "image_data"]
