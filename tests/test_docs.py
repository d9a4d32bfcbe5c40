"""User-facing text cites papers by author and year, and every citation resolves in docs/references.md.

Checked: README.md, docs/**/*.md, the ``--help`` text of every ``vbcluster`` command, the
``vbcluster learners`` table, and the docstrings of the public modules, classes and functions of
``vbcore``, ``pipeline`` and ``flows``. Study names (``vbcluster study seed003``) and option values
(``convergence='seed000'``) are identifiers and stay; what fails is a seed number used as a
citation ("seed 003", "seed003 sec. 2", "seed000's", "the seed papers", "shared/seeds/").
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ROOT / "docs" / "references.md"

#: A seed number used as a citation (any case): "seed 003", "Seed 000's", "seed003 sec. 2", "seed
#: papers", "shared/seeds/". An identifier such as `vbcluster study seed003` does not match.
CITATION = re.compile(
    r"(?i)\bseed[ _-]+00\d"
    r"|\bseed00\d(?:'s|\s+(?:eqs?\.|secs?\.|sections?\b|figs?\.|tables?\b|algorithm\b|ref\.|\[))"
    r"|\bseed papers?\b|\bseeds/"
)

#: Short keys as text uses them: "Kuusela et al. 2009", "Lim & Jiang 2024", "Bishop 2006".
KEY = re.compile(r"\b([A-Z][a-zü]+(?: et al\.| & [A-Z][a-zü]+)? (?:19|20)\d\d)\b")


def _markdown() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _docstrings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, docstring) of the module and of its public classes, functions and methods."""
    if (doc := ast.get_docstring(tree, clean=False)) is not None:
        yield 1, doc
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name.startswith("_"):
                continue
            if (doc := ast.get_docstring(node, clean=False)) is not None:
                yield node.lineno, doc
            if isinstance(node, ast.ClassDef):
                todo.extend(node.body)


def _public_modules() -> list[Path]:
    files = []
    for package in ("vbcore", "pipeline", "flows"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if not any(part.startswith("_") and part != "__init__.py" for part in rel.parts):
                files.append(path)
    return files


def _offences(text: str) -> list[str]:
    return [m.group(0) for m in CITATION.finditer(text)]


def test_the_pattern_catches_citations_and_spares_identifiers():
    for bad in ("(seed 003 sec. 2)", "Seed 000's cluster data", "seed003 Table 1", "the seed papers",
                "see shared/seeds/", "SEED 001", "seed_002", "seed000 eq. 5"):
        assert _offences(bad), bad
    for ok in ("vbcluster study seed003 --out DIR", "convergence='seed000'", "`seed001`",
               "random seed 0", "seed 42", "pipeline/studies/seed000.py", "docs/studies/seed003/"):
        assert not _offences(ok), ok


@pytest.mark.parametrize("path", _markdown(), ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_cites_by_author_and_year(path: Path):
    bad = [f"{path.name}:{n}: {m}" for n, line in enumerate(path.read_text().splitlines(), 1)
           for m in _offences(line)]
    assert not bad, "cite papers by author and year (docs/references.md):\n" + "\n".join(bad)


def test_docstrings_cite_by_author_and_year():
    bad = []
    for path in _public_modules():
        tree = ast.parse(path.read_text())
        for line, doc in _docstrings(tree):
            bad += [f"{path.relative_to(ROOT)}:{line}: {m}" for m in _offences(doc)]
    assert not bad, "cite papers by author and year (docs/references.md):\n" + "\n".join(bad)


def _cli_texts() -> Iterator[tuple[str, str]]:
    from flows.cli import app

    runner = CliRunner()
    top = runner.invoke(app, ["--help"], terminal_width=200)
    assert top.exit_code == 0, top.output
    yield "vbcluster --help", top.output
    import typer.main

    group = typer.main.get_command(app)
    names = sorted(group.commands)  # type: ignore[attr-defined]
    assert {"fit", "assign", "report", "study", "learners", "deploy"} <= set(names)
    for name in names:
        res = runner.invoke(app, [name, "--help"], terminal_width=200)
        assert res.exit_code == 0, (name, res.output)
        yield f"vbcluster {name} --help", res.output
    res = runner.invoke(app, ["learners"], terminal_width=400)
    assert res.exit_code == 0, res.output
    yield "vbcluster learners", res.output


def test_cli_text_cites_by_author_and_year():
    bad = [f"{where}: {m}" for where, text in _cli_texts() for m in _offences(text)]
    assert not bad, "cite papers by author and year (docs/references.md):\n" + "\n".join(bad)


#: Capitalised words that precede a year without being an author ("Measured 2026-11-22").
NOT_AUTHORS = frozenset({"Measured", "Run", "Updated", "Since", "In", "On", "Until", "From", "Results"})


def _keys(text: str) -> set[str]:
    return {key for key in KEY.findall(text) if key.split()[0] not in NOT_AUTHORS}


def test_every_citation_resolves_in_references():
    known = {m.group(1) for m in re.finditer(r"^\*\*(.+?)\*\* —", REFERENCES.read_text(), re.M)}
    assert {"Kuusela et al. 2009", "Watanabe & Watanabe 2005", "Honkela et al. 2007",
            "Lim & Jiang 2024", "Bishop 2006", "Hoffman et al. 2013"} <= known
    used: dict[str, str] = {}
    for path in _markdown():
        for key in _keys(path.read_text()):
            used.setdefault(key, str(path.relative_to(ROOT)))
    for path in _public_modules():
        for _, doc in _docstrings(ast.parse(path.read_text())):
            for key in _keys(doc):
                used.setdefault(key, str(path.relative_to(ROOT)))
    missing = {key: where for key, where in used.items() if key not in known}
    assert not missing, f"citations with no entry in docs/references.md: {missing}"


# ---- the API reference (make docs) ------------------------------------------------------------------


def _api_builder():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_api_docs", ROOT / "scripts" / "build_api_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_builds_clean(tmp_path):
    """`make docs` in a temporary folder: exit 0, no pdoc warning, a page for every public module."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "MPLBACKEND": "Agg"}
    out = tmp_path / "api"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_api_docs.py"), "--out", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    modules = _api_builder().public_modules()
    assert {"pipeline.estimator", "pipeline.runs.directory", "flows.cluster",
            "vbcore.model.elbo"} <= set(modules)
    for name in modules:
        assert (out / (name.replace(".", "/") + ".html")).is_file(), name
    estimator = (out / "pipeline" / "estimator.html").read_text()
    for text in ("VBMixture", "lower_bound_", "predict_proba", "n_components"):
        assert text in estimator, text
    assert "cluster_flow" in (out / "flows" / "cluster.html").read_text()
    assert "VBMixture" in (out / "pipeline.html").read_text()


def test_api_build_reports_a_module_it_cannot_document(tmp_path, monkeypatch):
    builder = _api_builder()
    monkeypatch.setattr(builder, "public_modules", lambda root=None: ["vbcore.errors", "vbcore.no_such"])
    monkeypatch.setattr(builder, "REQUIRED", ())
    problems = builder.build(tmp_path / "api")
    assert any("vbcore.no_such" in p for p in problems), problems
    assert "missing page: vbcore/no_such.html" in problems
    assert (tmp_path / "api" / "vbcore" / "errors.html").is_file()


def test_readme_says_how_long_make_test_takes():
    """A new user knows before `make test` that it runs for minutes (the figure: CI's test time)."""
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"`make test` takes about \d+ minutes on a 2-core machine \(CI measured \d+ s", readme)
