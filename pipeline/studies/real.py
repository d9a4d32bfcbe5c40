"""Study ``real``: every learner on real CNN features, against scikit-learn on the same rows.

Data: Fashion-MNIST (Xiao et al. 2017; 70,000 grey 28 x 28 images, 10 classes) from the Debian
package ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist/``, MNIST's idx format),
through the idx source of ``vbcluster ingest`` and the ONNX extractor with the EfficientNet-Lite0
export of ``../shared/models/`` (Tan & Le 2019; 1280 pooled features; images upsampled to 112 px by
repeating pixels, ``(x - 127) / 128``, grey in 3 channels). The features are extracted once into
``OUT/real/features/`` and reused by later runs (an interrupted extraction resumes from its shards).

Fits, all on the same rows (all 70,000, or a seeded subsample of ``rows``): every learner of
``vbcluster learners`` at K = 50 and 100 with the covariance and options ``vbcluster fit`` gives it
by default (diag, or the learner's own), on the raw
features, after ``pca=64`` and ``pca=128`` (VB EM also with full covariance there), and in the
best configuration measured (rows power- and L2-normalised, 64 whitened principal components:
``power-l2-pca64w``; :func:`feature_set` reads these tags); scikit-learn's ``BayesianGaussianMixture``
(Dirichlet process, K = 50; diag, and full on the projected features) and ``KMeans`` told the true
K = 10. Reported per fit: labels used (distinct labels of the hard assignment), NMI, ACC, ARI, the
ELBO per row (vbcluster's; scikit-learn's bound leaves out constants, so it is not comparable),
iterations and wall time. Every fit runs alone, with one BLAS thread. The vbcluster fits use the
command line's settings by default (``defaults='pipeline'``: the model of ``vbcluster fit -k K``,
whose K is a starting truncation that grows; :func:`pipeline.fit.spec.estimator_params`), or
``VBMixture``'s scikit-learn defaults (``defaults='estimator'``).

``run(out, quick=True)`` runs the first 200 test images, K = 5, raw and power-l2-pca16w, at most 3
iterations (seconds per fit on an idle machine); the full study takes hours on 2 cores
(scikit-learn's BGM alone is about 6 min per fit on all rows).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.studies import Report, available_learners, pyplot, save_figure
from vbcore.errors import ConfigError

FASHION = Path("/usr/share/datasets/fashion-mnist")
MODEL = "efficientnet_lite0_features.onnx"
#: the export's input convention (../shared/models/README.md), 28 -> 112 px by repeating pixels
EXTRACT: dict[str, Any] = {"extractor": "onnx", "output": "feat1280", "size": 112, "interpolation": "nearest",
                           "scale": 1, "mean": 127, "std": 128, "batch_images": 50}
KS, QUICK_KS = (50, 100), (5,)
QUICK_IMAGES = 200
#: the feature sets (:func:`feature_set`): raw, two projections, and the best configuration measured
#: (power + L2 rows, 64 whitened principal components: docs/studies.md, "Row normalisation")
FEATURES = ("raw", "pca64", "pca128", "power-l2-pca64w")
QUICK_FEATURES = ("raw", "power-l2-pca16w")  # every path: normalisation, projection, whitening
BASELINE_K = 50
#: the ``settings`` column: the vbcluster fits' defaults (:func:`vb_fit`), scikit-learn's for its own
SETTINGS = {"pipeline": "cli", "estimator": "sklearn"}
COLUMNS = ["features", "method", "settings", "covariance", "K", "clusters", "nmi", "acc", "ari",
           "elbo_per_row", "iterations", "wall_s", "note"]


def fashion_mnist() -> Path:
    """The Debian package's folder; a one-line ConfigError naming the apt command when missing."""
    if not any(FASHION.glob("*-images-idx3-ubyte*")):
        raise ConfigError(f"Fashion-MNIST is not installed ({FASHION} has no idx files): "
                          "apt-get install -y dataset-fashion-mnist")
    return FASHION


def model_path() -> Path:
    """The EfficientNet-Lite0 export: $VBCLUSTER_SHARED_MODELS, else ../shared/models beside the
    repository; a one-line ConfigError saying how to make it when missing."""
    env = os.environ.get("VBCLUSTER_SHARED_MODELS")
    folder = Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "models"
    if not (folder / MODEL).is_file():
        raise ConfigError(f"no {MODEL} in {folder}: build it with scripts/export_efficientnet_lite0.py "
                          "and set VBCLUSTER_SHARED_MODELS to its folder")
    return folder / MODEL


def projection_available() -> bool:
    """Whether this installation's estimator has the projection stage (``VBMixture(pca=...)``)."""
    from pipeline import VBMixture

    return "pca" in VBMixture().get_params()


# ---- the features -------------------------------------------------------------------------------
def _quick_source(folder: Path, n: int) -> Path:
    """The first ``n`` test images and labels as a small idx folder (plain files)."""
    from pipeline.extract.idx_images import read_images_file, read_labels

    src = fashion_mnist()
    folder.mkdir(parents=True, exist_ok=True)
    images = np.asarray(read_images_file(next(src.glob("t10k-images-idx3-ubyte*")))[:n])
    labels = read_labels(next(src.glob("t10k-labels-idx1-ubyte*")))[:n].astype(np.uint8)
    for name, a in (("t10k-images-idx3-ubyte", images), ("t10k-labels-idx1-ubyte", labels)):
        head = bytes([0, 0, 8, a.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in a.shape)
        (folder / name).write_bytes(head + a.tobytes())
    return folder


def _split_source(folder: Path, split: str) -> Path:
    """``'all'``: the package's folder; ``'t10k'`` / ``'train'``: a folder linking that pair only."""
    src = fashion_mnist()
    if split == "all":
        return src
    if split not in ("t10k", "train"):
        raise ConfigError(f"split must be 'all', 't10k' or 'train', got {split!r}")
    folder.mkdir(parents=True, exist_ok=True)
    for f in src.glob(f"{split}-*-idx?-ubyte*"):
        if not (folder / f.name).exists():
            (folder / f.name).symlink_to(f)
    return folder


def features(folder: Path, quick: bool, split: str = "all") -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(X float32, labels, what was done): the features extracted once into ``folder/features``."""
    from pipeline.extract.extraction import refresh_images
    from pipeline.store.features import FeatureStore

    fashion_mnist()  # the data's message first (the model's: model_path)
    model = model_path()
    src = (_quick_source(folder / "quick-idx", QUICK_IMAGES) if quick
           else _split_source(folder / f"{split}-idx", split))
    name = "quick" if quick else "fashion-mnist" if split == "all" else f"fashion-mnist-{split}"
    store = folder / "features" / f"{name}-effnet112.zarr"
    store.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rep = refresh_images(str(src), store, model=str(model), **EXTRACT)  # nothing new: nothing extracted
    s = FeatureStore.open(store)
    y = s.read_labels()
    assert y is not None, "the idx source gives labels"
    info = {"store": str(store), "rows": s.n_rows, "extracted_now": rep.rows_written,
            "extract_s": time.perf_counter() - t0, "images_per_s": rep.images_per_s}
    return np.asarray(s.read(), dtype=np.float32), np.asarray(y), info


def subsample(n: int, rows: int | None, seed: int) -> np.ndarray:
    """Sorted row indices: all, or ``rows`` of them drawn with ``seed``."""
    if rows is None or rows >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=rows, replace=False))


# ---- one fit ------------------------------------------------------------------------------------
def scores(y: np.ndarray, pred: np.ndarray) -> dict[str, Any]:
    from sklearn.metrics import normalized_mutual_info_score

    from vbcore.data.metrics import acc, ari

    return {"clusters": int(len(np.unique(pred))), "nmi": float(normalized_mutual_info_score(y, pred)),
            "acc": acc(y, pred), "ari": ari(y, pred)}


def timed(fit: Callable[[], Any]) -> tuple[Any, float, str]:
    """(model or None, wall seconds, '' or the error), warnings silenced."""
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fit(), time.perf_counter() - t0, ""
    except Exception as exc:  # noqa: BLE001 - a failing fit is a result of the study, recorded
        return None, time.perf_counter() - t0, f"{type(exc).__name__}: {str(exc)[:200]}"


def feature_set(tag: str) -> tuple[str, int | None, bool]:
    """(row normalisation, principal components or None, whitened) of a feature set's tag:
    ``raw`` or ``pcaP`` (``pcaPw``: whitened; a final ``r``: the randomized solver, see
    :func:`pca_solver`), optionally after ``l2-`` or ``power-l2-``
    (:func:`vbcore.data.normalize.normalize_rows`); anything else is a one-line ConfigError."""
    m = _tag(tag)
    norm, p, w, _ = m.groups()
    return norm or "none", int(p) if p else None, bool(w)


def pca_solver(tag: str) -> str:
    """The projection's solver of a feature set's tag (``pca_solver``): 'randomized' for a tag that
    ends in ``r`` after its ``pcaP[w]`` (``power-l2-pca64wr``), else 'exact'."""
    return "randomized" if _tag(tag).group(4) else "exact"


def _tag(tag: str) -> re.Match[str]:
    m = re.fullmatch(r"(?:(l2|power-l2)-)?(?:raw|pca([1-9][0-9]*)(w?)(r?))", str(tag))
    if m is None:
        raise ConfigError(f"feature set must be raw or pcaP, P > 0 ('w' after P: whitened; 'r' last: the "
                          f"randomized solver), optionally after l2- or power-l2-, got {tag!r}")
    return m


def vb_fit(X: np.ndarray, y: np.ndarray, learner: str, k: int, tag: str, covariance: str,
           seed: int, max_iter: int, defaults: str = "pipeline") -> dict[str, Any]:
    """One fit with ``defaults``' settings (:func:`pipeline.fit.spec.estimator_params`: 'pipeline',
    the model of ``vbcluster fit -k K``; 'estimator', ``VBMixture``'s scikit-learn defaults) on the
    rows ``X``, already normalised as ``tag`` says, projected by the fit where it names a PCA."""
    from pipeline import VBMixture
    from pipeline.fit.spec import estimator_params

    _, pca, whiten = feature_set(tag)
    kw: dict[str, Any] = {**estimator_params(defaults), "random_state": seed, "max_iter": max_iter}
    if pca:
        kw.update(pca=pca, whiten=whiten, pca_solver=pca_solver(tag))
    model = VBMixture(k, learner=learner, covariance_type=covariance, **kw)
    m, wall, err = timed(lambda: model.fit(X))
    row = {"features": tag, "method": learner, "settings": SETTINGS[defaults],
           "covariance": covariance, "K": k, "wall_s": wall, "note": err}
    if m is None:
        return {**row, "clusters": 0, "nmi": np.nan, "acc": np.nan, "ari": np.nan, "elbo_per_row": np.nan,
                "iterations": 0}
    return {**row, **scores(y, m.predict(X)), "elbo_per_row": float(m.lower_bound_) / len(X),
            "iterations": int(m.n_iter_), "note": "" if m.converged_ else "not converged"}


def sk_fit(Z: np.ndarray, y: np.ndarray, tag: str, method: str, covariance: str, k: int, seed: int,
           max_iter: int) -> dict[str, Any]:
    from sklearn.cluster import KMeans
    from sklearn.mixture import BayesianGaussianMixture

    if method == "kmeans":
        est: Any = KMeans(k, n_init=3, random_state=seed)
    else:
        est = BayesianGaussianMixture(n_components=k, covariance_type=covariance, max_iter=max_iter,
                                      weight_concentration_prior_type="dirichlet_process", random_state=seed)
    m, wall, err = timed(lambda: est.fit(Z))
    row = {"features": tag, "method": f"sklearn-{method}", "settings": "sklearn", "covariance": covariance,
           "K": k, "wall_s": wall, "elbo_per_row": np.nan, "note": err}
    if m is None:
        return {**row, "clusters": 0, "nmi": np.nan, "acc": np.nan, "ari": np.nan, "iterations": 0}
    conv = getattr(m, "converged_", True)
    return {**row, **scores(y, m.predict(Z)), "iterations": int(m.n_iter_),
            "note": "" if conv else "not converged"}


# ---- the study ----------------------------------------------------------------------------------
def default_covariance(learner: str) -> str:
    """The covariance type ``vbcluster fit --learner LEARNER`` uses (the pipeline's default, diag
    where the learner allows it; the estimator's default is scikit-learn's 'full')."""
    from pipeline.fit.spec import FitSpec

    cov = FitSpec.from_dict({"store": "-", "learner": learner}).resolved("pipeline").covariance
    assert cov is not None
    return cov


def plan(quick: bool, projection: bool, only: list[str] | None,
         feature_sets: tuple[str, ...] = FEATURES, defaults: str = "pipeline") -> list[tuple[str, Any]]:
    """The fits in order: ('vb', (learner, K, tag, covariance, defaults)) and ('sk', (tag, method,
    cov, K)), for the feature sets ``feature_sets`` (:func:`feature_set`) that this installation can
    run (without the projection stage: those without a PCA). With the command line's defaults, each
    scikit-learn BGM fit also gets VB EM's fit with VBMixture's scikit-learn defaults (the same
    model and settings: the speed comparison)."""
    ks = QUICK_KS if quick else KS
    todo: list[tuple[str, Any]] = []
    kb = ks[0] if quick else BASELINE_K

    def against_bgm(tag: str, cov: str) -> None:
        todo.append(("sk", (tag, "bgm", cov, kb)))
        if defaults == "pipeline":
            todo.append(("vb", ("vbem", kb, tag, cov, "estimator")))

    for pca, tag in ((feature_set(t)[1], t) for t in feature_sets):
        if pca and not projection:
            continue
        # the targets' fits first (VB EM, scikit-learn on the same settings), so that a run cut short
        # still answers them; then every other learner
        todo.append(("vb", ("vbem", kb, tag, "diag", defaults)))
        against_bgm(tag, "diag")
        todo.append(("sk", (tag, "kmeans", "-", 10)))
        if pca:
            todo.append(("vb", ("vbem", kb, tag, "full", defaults)))
            against_bgm(tag, "full")
        for learner in available_learners():
            for k in ks:
                if (learner, k) != ("vbem", kb):
                    todo.append(("vb", (learner, k, tag, default_covariance(learner), defaults)))
        if pca:
            todo.extend(("vb", ("vbem", k, tag, "full", defaults)) for k in ks if k != kb)
    if only:
        todo = [t for t in todo if (t[1][0] if t[0] == "vb" else f"sklearn-{t[1][1]}") in only]
    return todo


def run(out: Path, *, quick: bool = False, seed: int = 0, rows: int | None = None,
        only: list[str] | None = None, max_iter: int | None = None, split: str = "all",
        feature_sets: tuple[str, ...] = FEATURES, resume: bool = False, defaults: str = "pipeline") -> Path:
    """Run the study into ``out/real`` (see the module docstring); ``defaults`` the settings of the
    vbcluster fits (:func:`vb_fit`: 'pipeline', the command line's, or 'estimator'); ``split``
    extracts only the 10,000 test (``'t10k'``) or 60,000 training images, ``rows`` subsamples,
    ``only`` keeps the named learners / ``sklearn-bgm`` / ``sklearn-kmeans``, ``feature_sets`` the
    feature sets (:func:`feature_set`; quick: :data:`QUICK_FEATURES`); ``resume`` keeps the fits of
    ``fits.jsonl`` (same rows and seed assumed; a fit is its features, method, settings, covariance
    and K) and runs the others; every fit is appended to ``fits.jsonl`` and the report rewritten as
    it ends (a run cut short keeps what it did). Returns the folder."""
    folder = Path(out) / "real"
    folder.mkdir(parents=True, exist_ok=True)
    X, y, info = features(folder, quick, split)
    info["split"], info["defaults"] = split, defaults
    sets = QUICK_FEATURES if quick else tuple(feature_sets)
    for tag in sets:
        feature_set(tag)  # every tag checked before the first fit
    idx = subsample(len(X), rows, seed)
    X, y = X[idx], y[idx]
    iters = max_iter or (3 if quick else 200)
    projection = projection_available()
    log = folder / "fits.jsonl"
    old = log.read_text().splitlines() if resume and log.is_file() else []
    done = {_key(r): r for r in map(_settled, map(json.loads, old))}
    results: list[dict[str, Any]] = list(done.values())
    log.write_text("".join(json.dumps(r, default=float) + "\n" for r in results))
    rows = FeatureRows(X, seed)
    for kind, args in plan(quick, projection, only, sets, defaults):
        if _key(_describe(kind, args)) in done:
            continue
        if kind == "vb":
            learner, k, tag, cov, face = args
            res = vb_fit(rows.normalized(tag), y, learner, k, tag, cov, seed, iters, face)
        else:
            tag, method, cov, k = args
            res = sk_fit(rows.projected(tag), y, tag, method, cov, k, seed, iters)
        results.append(res)
        with open(log, "a") as f:
            f.write(json.dumps(res, default=float) + "\n")
        write_report(folder, results, info, quick, seed, len(idx), projection)
        print(f"real {res['features']} {res['method']} ({res['settings']}) {res['covariance']} K={res['K']}: "
              f"{res['clusters']} clusters, NMI {res['nmi']:.3f}, {res['wall_s']:.1f} s {res['note']}",
              flush=True)
    return folder


def _describe(kind: str, args: Any) -> dict[str, Any]:
    if kind == "vb":
        learner, k, tag, cov, face = args
        return {"features": tag, "method": learner, "settings": SETTINGS[face], "covariance": cov, "K": k}
    tag, method, cov, k = args
    return {"features": tag, "method": f"sklearn-{method}", "settings": "sklearn", "covariance": cov, "K": k}


class FeatureRows:
    """The study's rows per feature set, each made once: normalised (float64 arithmetic, float32
    rows) for vbcluster, whose fits project them themselves; normalised and projected by
    scikit-learn's PCA (whitened where the tag says) for scikit-learn's fits."""

    def __init__(self, X: np.ndarray, seed: int) -> None:
        self.X, self.seed = X, seed
        self._norm: dict[str, np.ndarray] = {"none": X}
        self._proj: dict[str, np.ndarray] = {}

    def normalized(self, tag: str) -> np.ndarray:
        from vbcore.data.normalize import normalize_rows

        norm = feature_set(tag)[0]
        if norm not in self._norm:
            self._norm[norm] = normalize_rows(self.X, norm, dtype=np.float32)
        return self._norm[norm]

    def projected(self, tag: str) -> np.ndarray:
        _, pca, whiten = feature_set(tag)
        if not pca:
            return self.normalized(tag)
        if tag not in self._proj:
            from sklearn.decomposition import PCA

            est = PCA(pca, whiten=whiten, random_state=self.seed)
            self._proj[tag] = est.fit_transform(self.normalized(tag)).astype(np.float32)
        return self._proj[tag]


def _settled(r: dict[str, Any]) -> dict[str, Any]:
    """A logged fit with its ``settings`` (logs before that column: VBMixture's scikit-learn
    defaults, or those named by a ``defaults`` entry)."""
    if "settings" not in r:
        sk = r["method"].startswith("sklearn")
        r = {**r, "settings": "sklearn" if sk else SETTINGS[r.pop("defaults", "estimator")]}
    r.pop("defaults", None)
    return r


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["features"], r["method"], r["settings"], r["covariance"], int(r["K"]))


def write_report(folder: Path, results: list[dict[str, Any]], info: dict[str, Any], quick: bool, seed: int,
                 n: int, projection: bool) -> None:
    rep = Report(folder, "real: every learner on Fashion-MNIST EfficientNet-Lite0 features")
    mode = f"quick ({QUICK_IMAGES} test images)" if quick else f"full, images: {info['split']}"
    model = ("the command line's defaults (`vbcluster fit -k K`: empirical priors, growth, the projected "
             "start)" if info["defaults"] == "pipeline" else "`VBMixture`'s scikit-learn defaults")
    rep.text(f"Mode: {mode}; vbcluster fits with {model}; seed {seed}; {n} rows x 1280 features "
             f"({info['store']}, "
             f"{info['extracted_now']} images extracted by this run in "
             f"{info['extract_s']:.0f} s); one BLAS thread; load average at the end "
             f"{os.getloadavg()[0]:.1f}.")
    if not projection:
        rep.text("The projection stage (`VBMixture(pca=...)`, `--pca`) is not in this installation: the "
                 "projected feature sets were not run.")
    rep.table("results", COLUMNS, [[r[c] for c in COLUMNS] for r in results],
              title="Every fit (clusters: distinct labels of the hard assignment; NMI arithmetic)")
    rep.text(f"{len(results)} fits done (a run cut short lists only those).")
    rep.text(targets(results))
    plot(folder, results)
    rep.image("nmi_time.png", "NMI against wall time per fit (log scale), by feature set")
    rep.write(math.fsum(float(r["wall_s"]) for r in results))  # the fits' (a resumed study's runs too)


def targets(results: list[dict[str, Any]]) -> str:
    """The issue's two targets, as measured in this run."""
    lines = ["## Targets"]
    k100 = [r for r in results if r["K"] == max(r["K"] for r in results) and not r["method"].startswith("sk")
            and r["nmi"] == r["nmi"]]
    if k100:
        best = max(k100, key=lambda r: r["nmi"])
        lines.append(f"- Best NMI from the largest K: {best['nmi']:.3f} ({best['method']}, "
                     f"{best['settings']} settings, {best['features']}, {best['covariance']}, "
                     f"{best['clusters']} clusters); "
                     "target >= 0.56.")
    vb = [r for r in results if r["method"] == "vbem" and r["features"] == "raw" and r["K"] == BASELINE_K
          and r["covariance"] == "diag" and r["settings"] == "sklearn"]
    sk = [r for r in results if r["method"] == "sklearn-bgm" and r["features"] == "raw"]
    if vb and sk and vb[0]["wall_s"] > 0 and sk[0]["clusters"]:
        a, b = vb[0], sk[0]
        lines.append("- VB EM against scikit-learn's BGM, the same model and settings (raw, "
                     f"K = {BASELINE_K}, diag, DP, scikit-learn's priors and start): "
                     f"{b['wall_s'] / a['wall_s']:.1f}x faster ({a['wall_s']:.1f} s, {a['iterations']} it vs "
                     f"{b['wall_s']:.1f} s, {b['iterations']} it); clusters {a['clusters']} vs "
                     f"{b['clusters']} ({100 * (a['clusters'] - b['clusters']) / b['clusters']:+.0f}%); "
                     "targets >= 10x, within 20%.")
    return "\n".join(lines)


def plot(folder: Path, results: list[dict[str, Any]]) -> None:
    plt = pyplot()
    tags = sorted({r["features"] for r in results})
    fig, axes = plt.subplots(1, len(tags), figsize=(6 * len(tags), 4.5), squeeze=False)
    for ax, tag in zip(axes[0], tags, strict=True):
        for r in (r for r in results if r["features"] == tag and r["nmi"] == r["nmi"]):
            sk = r["method"].startswith("sklearn")
            marker = "s" if sk else ("o" if r["K"] in (KS[0], *QUICK_KS) else "^")
            ax.scatter(r["wall_s"], r["nmi"], marker=marker, color="black" if sk else None)
            twin = " (sklearn settings)" if r.get("settings") == "sklearn" and not sk else ""
            ax.annotate(f"{r['method']} {r['K']}{twin}", (r["wall_s"], r["nmi"]), fontsize=6)
        ax.set_xscale("log")
        ax.set_xlabel("wall seconds")
        ax.set_ylabel("NMI")
        ax.set_title(f"Fashion-MNIST, {tag} features")
    save_figure(fig, folder / "nmi_time.png")
