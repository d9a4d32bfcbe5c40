"""The report's layout without a browser (none is installed here; scripts/report_screenshot.py renders
one in Chromium by hand): every plot's text is at least 9 pt when drawn, an image is never shown so
narrow that this text is under 9 px on a 390 px phone, the sizes plot's legend lies outside the
axes, and the run table's narrowest layout fits the 1200 px page at a 1280 px window, measured with
DejaVu Sans glyph widths (Chromium's sans-serif on Debian)."""

from __future__ import annotations

import base64
import io
import re

import matplotlib.figure
import pytest
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import TextPath
from PIL import Image

from pipeline import VBMixture
from pipeline.ingest import ingest
from pipeline.runs.directory import save_run
from pipeline.runs.report import CSS, write_report

PHONE_CONTENT_PX = 390 - 2 * 7.5  # a 390 px window less the page's .5em padding at 15 px
PAGE_PX = 1200  # body max-width: the page's width in a 1280 px window
TABLE_FONT_PX = 16 * 0.85  # the table at 85% of the browser's 16 px
CELL_EXTRA_PX = 2 * 5 + 1  # padding 5 px a side and one border


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A report of two runs with long names and a long model label, every figure drawn recorded."""
    tmp = tmp_path_factory.mktemp("layout")
    store = str(tmp / "digits.zarr")
    ingest("digits", store, chunk_rows=500)
    runs = []
    for name, kw in (("a-rather-long-run-directory-name-k40-diag", {}),
                     ("spherical-with-a-mean-precision-prior", dict(covariance_type="spherical",
                                                                    mean_precision_prior=0.5))):
        model = VBMixture(**dict(dict(n_components=40, covariance_type="diag", max_iter=15, random_state=0),
                                 **kw)).fit(store)
        save_run(tmp / name, model, store, extra={"warm_start_from": str(tmp / "x" / ("v" * 40))})
        runs.append(tmp / name)
    drawn: list[dict] = []
    save = matplotlib.figure.Figure.savefig

    def recording(fig, path, *args, **kwargs):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()]
        legends = [(ax.get_window_extent(renderer), ax.get_legend().get_window_extent(renderer))
                   for ax in fig.axes if ax.get_legend() is not None]
        drawn.append({"name": str(path).rsplit("/", 1)[-1], "min_pt": min(t.get_fontsize() for t in texts),
                      "legends": legends, "texts": [t.get_text() for t in texts]})
        return save(fig, path, *args, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(matplotlib.figure.Figure, "savefig", recording)
    try:
        page = write_report(runs, tmp / "report").read_text()
    finally:
        mp.undo()
    return page, drawn


def test_every_plot_reads_at_a_phone_width(report):
    page, drawn = report
    assert {d["name"] for d in drawn} >= {"run0-sizes.png", "run0-contingency.png", "run0-pca.png"}
    for d in drawn:
        assert d["min_pt"] >= 9, d  # no text drawn under 9 pt
        assert not [t for t in d["texts"] if "\\mathdefault" in t], d  # no raw TeX (log axis labels)
    imgs = re.findall(r'<img alt="[^"]*" style="--minw:(\d+)px" src="data:image/png;base64,([^"]+)"', page)
    assert len(imgs) >= len(drawn) and "min-width:var(--minw" in CSS
    min_pt = min(d["min_pt"] for d in drawn)
    for minw, data in imgs:
        width = Image.open(io.BytesIO(base64.b64decode(data))).size[0]
        shown = max(min(width, PHONE_CONTENT_PX), int(minw))  # max-width 100%, min-width --minw
        assert min_pt * 110 / 72 * shown / width >= 9 - 1e-9, (width, minw)  # px on screen


def test_the_sizes_legend_does_not_cover_the_bars(report):
    _, drawn = report
    sizes = [d for d in drawn if d["name"].endswith("-sizes.png")]
    assert len(sizes) == 2
    for d in sizes:
        [(axes, legend)] = d["legends"]
        assert not axes.overlaps(legend), (axes, legend)


def _width(text: str, px: float) -> float:
    return TextPath((0, 0), text, size=px, prop=FontProperties(family="DejaVu Sans")).get_extents().width


def test_the_run_table_fits_the_page_at_1280_px(report):
    page, _ = report
    table = page.split("<table>")[1].split("</table>")[0]
    head = re.findall(r"<th[^>]*>(.*?)</th>", table)
    rows = [re.findall(r"<td( class=l)?>(.*?)</td>", tr) for tr in re.findall(r"<tr>(.*?)</tr>", table)[1:]]
    assert "th{background:#f3f3f3;white-space:normal}" in CSS  # headers wrap at their spaces
    assert "td.l{white-space:normal;overflow-wrap:anywhere;min-width:4em}" in CSS  # text cells wrap
    total = 0.0
    for j, name in enumerate(head):
        widest = max(_width(w, TABLE_FONT_PX) for w in name.split())  # bold is a little wider: 10%
        widest *= 1.1
        for cells in rows:
            wraps, text = cells[j]
            plain = text.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
            # a wrapping cell is at least 4em wide; a number never wraps
            widest = max(widest, 4 * TABLE_FONT_PX if wraps else _width(plain, TABLE_FONT_PX))
        total += widest + CELL_EXTRA_PX
    assert total <= PAGE_PX, total
