"""``ingest_flow``: sources -> one feature store (the first source creates it, the others append).

Each source is one task with Prefect retries (it is I/O). A retry is safe: a new store is built under
a temporary name and moved into place only when complete, and an append is one atomic transaction
(rolled back by its journal when it fails); a retried append first checks whether the failed attempt
had in fact committed (the store's append records grew) and then does not append twice. Chunks are
compressed in parallel (``batch_chunks`` store chunks per write; Zarr compresses them in threads).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE


def _appends(out: str) -> int:
    from pipeline.store.features import FeatureStore

    if not Path(out).exists():
        return 0
    return len(FeatureStore.open(out).attrs.get("appends", []))


@task(name="ingest-source", retries=2, retry_delay_seconds=1, cache_policy=NONE)
def ingest_source(source: str, out: str, appends_before: int, append: bool, overwrite: bool,
                  settings: dict[str, Any], quiet: bool = False) -> dict[str, Any]:
    """Stream one source into the store (create/overwrite or append)."""
    from rich.progress import Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn

    from pipeline.ingest import ingest
    from pipeline.store.features import FeatureStore

    logger = get_run_logger()
    if append and _appends(out) > appends_before:  # an earlier attempt committed, then failed after
        rec = FeatureStore.open(out).attrs["appends"][-1]
        if rec.get("source") == str(source):
            logger.info("%s was already appended to %s by an earlier attempt", source, out)
            return {"source": source, "rows_written": int(rec["rows"]), "already_done": True}
    with Progress(SpinnerColumn(), TextColumn("ingest {task.description}", style="bold", markup=False),
                  TextColumn("{task.completed:,} rows"), TaskProgressColumn(show_speed=True),
                  TimeElapsedColumn(), disable=quiet) as bar:
        t = bar.add_task(str(source), total=None)
        report = ingest(source, out, append=append, overwrite=overwrite,
                        progress=lambda n: bar.advance(t, n), **settings)
    logger.info("%s: wrote %d rows (%d dropped) from %s in %.1fs; the store has %d rows", out,
                report.rows_written, report.rows_dropped, source, report.elapsed_s, report.n_rows)
    return {"source": source, "rows_written": report.rows_written, "rows_dropped": report.rows_dropped,
            "n_rows": report.n_rows, "seconds": report.elapsed_s}


@flow(name="vbcluster-ingest")
def ingest_flow(sources: list[str] | str, out: str, chunk_rows: int = 8192, labels: str | None = None,
                ids: str | None = None, append: bool = False, overwrite: bool = False,
                drop_nonfinite: bool = False, batch_chunks: int = 2,
                options: dict[str, Any] | None = None, quiet: bool = False) -> dict[str, Any]:
    """Ingest one or more sources into the store ``out``.

    Parameters
    ----------
    sources : str or list of str
        Sources as ``vbcluster ingest`` takes them; the first creates the store (unless ``append``),
        the rest are appended in order.
    out : str
        The store.
    chunk_rows, labels, ids, drop_nonfinite, options
        As ``vbcluster ingest`` (``options``: source options such as rows/dim/classes/seed).
    batch_chunks : int
        Store chunks compressed in parallel per write.

    Returns
    -------
    dict
        ``store``, ``n_rows`` and one record per source.
    """
    from pipeline.store.features import FeatureStore

    items = [sources] if isinstance(sources, str) else list(sources)
    settings = dict(chunk_rows=chunk_rows, labels=labels, ids=ids, drop_nonfinite=drop_nonfinite,
                    batch_chunks=batch_chunks, **(options or {}))
    done = []
    for i, src in enumerate(items):
        add = append or i > 0
        done.append(ingest_source(src, out, _appends(out), add, overwrite and not add, settings, quiet))
    return {"store": out, "n_rows": FeatureStore.open(out).n_rows, "sources": done}
