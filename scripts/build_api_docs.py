"""Build the API reference (HTML) from the docstrings with pdoc: ``make docs`` -> ``docs/api/``.

Every public module of ``vbcore``, ``pipeline`` and ``flows`` gets a page (a module is public when
no part of its dotted name starts with ``_``). The build fails, with one line per problem, when a
module cannot be imported, pdoc warns (an unresolvable annotation, a broken cross-reference, a
docstring it cannot parse), or an expected page is missing: ``tests/test_docs.py`` runs it so that
the reference cannot rot.

Usage: ``python scripts/build_api_docs.py [--out DIR]`` (default ``docs/api``).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("vbcore", "pipeline", "flows")
#: pages that must exist whatever else changes: the estimator, the flows, the run helpers
REQUIRED = ("pipeline/estimator.html", "pipeline/service.html", "pipeline/runs/directory.html",
            "flows/cluster.html", "flows/schedule.html", "flows/ingest.html", "flows/study.html",
            "vbcore/model/elbo.html", "vbcore/kernels/estep.html")


def public_modules(root: Path = ROOT) -> list[str]:
    """Dotted names of the public modules under PACKAGES, sorted."""
    names = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if any(p.startswith("_") for p in parts):
                continue
            names.append(".".join(parts))
    return sorted(names)


#: pdoc warnings that are not problems of the docs, each with its reason
TOLERATED = (
    # several module specs name the same module (a package without __all__ adds its submodules)
    "but a module with this name has already been added",
    # a method named `list` shadows the builtin inside its class, so pdoc cannot evaluate the
    # annotation `list[Path]` of that very method; the page shows the annotation as written
    "Error parsing type annotation list[Path] for pipeline.fit.checkpoint.Checkpointer.list",
)


def _counts(w: warnings.WarningMessage) -> bool:
    """Whether a warning caught during the build is a problem of the reference."""
    text = str(w.message)
    if any(t in text for t in TOLERATED):
        return False
    return "pdoc" in Path(w.filename).parts or any(p in text for p in PACKAGES)


def build(out: Path) -> list[str]:
    """Write the HTML reference into ``out``; return the problems found (empty: a clean build)."""
    import pdoc
    import pdoc.render

    os.environ.setdefault("MPLBACKEND", "Agg")
    pdoc.render.configure(docformat="numpy", footer_text="vbcluster API reference",
                          search=True, show_source=True)
    modules = public_modules()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*modules, output_directory=out)
    problems = [f"pdoc: {w.message}" for w in caught if _counts(w)]
    pages = [m.replace(".", "/") + ".html" for m in modules]
    problems += [f"missing page: {p}" for p in (*pages, *REQUIRED, "index.html") if not (out / p).is_file()]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "api", help="output folder")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    problems = build(args.out)
    for line in problems:
        print(line, file=sys.stderr)
    if not problems:
        print(f"wrote {args.out}/index.html ({len(public_modules())} modules)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
