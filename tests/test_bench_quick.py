"""`make bench-quick` (bench/bench_vbem.py) on a tiny setting: it times the four things in interleaved
rounds, prints the median of the same-round ratios with their range and the load average beside them,
and its output names no internal issue number."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_quick_prints_same_round_ratios_and_the_load():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    tiny = ["--rows", "3000", "--dim", "16", "--components", "4", "--rounds", "3"]
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_vbem.py"), *tiny], capture_output=True,
                         text=True, timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    line = next(x for x in text.splitlines() if "scikit-learn / vbcluster time per iteration" in x)
    found = re.search(r"([\d.]+)x faster \(median of 3 interleaved rounds' ratios, range ([\d.]+)-([\d.]+)x",
                      line)
    assert found is not None, line  # the median of the same-round ratios, with their range
    loads = re.findall(r"load average at the (start|end) \(1, 5, 15 min\): [\d.]+ [\d.]+ [\d.]+", text)
    assert loads == ["start", "end"]
    assert not re.search(r"(?i)\bissue\s*\d", text)
    assert not re.search(r"(?i)\bissue\s*\d", (ROOT / "bench" / "bench_vbem.py").read_text())
