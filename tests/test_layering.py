"""Layering check: each layer imports only the layers below it (DESIGN.md section 2).

vbcore (math) imports numpy/scipy only, never dask, distributed, zarr, prefect or the layers above
it; pipeline (data plane) never imports prefect or flows.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN: dict[str, frozenset[str]] = {
    "vbcore": frozenset(
        {"dask", "distributed", "zarr", "prefect", "prefect_dask", "pipeline", "flows"}
    ),
    "pipeline": frozenset({"prefect", "prefect_dask", "flows"}),
}


def _imported_modules(tree: ast.AST, package: str) -> Iterable[tuple[int, str]]:
    """Yield (line, absolute module name) for every import in `tree`.

    Relative imports are resolved against `package` (the dotted package holding the file), so
    `from ..pipeline import x` inside `vbcore.sub` is seen as `vbcore.pipeline` and
    `from .. import pipeline` at the top of `vbcore` as `pipeline`.
    """
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                parts = package.split(".") if package else []
                keep = len(parts) - (node.level - 1)
                base = ".".join(parts[: max(keep, 0)] + ([node.module] if node.module else []))
            if node.module is None or node.level > 0:
                # `from . import a, b` / `from .. import a`: each name may be a module.
                for alias in node.names:
                    yield node.lineno, f"{base}.{alias.name}" if base else alias.name
            if base:
                yield node.lineno, base


def find_forbidden_imports(
    source: str, filename: str, forbidden: Iterable[str], package: str = ""
) -> list[str]:
    """Return "filename:line: imports NAME" for each import of a forbidden top-level package."""
    banned = frozenset(forbidden)
    tree = ast.parse(source, filename=filename)
    hits: set[tuple[int, str]] = set()
    for line, module in _imported_modules(tree, package):
        top = module.split(".", 1)[0]
        if top in banned:
            hits.add((line, module))
    return [f"{filename}:{line}: imports {module}" for line, module in sorted(hits)]


def _package_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    else:
        parts = parts[:-1]
    return ".".join(parts)


def _violations(layer: str) -> list[str]:
    folder = ROOT / layer
    found: list[str] = []
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        source = path.read_text(encoding="utf-8")
        found += find_forbidden_imports(
            source,
            str(path.relative_to(ROOT)),
            FORBIDDEN[layer] - {layer},
            package=_package_of(path),
        )
    return found


def test_vbcore_imports_only_numpy_scipy_level() -> None:
    bad = _violations("vbcore")
    assert not bad, "vbcore must not import dask/distributed/zarr/prefect/pipeline/flows:\n" + (
        "\n".join(bad)
    )


def test_pipeline_does_not_import_prefect_or_flows() -> None:
    bad = _violations("pipeline")
    assert not bad, "pipeline must not import prefect/prefect_dask/flows:\n" + "\n".join(bad)


def test_checker_flags_violations() -> None:
    source = (
        "import numpy as np\n"
        "import dask\n"
        "import dask.array as da\n"
        "from distributed import Client\n"
        "def f():\n"
        "    from prefect import flow\n"
        "from .. import pipeline\n"
        "from scipy import special\n"
    )
    hits = find_forbidden_imports(source, "vbcore/bad.py", FORBIDDEN["vbcore"], package="vbcore")
    assert hits == [
        "vbcore/bad.py:2: imports dask",
        "vbcore/bad.py:3: imports dask.array",
        "vbcore/bad.py:4: imports distributed",
        "vbcore/bad.py:6: imports prefect",
        "vbcore/bad.py:7: imports pipeline",
    ]


def test_checker_allows_clean_source() -> None:
    source = "import numpy as np\nfrom scipy.special import digamma\nfrom . import stats\n"
    assert find_forbidden_imports(source, "vbcore/ok.py", FORBIDDEN["vbcore"], "vbcore") == []
