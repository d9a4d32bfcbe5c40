"""Learner options declared once and checked by one function (issue 54, deliver 2):
:mod:`pipeline.fit.learners.options`, ``vbcluster learners NAME`` and docs/learner-options.md."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.fit.learners import LEARNERS, Learner, learner_class
from pipeline.fit.learners.options import Opt, Options, Rule, check_options, describe
from vbcore.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TYPES = {"bool": bool, "int": int, "float": float, "str": str}


#: the package's learners (a plug-in's or a test's may list plain defaults)
PACKAGE = [name for name, cls in LEARNERS.items() if cls.__module__.startswith("pipeline.fit.learners.")]


@pytest.mark.parametrize("name", PACKAGE)
def test_every_declaration_is_complete(name):
    cls = LEARNERS[name]
    assert isinstance(cls.options, Options), name
    for key, decl in cls.options.decls.items():
        assert decl.help.strip(), (name, key)
        assert decl.default is None or isinstance(decl.default, TYPES[decl.kind]), (name, key)
        assert decl.broken(decl.default) == "", (name, key)  # the default is inside its own range
        if decl.choices is not None:
            assert decl.default in decl.choices, (name, key)
        for value in decl.special:
            assert decl.broken(value) == "", (name, key, value)
    for rule in cls.options.rules:
        assert set(rule.names) <= set(cls.options), (name, rule.names)
        assert not rule.broken(dict(cls.options), "tied"), (name, rule.names)  # the defaults keep it
    assert cls.parse_options({}) == dict(cls.options)


@pytest.mark.parametrize(("learner", "options", "message"), [
    # out of range: integer, with the special values named; float interval; open bounds
    ("vbem", {"candidates": -2}, "learner option 'candidates' of 'vbem' must be an integer >= -1 "
                                 "(-1: automatic, 0: the exact E-step), got -2"),
    ("sga-f", {"move_every": -1}, "learner option 'move_every' of 'sga-f' must be an integer >= 1 (0: auto), "
                                  "got -1"),
    ("vbem", {"move_every": 0}, "learner option 'move_every' of 'vbem' must be an integer >= 1, got 0"),
    ("sga", {"eta": "0.5"}, "learner option 'eta' of 'sga' must be in [0.001, 0.1], got 0.5"),
    ("svi", {"kappa": 0.5}, "learner option 'kappa' of 'svi' must be in (0.5, 1], got 0.5"),
    ("mm", {"prune_threshold": 1}, "learner option 'prune_threshold' of 'mm' must be in [0, 1), got 1.0"),
    ("svi", {"tau": -1}, "learner option 'tau' of 'svi' must be a number >= 0, got -1.0"),
    ("ncg", {"eps": 0}, "learner option 'eps' of 'ncg' must be a number > 0, got 0.0"),
    ("cg", {"line_search_evals": 0}, "learner option 'line_search_evals' of 'cg' must be >= 1, got 0"),
    # a wrong choice, a value outside a grammar
    ("vbem", {"grow_splits": "some"}, "learner option 'grow_splits' of 'vbem' must be one of "
                                      "('all', 'gated'), "
                                      "got 'some'"),
    ("sga-m", {"elbo": "exact"}, "learner option 'elbo' of 'sga-m' must be one of ('minibatch', 'full'), "
                                 "got 'exact'"),
    ("vbem", {"moves": "split"}, "learner option 'moves' of 'vbem' must be 'none' or a "
                                 "comma-separated subset "
                                 "of ('merge', 'delete'), got 'split'"),
    ("mm", {"moves": "merge,delete"}, "learner option 'moves' of 'mm' must be 'none' or 'merge' "
                                      "(hard-assignment learners have no delete move), got 'merge,delete'"),
    # a wrong type
    ("vbem", {"memo": "half"}, "learner option 'memo' of 'vbem' must be a number, got 'half'"),
    ("vbem", {"neighbours": 2.5}, "learner option 'neighbours' of 'vbem' must be an integer, got 2.5"),
    ("vbem", {"accelerate": "maybe"}, "learner option 'accelerate' of 'vbem' must be true or false, "
                                      "got 'maybe'"),
    ("mm", {"prune_threshold": float("inf")}, "learner option 'prune_threshold' of 'mm' must be a finite "
                                              "number, got inf"),
    # a broken rule
    ("vbem", {"memo": 0.5, "candidates": 2}, "learner option 'memo' of 'vbem' keeps the exact E-step's "
                                             "statistics: it cannot be combined with 'candidates' > 0 yet"),
    ("sga", {"candidates": 2, "moves": "merge"}, "learner options 'candidates' and 'moves' of 'sga' "
                                                 "cannot be "
                                                 "combined yet; use candidates=0 or moves=none"),
    ("vbem-ps", {"step": 100}, "learner options of 'vbem-ps' need 0 < step <= max_step, got step=100.0, "
                               "max_step=64.0"),
    # an unknown name
    ("svi", {"eta": 0.1}, "learner 'svi' has no option 'eta'; its options: elbo, judge, kappa, minibatch, "
                          "minibatch_slice, move_every, move_neighbours, move_pairs, moves, prune_threshold, "
                          "tau"),
])
def test_the_one_check_refuses_with_one_line(learner, options, message):
    with pytest.raises(ConfigError) as err:
        check_options(learner_class(learner), options)
    assert str(err.value) == message and "\n" not in message


def test_rules_on_the_covariance_wait_for_it():
    """VB EM's tied rule (candidates and moves) needs the fit's covariance type: parse_options keeps
    it, the spec's check (with the covariance) refuses it."""
    cls = learner_class("vbem")
    opts = cls.parse_options({"candidates": 2, "moves": "merge"})
    cls.check_spec(SimpleNamespace(covariance="diag", weights="dirichlet_process", learner_options=opts))
    with pytest.raises(ConfigError, match=r"^learner options 'candidates' and 'moves' of 'vbem' cannot be "
                                          r"combined for covariance 'tied' yet; use candidates=0 \(the exact "
                                          r"E-step\) with moves$"):
        cls.check_spec(SimpleNamespace(covariance="tied", weights="dirichlet_process", learner_options=opts))


def test_special_values_and_boundaries():
    sga = learner_class("sga-f")
    assert sga.parse_options({"move_every": 0})["move_every"] == 0  # 0: auto, outside the range >= 1
    assert sga.parse_options({"eta": 0.001})["eta"] == 0.001 and sga.parse_options({"eta": 0.1})["eta"] == 0.1
    assert learner_class("sga-m").parse_options({"alpha": 1})["alpha"] == 1.0
    assert learner_class("svi").parse_options({"kappa": 1})["kappa"] == 1.0
    assert learner_class("vbem").parse_options({"moves": " Merge , delete"})["moves"] == " Merge , delete"
    assert learner_class("mm").parse_options({"prune_threshold": None})["prune_threshold"] is None


class _Toy(Learner):
    """A learner outside the package: its options are declared and checked with no code of its own."""

    name = "toy-options"
    options = Options({
        "rate": Opt(0.5, "Step.", low=0, high=1, low_open=True),
        "steps": Opt(3, "Steps per iteration.", low=1, special={0: "as many as rows"}),
        "mode": Opt("fast", "How.", choices=("fast", "slow")),
        "limit": Opt(10, "Upper limit of steps.", low=1),
    }, rules=[Rule(("steps", "limit"), lambda o, _: o["steps"] > o["limit"],
                   "learner options of {learner!r} need steps <= limit, got steps={steps!r}, "
                   "limit={limit!r}")])


@pytest.mark.parametrize(("options", "message"), [
    ({"rate": 0}, "learner option 'rate' of 'toy-options' must be in (0, 1], got 0.0"),
    ({"steps": -1}, "learner option 'steps' of 'toy-options' must be an integer >= 1 (0: as many as rows), "
                    "got -1"),
    ({"mode": "medium"}, "learner option 'mode' of 'toy-options' must be one of ('fast', 'slow'), "
                         "got 'medium'"),
    ({"limit": "ten"}, "learner option 'limit' of 'toy-options' must be a number, got 'ten'"),
    ({"steps": 11}, "learner options of 'toy-options' need steps <= limit, got steps=11, limit=10"),
])
def test_a_toy_learner_gets_its_declarations_checked(options, message):
    with pytest.raises(ConfigError) as err:
        _Toy.parse_options(options)
    assert str(err.value) == message
    assert _Toy.parse_options({"steps": "0", "rate": "1", "mode": "slow"}) == \
        {"rate": 1.0, "steps": 0, "mode": "slow", "limit": 10}


def test_a_plain_dict_of_defaults_is_typed_by_them():
    class Plain(Learner):
        name = "plain-options"
        options = {"eta": 0.1, "batch": 100}

    assert Plain.parse_options({"batch": "7"}) == {"eta": 0.1, "batch": 7}
    assert [row["type"] for row in describe(Plain)] == ["float", "int"]
    with pytest.raises(ConfigError, match=r"^learner option 'batch' of 'plain-options' must be an integer, "
                                          r"got 2\.5$"):
        Plain.parse_options({"batch": 2.5})


def test_no_check_function_is_left():
    """One check: no learner module defines a check_* function or a check_options override (check_spec
    checks the fit's covariance and weight types, and applies the rules that need the covariance)."""
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in (ROOT / "pipeline/fit/learners").rglob("*.py")
             if p.name != "options.py" for m in re.finditer(r"def check_(?!spec\b)\w+", p.read_text())]
    assert found == [], found


def test_vbcluster_learners_name_lists_the_declarations():
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "learners", "sga-m"], capture_output=True,
                         text=True, timeout=300, env={"COLUMNS": "400", "PATH": ""})
    assert out.returncode == 0, out.stderr
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in out.stdout.splitlines() if line.count("│") == 6}
    cls = learner_class("sga-m")
    for key, decl in cls.options.decls.items():
        kind, default, accepts, help_ = rows[key]
        assert (kind, default) == (decl.kind, repr(decl.default)), key
        assert accepts.startswith(decl.requirement()) and help_.startswith(decl.help), key
    assert rows["alpha"][2] == "in [0, 1]"
    assert rows["move_every"][3].endswith("Special values: 0: auto. Resolved: 0 by move_interval when the "
                                          "learner builds its moves.")
    assert "candidates + moves" in rows and "cannot be combined yet" in rows["candidates + moves"][3]
    bad = subprocess.run([sys.executable, "-m", "pipeline.cli", "learners", "nope"], capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and "learner must be one of" in bad.stdout + bad.stderr


def test_the_docs_table_is_generated_from_the_declarations():
    from pipeline.cli_format import learner_options_markdown

    doc = (ROOT / "docs" / "learner-options.md").read_text()
    assert doc == learner_options_markdown(), (
        "docs/learner-options.md is stale: python -c \"from pipeline.cli_format import "
        "learner_options_markdown as m; print(m(), end='')\" > docs/learner-options.md")
