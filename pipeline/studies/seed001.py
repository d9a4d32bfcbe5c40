"""Watanabe & Watanabe 2005 section 4: the stochastic complexity of VB for Gaussian mixtures.

The true distribution is eq. 19, ``1/2 N((2,2), I) + 1/2 N((-2,-2), I)`` (K0 = 2, M = 2); the model
is a mixture of K unit-variance Gaussians (``covariance_type='fixed'``, ``fixed_variance=1``) with a
Dirichlet(phi_0) prior on the weights (eq. 2) and the conjugate prior ``N(nu_0 = 0, I / xi_0)``,
``xi_0 = 1``, on each mean (eq. 3), fitted by VB EM (eqs. 9-10).

For each draw, ``K(r(theta) || phi(theta))`` (the KL of q(theta) to the prior: ``kl_weights +
kl_components`` of :class:`vbcore.model.elbo.ElboTerms`) is computed at convergence on a sample of n = 100
and one of n = 1000; ``lambda = (KL_1000 - KL_100) / ln 10`` (eq. 20) averaged over the draws is
compared with the bound ``lambda_bar`` of eq. 18. Training and generalisation errors (sec. 4) are
measured on the n = 1000 fits and multiplied by n.

Experiments: Fig. 1/2 (K = 2..5, phi_0 = 1) and Fig. 3/4/5 (K = 4, phi_0 swept), each for the two
initialisations of the paper: (1) ``a_k = 1/K``, ``b_k = 0`` and (2) ``a_1 = a_2 = 1/2``, ``a_k = 0``
(k >= 3), ``b_1 = (2, 2)``, ``b_2 = (-2, -2)``, ``b_k = 0``. Initialisation (1) is an exact fixed
point of VB EM (all components identical forever), so its means get a symmetry-breaking perturbation
``N(0, 0.01^2 I)``; see docs/studies.md.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.estimator import VBMixture
from pipeline.studies import Report, one_blas_thread, pyplot, save_figure, study_dir
from pipeline.studies.data import WATANABE_MEANS, watanabe_data, watanabe_logpdf
from vbcore.errors import TruncationWarning

NAME = "seed001"
M = 2  #: dimension of the natural parameter b (2-D unit-variance Gaussians)
XI0 = 1.0  #: xi_0 of eq. 3: the mean prior N(0, I / xi_0)
PERTURB = 0.01  #: symmetry-breaking scale for initialisation (1)
TOL = 1e-9  #: VB EM stops when the ELBO changes by less than TOL * n in one iteration
MAX_ITER = 5000


def lambda_bar(K: int, K0: int, phi0: float, m: int = M) -> float:
    """The upper bound of the VB stochastic-complexity coefficient, Watanabe & Watanabe 2005 eq. 18."""
    if phi0 <= (m + 1) / 2:
        return (K - K0) * phi0 + (m * K0 + K0 - 1) / 2
    return (m * K + K - 1) / 2


def initial_responsibilities(X: np.ndarray, K: int, init: int, true_means: np.ndarray,
                             rng: np.random.Generator) -> np.ndarray:
    """Responsibilities of the first E-step from point values (a_k, b_k) of the paper's two
    initialisations: ``r_ik ∝ a_k c(x_i | b_k)`` (Watanabe & Watanabe 2005 sec. 4).

    Returns
    -------
    resp : array of shape (n, K)
    """
    k0 = true_means.shape[0]
    if init == 1:
        a = np.full(K, 1.0 / K)
        b = PERTURB * rng.standard_normal((K, X.shape[1]))
    elif init == 2:
        a = np.zeros(K)
        b = np.zeros((K, X.shape[1]))
        a[:k0] = 1.0 / k0
        b[:k0] = true_means[:K]
        if K < k0:
            a = a[:K] / a[:K].sum()
    else:
        raise ValueError(f"init must be 1 or 2, got {init!r}")
    with np.errstate(divide="ignore"):
        log_r = np.log(a)[None] - 0.5 * ((X[:, None, :] - b[None]) ** 2).sum(-1)  # (n, K), K tiny
    log_r -= log_r.max(1, keepdims=True)
    r = np.exp(log_r)
    return r / r.sum(1, keepdims=True)


@dataclass
class FitResult:
    kl: float  #: KL(q(theta) || prior) at convergence
    train_error: float  #: T(X^n), per sample
    gen_error: float  #: G(X^n), per sample, on the test set
    n_iter: int
    converged: bool
    n_effective: int


def fit_one(X: np.ndarray, X_test: np.ndarray, K: int, phi0: float, init: int,
            rng: np.random.Generator, true_means: np.ndarray = WATANABE_MEANS,
            tol: float = TOL) -> FitResult:
    """VB EM on ``X`` with K unit-variance components; the KL term, training and generalisation
    errors (against the true mixture at ``true_means``)."""
    model = VBMixture(
        K, covariance_type="fixed", fixed_variance=1.0,
        weight_concentration_prior_type="dirichlet_distribution", weight_concentration_prior=phi0,
        mean_precision_prior=XI0, mean_prior=np.zeros(X.shape[1]), reg_covar=0.0,
        tol=tol, max_iter=MAX_ITER, learner="vbem", chunk_rows=max(len(X), 1),
    )
    with warnings.catch_warnings():
        # K is the study's: a finite mixture of K components, used in full on purpose (eq. 18's
        # redundant components); the estimator's advice to raise n_components does not apply here
        warnings.simplefilter("ignore", TruncationWarning)
        model.fit(X, resp_init=initial_responsibilities(X, K, init, true_means, rng))
    terms = model.elbo_terms_
    kl = terms["kl_weights"] + terms["kl_components"]  # K(r(theta) || phi(theta)), eq. 15
    train = float(np.mean(watanabe_logpdf(X, true_means) - model.score_samples(X)))
    gen = float(np.mean(watanabe_logpdf(X_test, true_means) - model.score_samples(X_test)))
    return FitResult(kl, train, gen, int(model.n_iter_), bool(model.converged_), int(model.n_effective_))


def estimate_lambda(draws: list[tuple[np.ndarray, np.ndarray]], X_test: np.ndarray, K: int,
                    phi0: float, init: int, seed: int = 0,
                    true_means: np.ndarray = WATANABE_MEANS, tol: float = TOL) -> dict[str, float]:
    """``lambda`` of eq. 20 averaged over draws, with the errors of the n_large fits.

    Parameters
    ----------
    draws : list of (X_small, X_large)
        Training sets of n1 and n2 rows (the paper: 100 and 1000).

    Returns
    -------
    dict with ``lambda``, ``lambda_se`` (standard error over draws), ``train``, ``gen`` (errors per
    sample at n2, averaged), ``non_converged`` (fits that hit MAX_ITER), ``n_draws``.
    """
    lams, trains, gens, bad = [], [], [], 0
    for i, (xs, xl) in enumerate(draws):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(K, init, i)))
        small = fit_one(xs, X_test, K, phi0, init, rng, true_means, tol)
        large = fit_one(xl, X_test, K, phi0, init, rng, true_means, tol)
        bad += (not small.converged) + (not large.converged)
        lams.append((large.kl - small.kl) / np.log(len(xl) / len(xs)))
        trains.append(large.train_error)
        gens.append(large.gen_error)
    lam = np.asarray(lams)
    return {"lambda": float(lam.mean()),
            "lambda_se": float(lam.std(ddof=1) / np.sqrt(len(lam))) if len(lam) > 1 else float("nan"),
            "train": float(np.mean(trains)), "gen": float(np.mean(gens)),
            "non_converged": bad, "n_draws": len(draws)}


def make_draws(n_draws: int, n1: int, n2: int, seed: int,
               true_means: np.ndarray = WATANABE_MEANS) -> list[tuple[np.ndarray, np.ndarray]]:
    """Independent training sets of n1 and n2 rows per draw, from one seed."""
    out = []
    for i in range(n_draws):
        rs, rl = (np.random.default_rng(s) for s in np.random.SeedSequence(seed, spawn_key=(i,)).spawn(2))
        out.append((watanabe_data(n1, true_means, rs), watanabe_data(n2, true_means, rl)))
    return out


def run(out: Path, *, quick: bool = False, seed: int = 0, n_draws: int | None = None) -> Path:
    """Run the Watanabe & Watanabe 2005 study into ``out/seed001`` with one BLAS thread (see :func:`_run`)."""
    with one_blas_thread():
        return _run(out, quick=quick, seed=seed, n_draws=n_draws)


def _run(out: Path, *, quick: bool = False, seed: int = 0, n_draws: int | None = None) -> Path:
    """Run the Watanabe & Watanabe 2005 study into ``out/seed001`` (see the module docstring).

    ``quick``: 2 draws, K in (2, 3), phi_0 in (0.5, 2.0) at K = 3, n' = 2000 test points,
    tolerance 1e-6 instead of 1e-9.
    ``n_draws`` overrides the number of draws (the paper and the full study: 100).
    """
    folder = study_dir(out, NAME)
    n1, n2 = 100, 1000
    ks: tuple[int, ...]
    phis: tuple[float, ...]
    if quick:
        draws_n, ks, phis, n_test, tol = 2, (2, 3), (0.5, 2.0), 2000, 1e-6
    else:
        draws_n, ks, phis, n_test = 100, (2, 3, 4, 5), (0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0,
                                                        2.5, 3.0), 10_000
        tol = TOL
    if n_draws is not None:
        draws_n = int(n_draws)
    k_sweep = 3 if quick else 4
    draws = make_draws(draws_n, n1, n2, seed)
    X_test = watanabe_data(n_test, seed=np.random.default_rng(
        np.random.SeedSequence(seed, spawn_key=(10**6,))))
    rep = Report(folder, "Watanabe & Watanabe 2005: stochastic complexity of VB for Gaussian mixtures")
    rep.text(
        f"True distribution eq. 19 (K0 = 2, M = 2); unit-variance components, xi_0 = 1, nu_0 = 0; "
        f"VB EM (`VBMixture(learner='vbem', covariance_type='fixed')`) until the ELBO changes by less "
        f"than {tol:g} n per iteration (at most {MAX_ITER} iterations). lambda = (KL(n={n2}) - "
        f"KL(n={n1})) / ln({n2}/{n1}) averaged over {draws_n} draws (eq. 20); errors at n = {n2} on "
        f"n' = {n_test} test points, multiplied by n = {n2}. Seed {seed}{' (quick)' if quick else ''}."
    )
    cols = ["K", "phi0", "init", "lambda_hat", "lambda_se", "lambda_bar", "train_error_x_n",
            "gen_error_x_n", "non_converged", "n_draws"]

    def row(K: int, phi0: float, init: int) -> list[object]:
        r = estimate_lambda(draws, X_test, K, phi0, init, seed, tol=tol)
        return [K, phi0, init, r["lambda"], r["lambda_se"], lambda_bar(K, 2, phi0),
                r["train"] * n2, r["gen"] * n2, r["non_converged"], r["n_draws"]]

    rows_k = [row(K, 1.0, init) for K in ks for init in (1, 2)]
    rep.table("lambda_vs_K", cols, rows_k, "Fig. 1 and 2: lambda and errors against K (phi_0 = 1)")
    rows_p = [row(k_sweep, phi, init) for phi in phis for init in (1, 2)]
    rep.table("lambda_vs_phi0", cols, rows_p,
              f"Fig. 3, 4 and 5: lambda and errors against phi_0 (K = {k_sweep})")

    plt = pyplot()
    for fname, rows, xcol, xlabel, ycols, title in (
        ("fig1_lambda_vs_K.png", rows_k, 0, "K", [(3, "lambda")], "Fig. 1: lambda against K"),
        ("fig2_errors_vs_K.png", rows_k, 0, "K", [(6, "training error x n"), (7, "generalisation error x n")],
         "Fig. 2: errors against K (n = 1000)"),
        ("fig3_lambda_vs_phi0.png", rows_p, 1, "phi_0", [(3, "lambda")],
         f"Fig. 3: lambda against phi_0 (K = {k_sweep})"),
        ("fig4_train_vs_phi0.png", rows_p, 1, "phi_0", [(6, "training error x n")],
         "Fig. 4: training error"),
        ("fig5_gen_vs_phi0.png", rows_p, 1, "phi_0", [(7, "generalisation error x n")],
         "Fig. 5: generalisation error"),
    ):
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for init, style in ((1, "-o"), (2, ":s")):
            sel = [r for r in rows if r[2] == init]
            xs = [float(r[xcol]) for r in sel]  # type: ignore[arg-type]
            for yc, label in ycols:
                ax.plot(xs, [float(r[yc]) for r in sel], style, label=f"{label}, init ({init})")  # type: ignore[arg-type]
        if ycols[0][0] == 3:
            xs = [float(r[xcol]) for r in rows if r[2] == 1]  # type: ignore[arg-type]
            ax.plot(xs, [float(r[5]) for r in rows if r[2] == 1], "--k", label="lambda_bar (eq. 18)")  # type: ignore[arg-type]
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.legend(fontsize=7)
        save_figure(fig, folder / fname)
        rep.image(fname, title)

    above = [(r[0], r[1], r[2]) for r in rows_k + rows_p
             if float(r[3]) > float(r[5]) + 2 * float(r[4] if r[4] == r[4] else 0)]  # type: ignore[arg-type]
    rep.text("Settings where lambda_hat exceeds lambda_bar by more than two standard errors "
             f"(K, phi_0, init): {above if above else 'none'}.")
    rep.write()
    return folder
