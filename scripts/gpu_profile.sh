#!/usr/bin/env bash
# Where the GPU's time goes, as one device call after scripts/gpu_check.sh (whose figures showed a
# kernel pass at 22% of the GEMM rate and fits whose iterations take far longer than their pass):
#   1. bench/bench_gpu_parts.py: each part of the diagonal pass, at three block sizes;
#   2. a SUN397-shaped synthetic store;
#   3. the check's in-process CuPy VB EM fit (K = 1000, 5 iterations, exact E-step) under cProfile,
#      twice: with CuPy's kernel cache cold (a fresh machine's first fit), then warm;
#   4. the same fit with NumPy on the host, compared with the GPU's (gpu_summary.compare_fits);
#   5. the same fit on cluster_config/gpu.yaml (dask-cuda).
# A step that hangs is stopped with SIGABRT, and Python's faulthandler prints every thread's stack.
# From the device tool: run(command="bash scripts/gpu_profile.sh", carry=[".whl"], timeout_s=420; the steps together stay under 425 s).
# Every file lands in $OUT (at most 8 files come back from a device call).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
W=${GPU_CHECK_WORK:-/tmp/vbc-gpu-profile}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$W"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
if [ -d .whl ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/site" \
        .whl/*.whl >"$W/install.log" 2>&1 || { echo "install failed"; tail -3 "$W/install.log"; }
fi
export PYTHONPATH="$PWD:$W/site${PYTHONPATH:+:$PYTHONPATH}" PATH="$W/site/bin:$PATH" PYTHONUNBUFFERED=1 \
       MPLBACKEND=Agg PREFECT_HOME="$W/prefect" PREFECT_SERVER_ANALYTICS_ENABLED=false
stamp "installed"
# a dry run on a CPU: STORE_ARGS="--rows 3000 --dim 32 --classes 5" K=20 BACKEND=numpy PARTS_ARGS="..."
K=${K:-1000}
BACKEND=${BACKEND:-cupy}
CLI=(-X faulthandler -c "from flows.cli import app; app()")
top() {  # the 40 costliest functions of a profile, by cumulative and by own time
    "$PY" -c "import pstats, sys
for key in ('cumulative', 'tottime'):
    pstats.Stats(sys.argv[1], stream=sys.stdout).strip_dirs().sort_stats(key).print_stats(40)" "$1"
}

stamp "1. pass parts"
timeout -s ABRT 90 "$PY" -X faulthandler bench/bench_gpu_parts.py ${PARTS_ARGS:-} --json "$OUT/parts.json" \
    >"$OUT/1-parts.txt" 2>&1
cat "$OUT/1-parts.txt"

stamp "2. store"
timeout -s ABRT 60 "$PY" "${CLI[@]}" ingest synthetic --out "$W/sun.zarr" ${STORE_ARGS:-} -q 2>&1 | tail -3

for run in cold warm; do
    stamp "3. in-process CuPy fit, kernel cache $run"
    limit=$([ "$run" = cold ] && echo 120 || echo 75)
    { s=$(date +%s%N)
      timeout -s ABRT "$limit" "$PY" -X faulthandler -m cProfile -o "$W/$run.prof" scripts/gpu_check.py fit \
          "$W/sun.zarr" "$W/runs/$run" --backend "$BACKEND" -k "$K" --max-iter 5 --seed 0 --tol 0 -o candidates=0
      echo "exit $? after $(( ($(date +%s%N) - s) / 1000000 )) ms (process start to exit)"; cat "$W/runs/$run/iterations.jsonl"
      [ -f "$W/$run.prof" ] && top "$W/$run.prof"; } >"$OUT/3-fit-$run.txt" 2>&1
    grep -E '^\{"n_iter|^exit' "$OUT/3-fit-$run.txt"
done

stamp "4. the same fit with NumPy on the host, and the GPU fit against it"
{ s=$(date +%s%N)
  timeout -s ABRT 60 "$PY" -X faulthandler scripts/gpu_check.py fit "$W/sun.zarr" "$W/runs/cpu" --backend numpy \
      -k "$K" --max-iter 5 --seed 0 --tol 0 -o candidates=0
  echo "exit $? after $(( ($(date +%s%N) - s) / 1000000 )) ms (process start to exit)"
  "$PY" -c "import json, sys
sys.path[:0] = ['scripts']
import gpu_summary
from pipeline.store.features import FeatureStore
X = FeatureStore.open(sys.argv[1]).read(slice(0, 20_000))
print(json.dumps({'gpu': gpu_summary.fit_figures(sys.argv[2]), 'cpu': gpu_summary.fit_figures(sys.argv[3]),
                  'comparison': gpu_summary.compare_fits(sys.argv[2], sys.argv[3], X)}, indent=1))" \
      "$W/sun.zarr" "$W/runs/warm" "$W/runs/cpu"; } >"$OUT/4-compare.txt" 2>&1
tail -25 "$OUT/4-compare.txt"

stamp "5. dask-cuda fit"
{ s=$(date +%s%N)
  timeout -s ABRT 80 "$PY" "${CLI[@]}" fit "$W/sun.zarr" --run-dir "$W/runs/dask" --cluster "${GPU_YAML:-cluster_config/gpu.yaml}" \
      -k "$K" --max-iter 5 --seed 0 --tol 0 -o candidates=0 --restart
  echo "exit $? after $(( ($(date +%s%N) - s) / 1000000 )) ms (process start to exit)"; cat "$W/runs/dask/iterations.jsonl" 2>/dev/null; } >"$OUT/5-dask.txt" 2>&1
tail -5 "$OUT/5-dask.txt"
stamp "done"
