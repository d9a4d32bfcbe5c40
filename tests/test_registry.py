"""One learner registry (issue 54, deliver 5): every face that names learners reads
:data:`pipeline.fit.learners.LEARNERS` -- ``vbcluster learners``, the report's curves, ``partial_fit``,
the ``VBMixture`` docstring and the help -- so a learner registered at runtime is seen by them, and no
test keeps a list of names."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from pipeline import VBMixture
from pipeline.fit.learners import LEARNERS, learner_names, names_text, register
from pipeline.fit.learners.vbem.learner import VBEM
from pipeline.fit.spec import setting_help
from pipeline.runs.report_curves import data_passes
from vbcore.errors import ConfigError

TOY = "toy-registry-test"
X = np.random.default_rng(3).normal(size=(300, 3)) + np.repeat([[0.0], [6.0], [12.0]], 100, axis=0)


@pytest.fixture
def toy():
    """A learner registered at runtime (VB EM under another name, declaring 2 passes per iteration),
    removed from the registry afterwards."""

    class Toy(VBEM):
        """A toy learner registered by tests/test_registry.py."""

        passes_per_iteration = 2

    register(TOY)(Toy)
    try:
        yield Toy
    finally:
        del LEARNERS[TOY]


def _learners_table() -> str:
    from pipeline.cli import app

    out = CliRunner().invoke(app, ["learners"], terminal_width=400)
    assert out.exit_code == 0, out.output
    return out.output


def _row(table: str, name: str) -> str:
    """The first line of ``name``'s row in the table."""
    cells = [line.split("│") for line in table.splitlines()]
    return next("│".join(c) for c in cells if len(c) > 2 and c[1].strip() == name)


def _passes(name: str, tmp_path) -> str:
    run = {"learner": name, "elbo_history": [-3.0, -2.0, -1.0], "elbo": -1.0, "n_rows": 1000, "settings": {}}
    return data_passes(tmp_path, run)[1]


def _expected_passes(cls) -> str:
    if "minibatch" in cls.options:
        return "passes per minibatch step"
    if cls.passes_per_iteration == 1:
        return "one pass per iteration"
    if cls.passes_per_iteration is not None:
        return f"{cls.passes_per_iteration} passes per iteration"
    return "passes per iteration unknown"


def _check_faces(tmp_path) -> None:
    """Every registered learner in `vbcluster learners` (with its family), the report's x axis and
    ``partial_fit`` (fitted, or refused naming the learners that can)."""
    table = _learners_table()
    can = learner_names(partial_fit=True)
    assert can, "partial_fit needs a learner that declares it"
    for name, cls in LEARNERS.items():
        assert cls.family in ("vbem", "point", "gradient"), (name, cls.family)
        assert cls.family in _row(table, name), (name, table)
        assert _expected_passes(cls) in _passes(name, tmp_path), name
        model = VBMixture(2, covariance_type=cls.default_covariance or "diag", learner=name, max_iter=2,
                          random_state=0, **({"learner_options": {"minibatch": 100}}
                                             if "minibatch" in cls.options else {}))
        if cls.partial_fit:
            assert model.partial_fit(X).n_iter_ >= 1
            continue
        with pytest.raises(ConfigError, match="partial_fit runs VB EM") as err:
            model.partial_fit(X)
        assert all(f"learner={c!r}" in str(err.value) for c in can), str(err.value)


def test_every_registered_learner_is_in_every_face(tmp_path):
    assert set(learner_names()) == set(LEARNERS) and len(LEARNERS) >= 10
    _check_faces(tmp_path)


def test_a_learner_registered_at_runtime_is_seen_by_the_faces(toy, tmp_path):
    assert learner_names(family="vbem")[-1] == TOY and TOY in learner_names(partial_fit=True)
    assert "2 passes per iteration" in _passes(TOY, tmp_path)
    assert "A toy learner" in _row(_learners_table(), TOY)  # its docstring's first line
    _check_faces(tmp_path)  # the toy fits partial_fit and the others' refusals name it
    assert TOY not in VBMixture.__doc__  # the docstring is written once, at import (see below)


def test_vbmixture_docstring_names_the_registry():
    """Written at import from the registry (pipeline/estimator.py): every learner, the point family
    (default covariance 'fixed') and the learners that grow."""
    doc = " ".join(VBMixture.__doc__.split())
    assert "$" not in doc
    assert f"LEARNERS``: {names_text(learner_names())};" in doc
    assert f"('fixed' for the point learners: {names_text(learner_names(family='point'))})" in doc
    assert f"Grow the truncation (learners {names_text(learner_names(grows=True))}; DP weights)" in doc


def test_what_the_help_says_of_the_point_family_holds_for_each_of_its_learners():
    """The help names the point family where it once listed mm, sga*, svi: fixed covariance by
    default, alpha0 = N, sigma^2 from the learner's own estimate."""
    assert "fixed for the point family" in setting_help("covariance")
    assert "a0 = N for the point family" in setting_help("weight_concentration_prior")
    point = learner_names(family="point")
    assert point
    for name in point:
        cls = LEARNERS[name]
        assert cls.default_covariance == "fixed" and cls.default_weight_concentration(123.0) == 123.0
        assert cls.sigma2_sample_rows is not None
    for name in set(LEARNERS) - set(point):
        assert LEARNERS[name].default_covariance != "fixed", name
        assert LEARNERS[name].default_weight_concentration(123.0) is None, name
    grow_help = setting_help("grow") + setting_help("components")
    assert grow_help.count("`vbcluster learners`") == 2 and learner_names(grows=True)


def test_the_package_registers_every_learner_module():
    """Importing the package imports every module in it: each registered class lives in one of them,
    and each module that defines a registered class was imported."""
    import pkgutil
    import sys

    import pipeline.fit.learners as package

    modules = {info.name for info in pkgutil.walk_packages(package.__path__, prefix="pipeline.fit.learners.")}
    assert modules <= set(sys.modules)
    assert {cls.__module__ for cls in LEARNERS.values()} <= modules
