"""The ``real`` study (pipeline/studies/real.py): the message naming the apt command when
Fashion-MNIST is missing, and a quick run through the idx source, the ONNX extractor and every
learner (skipped where the Debian package or ../shared/models/ is absent)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pipeline.studies import real
from vbcore.errors import ConfigError


def test_missing_fashion_mnist_names_the_apt_command(tmp_path, monkeypatch):
    monkeypatch.setattr(real, "FASHION", tmp_path / "nothing")
    with pytest.raises(ConfigError, match=r"^Fashion-MNIST is not installed \(.*nothing has no idx files\): "
                                          r"apt-get install -y dataset-fashion-mnist$"):
        real.run(tmp_path / "out", quick=True)


def test_missing_model_names_the_export_script(tmp_path, monkeypatch):
    monkeypatch.setenv("VBCLUSTER_SHARED_MODELS", str(tmp_path))
    with pytest.raises(ConfigError, match=r"no efficientnet_lite0_features.onnx in .*: build it with "
                                          r"scripts/export_efficientnet_lite0.py"):
        real.model_path()


def test_plan_covers_every_learner_and_the_baselines():
    todo = real.plan(quick=False, projection=True, only=None)
    vb = [a for kind, a in todo if kind == "vb"]
    sk = [a for kind, a in todo if kind == "sk"]
    from pipeline.studies import available_learners

    for learner in available_learners():
        cov = real.default_covariance(learner)
        want = {(k, t) for k in (50, 100) for t in real.FEATURES}
        got = [(k, t) for lr, k, t, c, face in vb if lr == learner and c == cov and face == "pipeline"]
        assert len(got) == len(want) and set(got) == want
    assert ("vbem", 100, "power-l2-pca64w", "full", "pipeline") in vb
    full = {(k, t) for lr, k, t, c, face in vb if c == "full" and face == "pipeline"}
    assert full == {(k, t) for k in (50, 100) for t in ("pca64", "pca128", "power-l2-pca64w")}
    assert todo[:4] == [("vb", ("vbem", 50, "raw", "diag", "pipeline")), ("sk", ("raw", "bgm", "diag", 50)),
                        ("vb", ("vbem", 50, "raw", "diag", "estimator")),
                        ("sk", ("raw", "kmeans", "-", 10))]  # the targets' fits first
    per_set = [("bgm", "diag", 50), ("kmeans", "-", 10)]
    assert sk == [(t, m, c, k) for t in real.FEATURES
                  for m, c, k in per_set + ([("bgm", "full", 50)] if t != "raw" else [])]
    # every BGM fit has VB EM's twin with VBMixture's scikit-learn defaults (the same model), only those
    twins = [(t, c, k) for lr, k, t, c, face in vb if face == "estimator"]
    assert twins == [(t, c, k) for t, m, c, k in sk if m == "bgm"]
    assert {lr for lr, k, t, c, face in vb if face == "estimator"} == {"vbem"}
    sk_settings = real.plan(False, True, None, defaults="estimator")
    assert {a[-1] for kind, a in sk_settings if kind == "vb"} == {"estimator"}
    assert len(sk_settings) == len(todo) - len(twins)
    raw_only = real.plan(False, False, None)  # without the projection stage: unprojected sets only
    assert {(a[2] if kind == "vb" else a[0]) for kind, a in raw_only} == {"raw"}


@pytest.mark.parametrize("tag, parsed", [("raw", ("none", None, False)), ("pca64", ("none", 64, False)),
                                         ("pca16w", ("none", 16, True)), ("l2-raw", ("l2", None, False)),
                                         ("power-l2-pca64w", ("power-l2", 64, True))])
def test_feature_set_tags(tag, parsed):
    assert real.feature_set(tag) == parsed
    assert real.pca_solver(tag) == "exact"
    if parsed[1] is not None:  # a final 'r': the same set through the randomized solver
        assert real.feature_set(tag + "r") == parsed and real.pca_solver(tag + "r") == "randomized"


@pytest.mark.parametrize("tag", ["pca0", "pca", "rawish", "l1-raw", "pca64x", "power-pca64", "", "rawr",
                                 "pca64rw"])
def test_a_bad_feature_set_is_one_line(tag):
    with pytest.raises(ConfigError, match=r"^feature set must be raw or pcaP, P > 0 .*, got '.*'$"):
        real.feature_set(tag)


def test_feature_rows_normalise_then_project():
    """vbcluster gets the normalised rows (it projects them itself); scikit-learn the normalised rows
    projected and whitened by its PCA; each made once."""
    from sklearn.decomposition import PCA

    from vbcore.data.normalize import normalize_rows

    X = np.random.default_rng(0).normal(size=(300, 12)).astype(np.float32)
    rows = real.FeatureRows(X, seed=0)
    assert rows.normalized("pca4") is X and rows.projected("raw") is X
    norm = rows.normalized("power-l2-pca4w")
    np.testing.assert_array_equal(norm, normalize_rows(X, "power-l2", dtype=np.float32))
    assert rows.normalized("power-l2-raw") is norm  # one normalisation per method
    Z = rows.projected("power-l2-pca4w")
    want = PCA(4, whiten=True, random_state=0).fit_transform(norm)
    np.testing.assert_allclose(Z, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(Z.var(0, ddof=1), 1.0, rtol=1e-4)
    assert rows.projected("power-l2-pca4w") is Z and Z.dtype == np.float32


def test_resume_keys_fits_by_their_settings():
    """A log written before the settings column reads as VBMixture's defaults (or its ``defaults``
    entry); a fit's key holds its settings, so both models' rows of one learner coexist."""
    old = {"features": "raw", "method": "vbem", "covariance": "diag", "K": 50}
    assert real._settled(dict(old))["settings"] == "sklearn"
    assert real._settled({**old, "defaults": "pipeline"}) == {**old, "settings": "cli"}
    assert real._settled({**old, "method": "sklearn-bgm", "defaults": "pipeline"})["settings"] == "sklearn"
    a = real._describe("vb", ("vbem", 50, "raw", "diag", "pipeline"))
    b = real._describe("vb", ("vbem", 50, "raw", "diag", "estimator"))
    assert real._key(a) != real._key(b) and real._key(b) == real._key(real._settled(dict(old)))


def test_quick_run_every_learner_on_real_features(tmp_path):
    try:
        real.fashion_mnist()
        real.model_path()
    except ConfigError as exc:
        pytest.skip(str(exc))
    folder = real.run(tmp_path, quick=True, only=None)
    fits = [json.loads(line) for line in (folder / "fits.jsonl").read_text().splitlines()]
    failed = [(f["method"], f["note"]) for f in fits if f["note"] not in ("", "not converged")]
    assert not failed, failed  # every learner and baseline runs on the real features
    from pipeline.studies import available_learners

    assert {f["method"] for f in fits} >= set(available_learners()) | {"sklearn-bgm", "sklearn-kmeans"}
    km = next(f for f in fits if f["method"] == "sklearn-kmeans")
    assert km["clusters"] == 10 and km["nmi"] > 0.3  # real features carry the classes
    raw = [f for f in fits if f["features"] == "raw"]
    assert {f["covariance"] for f in raw if f["method"] == "vbem"} == {"diag"}  # vbcluster fit's default
    if real.projection_available():  # full covariance on the float32 projected features
        for tag in real.QUICK_FEATURES[1:]:
            full = [f for f in fits if f["features"] == tag and f["covariance"] == "full"]
            assert {f["method"] for f in full} == {"vbem", "sklearn-bgm"}
    assert all(np.isfinite(f["elbo_per_row"]) for f in fits if not f["method"].startswith("sklearn"))
    text = (folder / "README.md").read_text()
    assert "| raw | vbem | cli |" in text and "| raw | vbem | sklearn |" in text
    assert (folder / "nmi_time.png").stat().st_size > 0

    wall = float(re.search(r"_Study wall time: ([\d.]+) s\._", text).group(1))  # the fits' sum
    assert wall == pytest.approx(sum(f["wall_s"] for f in fits), abs=0.06)
    _, _, info = real.features(folder, quick=True)  # the features are not extracted again
    assert info["extracted_now"] == 0 and info["rows"] == real.QUICK_IMAGES


@pytest.mark.parametrize("defaults", ["pipeline", "estimator"])
def test_a_study_fit_is_the_model_it_names(defaults):
    """``vb_fit`` fits the command line's model (``estimator_params()``) or VBMixture's own: the same
    bound as that estimator made directly, and not the other's."""
    from pipeline import VBMixture
    from pipeline.fit.spec import estimator_params

    rng = np.random.default_rng(3)
    X = np.concatenate([rng.normal(c, 1.0, size=(150, 4)) for c in (-6.0, 0.0, 6.0)]).astype(np.float32)
    y = np.repeat(np.arange(3), 150)
    row = real.vb_fit(X, y, "vbem", 6, "raw", "diag", 0, 30, defaults)

    def bound(face):
        kw = {**estimator_params(face), "random_state": 0, "max_iter": 30}
        m = VBMixture(6, covariance_type="diag", **kw)
        return m.fit(X).lower_bound_ / len(X)

    other = "estimator" if defaults == "pipeline" else "pipeline"
    assert row["elbo_per_row"] == bound(defaults) != bound(other)
    assert row["settings"] == real.SETTINGS[defaults]
    assert row["note"] in ("", "not converged") and row["nmi"] > 0.9
