"""Render a ``vbcluster report`` comparing several learners and models, and screenshot it in headless
Chromium at 600 px and at a phone's width (390 px), to look at the layout with one's own eyes.

Needs ``chromium`` on the PATH (``apt-get install -y chromium``); not a test. Usage::

    python scripts/report_screenshot.py --out /tmp/report-shots

writes OUT/report/report.html, OUT/report-600.png and OUT/report-390.png. The runs (scikit-learn's
digits, 1,797 x 64, through the real ``vbcluster`` command): ``vbem`` diag K = 80 and ``vbem``
spherical K = 30 (two models: two ELBO panels), ``sga-f`` (fixed variance, minibatch estimate: a third
panel) and ``mm`` (fixed variance, exact bound: a fourth).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = {
    "vbem-diag-k80": ["-k", "80", "--covariance", "diag"],
    "vbem-spherical": ["-k", "30", "--covariance", "spherical"],
    "sga-f": ["-k", "40", "--learner", "sga-f", "-o", "minibatch=300", "--max-iter", "30"],
    "mm": ["-k", "40", "--learner", "mm", "--max-iter", "30"],
}


def _vbcluster(*args: str) -> None:
    exe = Path(sys.executable).with_name("vbcluster")
    subprocess.run([str(exe), *args], check=True, cwd=ROOT)


def _screenshot(chromium: str, page: Path, png: Path, width: int, height: int) -> None:
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--no-first-run", f"--user-data-dir={profile}", f"--window-size={width},{height}",
                        f"--screenshot={png}", page.resolve().as_uri()],
                       check=True, capture_output=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--height", type=int, default=4000, help="window height in px (the shot's height)")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("error: chromium not found (apt-get install -y chromium)", file=sys.stderr)
        return 2
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    store = out / "digits.zarr"
    if not store.exists():
        _vbcluster("ingest", "digits", "--out", str(store), "--chunk-rows", "500", "-q")
    for name, extra in RUNS.items():
        if not (out / name / "result.json").is_file():
            _vbcluster("fit", str(store), "--run-dir", str(out / name), "-q", *extra)
    _vbcluster("report", *(str(out / n) for n in RUNS), "--out", str(out / "report"))
    page = out / "report" / "report.html"
    for width in (600, 390):
        _screenshot(chromium, page, out / f"report-{width}.png", width, args.height)
        print(f"wrote {out / f'report-{width}.png'}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.exit(main())
