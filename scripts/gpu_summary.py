"""The figures and targets of ``scripts/gpu_check.py`` (issue 27), from what its steps left behind.

Kept apart from the runner so that a CPU test (tests/test_gpu_check.py) can check them on real fits:
``fit_figures`` reads a run directory of ``vbcluster fit`` (result.json, iterations.jsonl),
``compare_fits`` puts two of them side by side on the same rows (the GPU fit against the CPU fit),
``targets`` turns the step results into the issue's targets, each with its figure, its threshold
and whether it was met (None: not measured).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

#: issue 27's thresholds
PASS_SECONDS = 0.15  # one exact VB EM pass at the SUN397 shape
GEMM_SHARE = 0.5  # of the device's float32 GEMM rate, measured in the same run
ELBO_REL = 1e-5  # GPU fit vs CPU fit, ELBO per row
SAME_LABELS = 0.999  # share of rows with the same MAP cluster for "the same clusters"


def fit_figures(run_dir: str | Path) -> dict[str, Any]:
    """Iterations, ELBO (total and per row), effective K, NMI and the seconds per iteration of a run
    directory. ``s_per_iter`` is the median over the iterations after the first (the first pays
    for CUDA kernel compilation and cuBLAS start-up); the first is reported apart."""
    run = Path(run_dir)
    result = json.loads((run / "result.json").read_text())
    iters = [json.loads(line) for line in (run / "iterations.jsonl").read_text().splitlines() if line.strip()]
    secs = [float(r["seconds"]) for r in iters if int(r.get("iteration", 0)) >= 1]
    rows = int(result.get("n_rows") or result.get("rows") or 0) or None
    elbo = float(result["elbo"])
    return {
        "n_iter": int(result["n_iter"]),
        "elbo": elbo,
        "elbo_per_row": elbo / rows if rows else None,
        "n_effective": int(result["n_effective"]),
        "nmi": (result.get("metrics") or {}).get("nmi"),
        "seconds": float(result["seconds"]),
        "first_iter_s": secs[0] if secs else None,
        "s_per_iter": statistics.median(secs[1:]) if len(secs) > 1 else (secs[0] if secs else None),
    }


def compare_fits(run_a: str | Path, run_b: str | Path, X: np.ndarray) -> dict[str, Any]:
    """Fit ``a`` (the GPU's) against fit ``b`` (the CPU's): the share of the rows ``X`` given the same
    MAP cluster by both posteriors (labels are cluster indices: both fits start from the same
    initialisation, so the same clusters carry the same index), the adjusted Rand index of the two
    labellings, and the relative difference of their ELBOs (per row: the same rows, so the same)."""
    from sklearn.metrics import adjusted_rand_score

    from pipeline.estimator import load_model

    la, lb = load_model(run_a).predict(X), load_model(run_b).predict(X)
    fa, fb = fit_figures(run_a), fit_figures(run_b)
    return {
        "rows_compared": int(X.shape[0]),
        "same_label_share": float(np.mean(la == lb)),
        "ari": float(adjusted_rand_score(lb, la)),
        "elbo_rel_diff": abs(fa["elbo"] - fb["elbo"]) / abs(fb["elbo"]),
        "n_effective": [fa["n_effective"], fb["n_effective"]],
        "same_iterations": fa["n_iter"] == fb["n_iter"],
    }


def _target(name: str, figure: Any, threshold: str, met: bool | None, note: str = "") -> dict[str, Any]:
    return {"target": name, "figure": figure, "threshold": threshold, "met": met, "note": note}


def _get(results: dict[str, Any], step: str, key: str) -> Any:
    step_result = results.get(step) or {}
    return (step_result.get("figures") or {}).get(key) if step_result.get("status") == "ok" else None


def targets(results: dict[str, Any], dry_run: bool) -> list[dict[str, Any]]:
    """Issue 27's targets from the steps' results (``{step: {"status", "figures", ...}}``)."""
    note = "dry run on the CPU: not a device figure" if dry_run else ""
    out = []
    passed, failed = _get(results, "gpu_tests", "passed"), _get(results, "gpu_tests", "failed")
    skipped = _get(results, "gpu_tests", "skipped")
    out.append(_target("gpu-marked tests pass", f"{passed} passed, {failed} failed, {skipped} skipped",
                       "all pass, none skipped", None if passed is None else
                       (failed == 0 and passed > 0 and not skipped), note))
    bench = (results.get("bench_sun397") or {}).get("figures") or {}
    t = bench.get("device_pass_s")
    out.append(_target("one exact VB EM pass, SUN397 shape (108,754 x 4096, K = 1000)",
                       None if t is None else round(t, 4), f"<= {PASS_SECONDS} s",
                       None if t is None else t <= PASS_SECONDS, note))
    share = bench.get("gemm_share")
    out.append(_target("share of the device's float32 GEMM rate (same run)",
                       None if share is None else round(share, 3), f">= {GEMM_SHARE:.0%}",
                       None if share is None else share >= GEMM_SHARE,
                       note or (f"{bench.get('gemm_flops', 0) / 1e12:.1f} TFLOP/s sgemm" if bench else "")))
    cmp = _get(results, "compare_gpu_cpu", "comparison")
    out.append(_target("GPU fit = CPU fit (same clusters, ELBO/row within 1e-5 relative)", cmp,
                       f"same labels >= {SAME_LABELS:.1%} of rows, ELBO rel. diff <= {ELBO_REL:g}",
                       None if cmp is None else (cmp["same_label_share"] >= SAME_LABELS
                                                 and cmp["elbo_rel_diff"] <= ELBO_REL), note))
    ex, tr = _get(results, "fit_cupy_exact", "s_per_iter"), _get(results, "fit_cupy_truncated", "s_per_iter")
    out.append(_target("truncated vs exact E-step, seconds per VB EM iteration (in-process)",
                       None if ex is None or tr is None else
                       {"exact_s": round(ex, 4), "truncated_s": round(tr, 4),
                        "truncated/exact": round(tr / ex, 2)},
                       "measured (no threshold)", None if ex is None or tr is None else True, note))
    gpu_ips, cpu_ips = _get(results, "onnx", "cuda_images_per_s"), _get(results, "onnx", "cpu_images_per_s")
    out.append(_target("ONNX extraction on the CUDA provider vs the CPU, images/s",
                       None if gpu_ips is None else {"cuda": round(gpu_ips, 1), "cpu": round(cpu_ips, 1),
                                                     "cuda/cpu": round(gpu_ips / cpu_ips, 1)},
                       "measured (no threshold)", None if gpu_ips is None else True,
                       note or (_get(results, "onnx", "providers_note") or "")))
    return out


def render(summary: dict[str, Any]) -> str:
    """The summary as text: the device, each step's status and time, then the targets."""
    lines = [f"vbcluster GPU check on {summary['device']}"
             + (" -- DRY RUN (no device)" if summary["dry_run"] else ""),
             f"finished in {summary['seconds']:.0f} s (budget {summary['budget_s']:.0f} s)", "", "steps:"]
    for name, r in summary["steps"].items():
        extra = r.get("error") or r.get("reason") or ""
        lines.append(f"  {name:22s} {r['status']:8s} {r.get('seconds', 0):7.1f} s  {extra}".rstrip())
    lines += ["", "targets:"]
    for t in summary["targets"]:
        mark = {True: "MET", False: "MISSED", None: "n/a"}[t["met"]]
        lines.append(f"  [{mark:6s}] {t['target']}: {json.dumps(t['figure'])} (target {t['threshold']})"
                     + (f" -- {t['note']}" if t["note"] else ""))
    return "\n".join(lines) + "\n"
