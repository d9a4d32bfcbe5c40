"""The ``vbcluster`` command: every command of :mod:`pipeline.cli`, plus the ones that need Prefect
(``deploy``). The orchestration layer adds them here because ``pipeline`` never imports Prefect."""

from __future__ import annotations

from pipeline.cli import app

__all__ = ["app"]

if __name__ == "__main__":  # pragma: no cover
    app()
