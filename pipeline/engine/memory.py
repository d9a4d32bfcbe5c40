"""The in-process engine's memory budget: what ``persist='auto'`` compares a store's prepared size with."""

from __future__ import annotations

import os
from pathlib import Path


def memory_budget() -> float:
    """Bytes this process may use: the machine's physical memory, or the cgroup's limit when lower
    (``persist='auto'`` keeps prepared chunks in process when they take at most half of it)."""
    try:
        total = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        total = 4e9
    for f in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(f).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, float(text))
    return total


__all__ = ["memory_budget"]
