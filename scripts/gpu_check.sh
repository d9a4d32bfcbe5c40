#!/usr/bin/env bash
# Issue 27's GPU check on a bare device machine: install the carried wheels (.whl/, made here by
# scripts/gpu_wheels.sh) next to the image's own packages, then run scripts/gpu_check.py, which
# writes summary.json, summary.txt and logs.tar.gz under $OUT. From the device tool:
#
#   run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=540)
#
# Anywhere else (no device: a dry run, see gpu_check.py): OUT=/tmp/gpu-out bash scripts/gpu_check.sh
# Environment: OUT (default ./gpu_out), GPU_CHECK_WORK (default /tmp/vbc-gpu-check), PYTHON
# (default python3, the image's, which holds CuPy), GPU_CHECK_BUDGET (seconds for the steps, 420),
# GPU_CHECK_INSTALL=0 (use the packages already installed, not .whl/).
# Arguments go to gpu_check.py (--small: a small store).
#
# onnxruntime-gpu (CUDA 13) does not fit one call (scripts/gpu_wheels.sh --ort splits it into .ort/):
# on a warm machine, one call per part, each within 30 s of the last,
#   run(command="bash scripts/gpu_check.sh --ort-part", carry=[".ort/part-00", ".ort/SHA256"], timeout_s=60)
# stages the parts in /tmp/vbc-ort; the check then joins them, checks the sha256 and installs the
# wheel ahead of the image's CPU-only onnxruntime.
set -uo pipefail

cd "$(dirname "$0")/.."
t0=$(date +%s)
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/gpu_out}
WORK=${GPU_CHECK_WORK:-/tmp/vbc-gpu-check}
mkdir -p "$OUT" "$WORK/logs"
ORT_STAGE=/tmp/vbc-ort
if [ -d .ort ]; then
    mkdir -p "$ORT_STAGE" && cp .ort/part-* .ort/SHA256 "$ORT_STAGE/" 2>/dev/null
fi
if [ "${1:-}" = "--ort-part" ]; then
    echo "onnxruntime-gpu parts staged in $ORT_STAGE:" && ls -l "$ORT_STAGE"
    exit 0
fi
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg PREFECT_HOME="$WORK/prefect" PREFECT_SERVER_ANALYTICS_ENABLED=false \
       PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120

# The carried wheels go to a folder of their own, ahead of the image's packages on the path; the
# image's CuPy, NumPy, SciPy, scikit-learn, pandas, ... stay (.whl/REUSED.txt lists what is reused).
if [ -d .whl ] && [ "${GPU_CHECK_INSTALL:-1}" = 1 ]; then
    rm -rf "$WORK/site"
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$WORK/site" .whl/*.whl >"$WORK/logs/install.log" 2>&1; then
        echo "installed $(ls .whl/*.whl | wc -l) carried wheels into $WORK/site in $(( $(date +%s) - t0 )) s"
    else
        echo "install of the carried wheels FAILED (log: logs/install.log); going on with what is there"
        tail -3 "$WORK/logs/install.log"
    fi
    export PATH="$WORK/site/bin:$PATH" GPU_CHECK_SITE="$WORK/site"
    export PYTHONPATH="$PWD:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
else
    echo "not installing .whl/ (absent, or GPU_CHECK_INSTALL=0): using the packages already installed"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -f "$ORT_STAGE/SHA256" ]; then
    ort=$ORT_STAGE/$(awk '{print $2}' "$ORT_STAGE/SHA256")
    cat "$ORT_STAGE"/part-* > "$ort"
    if (cd "$ORT_STAGE" && sha256sum --quiet -c SHA256) && "$PY" -m pip install -q --no-index --no-deps \
            --no-compile --target "$WORK/ort-site" "$ort" >"$WORK/logs/install-ort.log" 2>&1; then
        echo "installed $(basename "$ort") into $WORK/ort-site"
        export PYTHONPATH="$WORK/ort-site:$PYTHONPATH"
    else
        echo "onnxruntime-gpu: parts missing or damaged ($(ls "$ORT_STAGE" | tr '\n' ' ')); the image's onnxruntime is used"
    fi
    rm -f "$ort"
fi
cp .whl/MANIFEST.txt "$WORK/logs/wheels-carried.txt" 2>/dev/null
cp .whl/REUSED.txt "$WORK/logs/wheels-reused.txt" 2>/dev/null
budget=$(( ${GPU_CHECK_BUDGET:-420} - ( $(date +%s) - t0 ) ))
exec "$PY" scripts/gpu_check.py --out "$OUT" --work "$WORK" --budget "$budget" "$@"
