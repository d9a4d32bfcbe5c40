"""Layering check: each layer imports only the layers below it (DESIGN.md section 2).

vbcore (math) imports numpy/scipy only, never dask, distributed, zarr, prefect or the layers above
it; pipeline (data plane) never imports prefect or flows.
"""

from __future__ import annotations

import ast
import re
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


# ---- size limits (STYLE: files under 500 lines, functions under 80) ------------------------------
MAX_FILE_LINES = 500  # a file must have fewer lines
MAX_FUNCTION_LINES = 80  # a function (def line to last line, docstring included) may have this many
SIZED = ("vbcore", "pipeline", "flows")


def oversized(source: str, filename: str) -> list[str]:
    """"filename: N lines" when the file has >= MAX_FILE_LINES lines, and
    "filename:line: NAME has N lines" for every function or method longer than MAX_FUNCTION_LINES."""
    found = []
    n = len(source.splitlines())
    if n >= MAX_FILE_LINES:
        found.append(f"{filename}: {n} lines")
    return found + long_functions(source, filename, MAX_FUNCTION_LINES)


def long_functions(source: str, filename: str, limit: int) -> list[str]:
    """"filename:line: NAME has N lines" for every function or method longer than ``limit`` lines."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > limit:
                found.append(f"{filename}:{node.lineno}: {node.name} has {length} lines")
    return found


def private_imports(source: str, filename: str, package: str = "") -> list[str]:
    """"filename:line: imports MODULE._NAME" for every ``from MODULE import _NAME`` of a project
    module (vbcore, pipeline, flows): one module using another's private name."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in SIZED:
                continue
            found += [f"{filename}:{node.lineno}: imports {node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def _scan(check) -> list[str]:  # type: ignore[no-untyped-def]
    found: list[str] = []
    for layer in SIZED:
        for path in sorted((ROOT / layer).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found += check(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    return found


def test_size_checker_flags_long_files_and_functions() -> None:
    def function(name: str, indent: str, n_lines: int) -> str:
        lines = [f"{indent}    x{i} = {i}\n" for i in range(n_lines - 1)]
        return "".join([f"{indent}def {name}():\n", *lines])

    source = (function("ok", "", MAX_FUNCTION_LINES) + "\n\nclass C:\n"
              + function("long", "    ", MAX_FUNCTION_LINES + 1))
    start = MAX_FUNCTION_LINES + 4  # after ok, two blank lines and the class line
    assert oversized(source, "m.py") == [f"m.py:{start}: long has {MAX_FUNCTION_LINES + 1} lines"]
    assert oversized("x = 1\n" * MAX_FILE_LINES, "big.py") == [f"big.py: {MAX_FILE_LINES} lines"]
    assert oversized("x = 1\n" * (MAX_FILE_LINES - 1), "small.py") == []


def test_private_import_checker() -> None:
    source = "from pipeline.cli import _fail, app\nfrom numpy import _core\nfrom vbcore import __version__\n"
    assert private_imports(source, "m.py") == ["m.py:1: imports pipeline.cli._fail"]


def test_no_file_over_500_lines_and_no_function_over_80() -> None:
    bad = _scan(oversized)
    assert not bad, "too long (files < 500 lines, functions <= 80):\n" + "\n".join(bad)


# ---- the learners (issue 54): shorter functions, no silenced type errors ------------------------------
LEARNERS_DIR = "pipeline/fit/learners"
MAX_LEARNER_FUNCTION_LINES = 60  # a function in pipeline/fit/learners/ may have this many


def learner_style(source: str, filename: str) -> list[str]:
    """"filename:line: NAME has N lines" for every function longer than MAX_LEARNER_FUNCTION_LINES and
    "filename:line: type: ignore" for every line that silences the type checker."""
    found = [f"{filename}:{i}: type: ignore" for i, line in enumerate(source.splitlines(), 1)
             if re.search(r"#\s*type:\s*ignore", line)]
    return found + long_functions(source, filename, MAX_LEARNER_FUNCTION_LINES)


def test_learner_style_checker_flags_long_functions_and_type_ignores() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LEARNER_FUNCTION_LINES - 1))
    ok = f"def ok():\n{body}"
    assert learner_style(ok, "m.py") == []
    too_long = f"m.py:1: ok has {MAX_LEARNER_FUNCTION_LINES + 1} lines"
    assert learner_style(ok + "    y = 0\n", "m.py") == [too_long]
    assert learner_style("x = f()  # type: ignore[attr-defined]\ny = 1\n", "m.py") == ["m.py:1: type: ignore"]
    assert learner_style("x = f()  #type:ignore\n", "m.py") == ["m.py:1: type: ignore"]


def test_no_type_ignore_and_no_function_over_60_lines_in_the_learners() -> None:
    paths = sorted((ROOT / LEARNERS_DIR).rglob("*.py"))
    assert len(paths) > 10, "the learners package moved: update LEARNERS_DIR"
    bad = [hit for path in paths if "__pycache__" not in path.parts
           for hit in learner_style(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert not bad, "in the learners (functions <= 60 lines, no type: ignore):\n" + "\n".join(bad)


def test_no_module_imports_another_modules_private_names() -> None:
    bad = _scan(private_imports)
    assert not bad, "private names used across modules:\n" + "\n".join(bad)
