"""The stages inside each layer (docs/architecture.md): which subpackage may import which.

``vbcore`` and ``pipeline`` are split into subpackages named after the data path; each unit (a
subpackage, or a module at the top of its layer) may import only the units listed for it here, so
the stages stay in the order the data flows. An import of a unit not listed is reported as
``file:line: UNIT imports OTHER``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_layering import find_forbidden_imports  # the same import walker (relative imports resolved)

ROOT = Path(__file__).resolve().parents[1]

#: vbcore: errors, the lazy exports and where arrays live (array namespaces, host copies) below
#: everything; rows' rules; the model and its bound; chunk kernels; the learners' math and the moves
#: on top (neither imports the other)
_VB_BASE = frozenset({"errors", "lazy", "arrays"})
VBCORE: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "lazy": frozenset(),
    "arrays": frozenset(),
    "data": _VB_BASE,
    "model": _VB_BASE | {"data"},
    "kernels": _VB_BASE | {"data", "model"},
    "learners": _VB_BASE | {"data", "model", "kernels"},
    "moves": _VB_BASE | {"data", "model", "kernels"},
}

_BASE = frozenset({"files", "store", "engine"})
#: pipeline: files < store < engine < ingest/extract (one stage: readers hand images to extraction,
#: extraction writes through the ingest writer) < fit < runs < service (the one fit service) < the
#: faces (estimator, then the command line, which also runs the studies)
PIPELINE: dict[str, frozenset[str]] = {
    "files": frozenset(),
    "store": frozenset({"files"}),
    "engine": frozenset({"files", "store"}),
    "ingest": _BASE | {"extract"},
    "extract": _BASE | {"ingest"},
    "fit": _BASE,
    "runs": _BASE | {"extract", "fit"},
    "service": _BASE | {"fit", "runs"},
    "estimator": _BASE | {"fit", "runs", "service"},
    "studies": _BASE | {"ingest", "extract", "fit", "runs", "service", "estimator"},
    "cli_format": _BASE | {"fit", "runs"},
    "cli": _BASE | {"ingest", "extract", "fit", "runs", "service", "estimator", "studies", "cli_format"},
}
LAYERS = {"vbcore": VBCORE, "pipeline": PIPELINE}


def unit_of(module: str) -> str | None:
    """The unit of a dotted module name of a layer (``pipeline.fit.learners.vbem.learner`` -> ``fit``), None
    for the layer's package itself (its ``__init__`` offers names from every unit, on first use)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def stage_violations(source: str, filename: str, module: str) -> list[str]:
    """``file:line: UNIT imports OTHER`` for each import of a unit of the same layer that ``module``'s
    unit may not import."""
    layer = module.split(".")[0]
    rules = LAYERS[layer]
    me = unit_of(module)
    if me is None:
        return []
    allowed = rules[me] | {me}
    package = module if filename.endswith("__init__.py") else module.rpartition(".")[0]
    found = []
    for hit in find_forbidden_imports(source, filename, {layer}, package=package):
        line, _, imported = hit.rpartition(": imports ")
        other = unit_of(imported)
        if other is None and imported == layer:
            continue
        if other not in allowed:
            found.append(f"{line}: {me} imports {other}")
    return found


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _scan(layer: str) -> tuple[list[str], set[str]]:
    found: list[str] = []
    units: set[str] = set()
    for path in sorted((ROOT / layer).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        module = _module_of(path)
        if unit_of(module) is not None:
            units.add(str(unit_of(module)))
        found += stage_violations(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), module)
    return found, units


def test_every_unit_has_a_rule() -> None:
    for layer, rules in LAYERS.items():
        _, units = _scan(layer)
        assert units == set(rules), f"{layer}: units without a rule {units - set(rules)}, " \
                                    f"rules without a unit {set(rules) - units}"


def test_vbcore_stages_import_only_the_stages_below() -> None:
    bad, _ = _scan("vbcore")
    assert not bad, "vbcore stages out of order:\n" + "\n".join(bad)


def test_pipeline_stages_import_only_the_stages_below() -> None:
    bad, _ = _scan("pipeline")
    assert not bad, "pipeline stages out of order:\n" + "\n".join(bad)


def test_stage_checker_flags_an_import_upwards() -> None:
    source = (
        "from pipeline.files.atomic import write_file\n"
        "from pipeline.store import integrity\n"
        "def f():\n"
        "    from pipeline.fit.spec import FitSpec\n"
        "    import pipeline.runs.directory\n"
        "from . import journal\n"
        "from .. import fit\n"
        "from pipeline import VBMixture\n"
    )
    hits = stage_violations(source, "pipeline/store/features.py", "pipeline.store.features")
    assert hits == [
        "pipeline/store/features.py:4: store imports fit",
        "pipeline/store/features.py:5: store imports runs",
        "pipeline/store/features.py:7: store imports fit",
    ]
    ok = "from vbcore.model.priors import Prior\nfrom vbcore.data.limits import BLOCK_ROWS\n"
    assert stage_violations(ok, "vbcore/kernels/x.py", "vbcore.kernels.x") == []
    assert stage_violations("from vbcore.moves import exact\n", "vbcore/learners/x.py", "vbcore.learners.x") \
        == ["vbcore/learners/x.py:1: learners imports moves"]
    ast.parse(source)  # the example is valid Python
