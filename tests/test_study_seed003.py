"""The seed 003 study runs (quick version) and writes its tables, curves and plot."""

import csv

from pipeline.studies import seed003


def test_seed003_quick(tmp_path):
    folder = seed003.run(tmp_path, quick=True, seed=0)
    assert folder == tmp_path / "seed003"
    rows = list(csv.DictReader(open(folder / "results.csv")))
    assert {r["learner"] for r in rows} == set(seed003.LEARNERS)
    assert {r["dataset"] for r in rows} == set(seed003.QUICK)
    for r in rows:
        assert 0.0 <= float(r["nmi"]) <= 1.0 and 0.0 <= float(r["acc"]) <= 1.0
        assert 1 <= int(r["k_effective"]) <= int(r["truncation"])
        if r["learner"] == "mm":
            assert float(r["cpu_factor_mm"]) == 1.0
    # the learners cluster the easy synthetic data far better than chance
    assert max(float(r["nmi"]) for r in rows if r["learner"] == "sga-f") > 0.5
    text = (folder / "README.md").read_text()
    assert "no VGG16 features" in text and "Table 2" in text and "Table 3" in text
    assert (folder / "elbo_curves.png").stat().st_size > 1000

    # refit: only sga-f is fitted again; every other fit is taken from fits.json unchanged
    before = {(r["dataset"], r["learner"]): r for r in rows}
    seed003.run(tmp_path, quick=True, seed=0, datasets=["caltech10"], refit=["sga-f"])
    again = list(csv.DictReader(open(folder / "results.csv")))
    assert {r["learner"] for r in again} == set(seed003.LEARNERS)
    for r in again:
        old = before[(r["dataset"], r["learner"])]
        if r["learner"] == "sga-f":  # a new fit: the same result (deterministic), a new timing
            assert r["nmi"] == old["nmi"] and r["wall_s"] != old["wall_s"]
        else:
            assert r["nmi"] == old["nmi"] and r["wall_s"] == old["wall_s"]
    assert "Fitted in this run: sga-f" in (folder / "README.md").read_text()


def test_seed003_refit_errors(tmp_path):
    import pytest

    from vbcore.errors import ConfigError

    with pytest.raises(ConfigError, match="refit names unknown learners \\['nope'\\]"):
        seed003.run(tmp_path, quick=True, refit=["nope"])
    with pytest.raises(ConfigError, match="refit needs the fits of an earlier run in .*fits.json"):
        seed003.run(tmp_path, quick=True, refit=["mm"])
