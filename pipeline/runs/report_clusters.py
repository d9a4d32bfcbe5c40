"""The report's clusters section: per cluster its size and its most typical rows (used by
:mod:`pipeline.runs.report`).

The clusters found (:data:`pipeline.runs.directory.CLUSTERS_FOUND`: at least one expected row, result.json's
``counts``) are listed largest first (ties by index), at most :data:`MAX_CLUSTERS` of them, each with
its expected rows, the rows whose MAP cluster it is (which can be none) and its
:data:`EXEMPLARS` most typical rows (:mod:`pipeline.runs.typical`): their ids (the store's ``ids``, or
the row index when it has none) and, for a store ingested from images, a thumbnail of each image
read again from the source the store records. An image that cannot be read, whose size or
modification time differs from the store's image manifest, whose decoded pixels differ from the
digest the store recorded (replaced by another of the same size and time), or which is a link
out of the source folder, is shown by its id only, and the section says how many and why; so does a
source that is gone.
Thumbnails are PNGs of at most :data:`THUMB` pixels a side, embedded as base64 like the plots.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.runs.typical import TypicalRows

EXEMPLARS = 6  # most typical rows shown per cluster
MAX_CLUSTERS = 60  # clusters shown, largest first
THUMB = 64  # a thumbnail's longest side, pixels

FIGURE_PX, GAP_PX = 72, 4  # a thumbnail's box and the gap between boxes
#: a cluster's cell holds its EXEMPLARS thumbnails on one line (300 px wrapped six as 5 + 1)
CELL_PX = EXEMPLARS * FIGURE_PX + (EXEMPLARS - 1) * GAP_PX

CSS = (".clusters{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,"
       f"{CELL_PX}px),1fr));"
       "gap:.5em 1em}.cl{border-top:1px solid #ddd;padding:.3em 0}.cl h3{font-size:1em;margin:.2em 0}"
       f".ex{{display:flex;flex-wrap:wrap;gap:{GAP_PX}px}}.ex figure{{margin:0;width:{FIGURE_PX}px}}"
       ".ex img{width:64px;height:64px;object-fit:contain;image-rendering:pixelated;background:#eee}"
       ".ex figcaption,.ids{font-size:75%;overflow-wrap:anywhere;color:#333}")


def row_ids(store: Any, rows: np.ndarray) -> dict[int, str]:
    """{row: id as text} for ``rows`` (the store's ``ids``, read only from the chunks holding them;
    ``row N`` when the store has none)."""
    wanted = np.unique(rows[rows >= 0])
    if not store.has_ids:
        return {int(r): f"row {int(r)}" for r in wanted}
    out: dict[int, str] = {}
    c = store.chunk_rows
    for chunk in np.unique(wanted // c):
        part = slice(int(chunk) * c, min((int(chunk) + 1) * c, store.n_rows))
        ids = store.read_ids(part)
        for r in wanted[(wanted >= part.start) & (wanted < part.stop)]:
            out[int(r)] = str(ids[int(r) - part.start])
    return out


def image_locations(store: Any, ids: list[str]) -> tuple[dict[str, str], str]:
    """Where the images with these ids are now ({id: location}) and a note on the ones left out, for
    a store ingested from images; ({}, '') for any other store."""
    from pipeline.extract.image_sources import list_images
    from pipeline.extract.image_store import read_manifest
    from vbcore.errors import VBClusterError

    if not store.attrs.get("images") or not store.attrs.get("source"):
        return {}, ""
    source = str(store.attrs["source"])
    tries = [Path(source)] if Path(source).is_absolute() else [Path(source),
                                                                 Path(store.path).resolve().parent / source]
    listing, why, root = None, "not found", Path(source)
    for place in dict.fromkeys(tries):
        try:
            listing, root = list_images(str(place)), place.resolve()
            break
        except (VBClusterError, OSError) as exc:
            why = str(exc)
    if listing is None:
        return {}, (f"the images of {source} cannot be located ({why}): the rows are shown by their ids, "
                    "without thumbnails")
    known = read_manifest(store)
    index = {name: i for i, name in enumerate(listing.ids)}
    found, changed, outside = {}, 0, 0
    for name in ids:
        i = index.get(name)
        if i is None:
            continue
        if name in known and known[name] != (listing.sizes[i], listing.mtimes[i]):
            changed += 1  # not the image that was ingested
            continue
        if listing.kind == "folder" and root not in Path(listing.locs[i]).resolve().parents:
            outside += 1  # a link out of the folder (its target was never ingested from it)
            continue
        found[name] = listing.locs[i]
    missing = len(set(ids)) - len(found) - changed - outside
    parts = [f"{n} {what}" for n, what in ((missing, "no longer in the source"),
                                           (changed, "changed since they were ingested"),
                                           (outside, "links out of the source folder")) if n]
    note = f"thumbnails from {source}" + (f"; without one: {', '.join(parts)}" if parts else "")
    return found, note


def thumbnails(locations: dict[str, str],
               digests: dict[str, str] | None = None) -> tuple[dict[str, str], int, int]:
    """{id: base64 PNG of at most THUMB pixels a side} for the images at ``locations``, how many could
    not be read and how many differ from their ``digests`` (the store's pixel digests: an image
    replaced by another of the same size and time)."""
    from PIL import Image

    from pipeline.extract.image_sources import pixel_digest, read_images

    names, locs = list(locations), list(locations.values())
    out, failed, changed = {}, 0, 0
    for i, img in read_images(locs):
        if isinstance(img, Exception):
            failed += 1
            continue
        want = (digests or {}).get(names[i])
        if want is not None and pixel_digest(img) != want:
            changed += 1
            continue
        im = Image.fromarray(np.asarray(img, dtype=np.uint8))
        im.thumbnail((THUMB, THUMB))
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        out[names[i]] = base64.b64encode(buf.getvalue()).decode("ascii")
    return out, failed, changed


def _exemplar(name: str, thumb: str | None) -> str:
    label = html.escape(name)
    if thumb is None:
        return f"<figure><figcaption>{label}</figcaption></figure>"
    return (f"<figure><img alt=\"{label}\" title=\"{label}\" src=\"data:image/png;base64,{thumb}\">"
            f"<figcaption>{label}</figcaption></figure>")


def clusters_html(store: Any, typical: TypicalRows, counts: list[float] | None) -> str:
    """The clusters section (see the module docstring) as HTML, every id escaped."""
    from pipeline.extract.image_store import read_digests

    if counts is None or len(counts) != len(typical.sizes):  # result.json without them (or edited)
        counts = [float(v) for v in typical.sizes]
    expected = np.asarray(counts, dtype=np.float64)
    order = np.lexsort((np.arange(len(expected)), -expected))  # largest first, ties by index
    # the clusters found (pipeline.runs.directory.CLUSTERS_FOUND)
    found = [int(k) for k in order if expected[k] >= 1.0]
    shown = found[:MAX_CLUSTERS]
    rows = typical.rows[shown, :EXEMPLARS]
    ids = row_ids(store, rows.ravel())
    locations, note = image_locations(store, sorted(set(ids.values())))
    thumbs, failed, changed = thumbnails(locations, read_digests(store)) if locations else ({}, 0, 0)
    if changed:
        note += f"; {changed} whose pixels changed since they were ingested (same size and time)"
    if failed:
        note += f"; {failed} could not be read"
    more = "" if len(found) <= len(shown) else f", the {len(shown)} largest shown"
    parts = [f"<h3>{len(found)} clusters found{more}: size and most typical rows</h3>",
             "<p>Expected: the sum of the rows' responsibilities (a cluster is found when it is at least "
             "one); rows: the rows whose most probable cluster it is (argmax of q(z)), which can be none. "
             "Most typical rows: those of highest ln rho_nk, the row's "
             "expected log density under the cluster (most typical first; equal scores: lower row "
             "first). Each is shown by its id" + (", with its image" if thumbs else "") + ".</p>"]
    if note:
        parts.append(f"<p><em>{html.escape(note)}</em></p>")
    parts.append("<div class='clusters'>")
    for j, k in enumerate(shown):
        names = [ids[int(r)] for r in rows[j] if r >= 0]
        body = ("<div class='ex'>" + "".join(_exemplar(n, thumbs.get(n)) for n in names) + "</div>"
                if thumbs else f"<p class='ids'>{', '.join(html.escape(n) for n in names)}</p>")
        parts.append(f"<div class='cl'><h3>cluster {k}: {int(typical.sizes[k]):,} rows, {expected[k]:.1f} "
                     "expected</h3>"
                     f"{body}</div>")
    parts.append("</div>")
    return "\n".join(parts)
