"""Files that are never seen half-written: atomic writes (:mod:`.atomic`, the one write-then-rename
helper), run locks (:mod:`.locks`) and the temporaries of a store being built (:mod:`.leftovers`)."""

from __future__ import annotations

from vbcore.lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "write_file": "atomic", "write_bytes": "atomic", "replace_dir": "atomic", "replace_symlink": "atomic",
    "temp_dir": "atomic", "RunLock": "locks",
})
