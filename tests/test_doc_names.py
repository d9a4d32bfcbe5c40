"""Every dotted name of the project's packages that its text mentions is a module or an attribute.

The README, ``docs/**/*.md`` and the source of ``vbcore``, ``pipeline``, ``flows``, ``bench`` and
``scripts`` (docstrings and comments included) name modules and functions such as
``pipeline.service.fit`` or ``vbcore.kernels.sga_stats.HardStats.combine``. When a module moves, a
stale name still reads well and points nowhere; this test resolves each one by importing. A segment
in capitals (``pipeline.studies.NAME.run``) is a placeholder and is not resolved.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOTTED = re.compile(r"\b(?:pipeline|vbcore|flows)(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _texts() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("vbcore", "pipeline", "flows", "bench", "scripts"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return files


def resolves(name: str) -> bool:
    """Whether ``name`` is an importable module, or an attribute path under the longest one."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_the_resolver_tells_a_moved_name_from_a_real_one():
    assert resolves("pipeline.service.fit")
    assert resolves("vbcore.kernels.sga_stats.HardStats.combine")
    assert not resolves("vbcore.learners.sga.HardStats.combine")  # where it was before the layout
    assert not resolves("pipeline.fitting")


def test_every_dotted_name_in_the_text_resolves():
    stale = {}
    for path in _texts():
        for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in DOTTED.finditer(line):
                name = match.group(0)
                if any(PLACEHOLDER.match(part) for part in name.split(".")[1:]):
                    continue
                if name not in stale and not resolves(name):
                    stale[name] = f"{path.relative_to(ROOT)}:{line_no}"
    assert not stale, "names that resolve to nothing: " + ", ".join(f"{n} ({w})" for n, w in stale.items())
