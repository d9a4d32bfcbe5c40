#!/usr/bin/env bash
# Download the wheels that scripts/gpu_check.sh installs on a bare GPU machine (Python 3.12,
# manylinux x86_64, no network there) into .whl/ (ignored by git; carry it: run(carry=[".whl"])).
#
#   scripts/gpu_wheels.sh            # .whl/: the project, its pinned dependencies, dask-cuda
#   scripts/gpu_wheels.sh --ort      # also .ort/: onnxruntime-gpu (CUDA 13) split into parts (see below)
#
# What is carried and what is reused:
# * reused from the GPU image (KINDS.md of the device lists them): CuPy (cupy-cuda13x 14.2.0 was seen
#   there), NumPy, SciPy, scikit-learn, pandas, pyarrow, matplotlib, scikit-image, h5py, Pillow, onnx,
#   onnxruntime, numba, cuda-core and the other packages in REUSE below. The project asks only
#   lower bounds of them (pyproject.toml), so the image's versions do; gpu_check.sh logs the versions
#   it found and every requirement of the carried wheels that the image does not meet.
# * carried: everything else the project, its `gpu` extra (dask-cuda) and the gpu-marked tests
#   (array-api-strict, pytest-timeout) need, pinned by constraints.txt -- except dask and
#   distributed: dask-cuda DASK_CUDA pins them (through rapids-dask-dependency) to DASK below, one
#   month older than constraints.txt's; the project's code and tests run on both (tested here in a
#   Python 3.12 venv, docs/guide.md "GPU workers").
# * the project itself, as a wheel built from this checkout.
#
# onnxruntime-gpu for CUDA 13 exists on PyPI (1.31.1 links libcublas.so.13, libcudart.so.13) but its
# wheel is ~244 MiB, over the 64 MiB a device call carries. --ort splits it into .ort/part-NN
# (48 MiB each); `gpu_check.sh --ort-part` stages the parts carried by one call on a warm machine,
# one call per part, and the check joins and installs them (docs/benchmarks.md, "GPU"). Without it the ONNX step reports the
# providers the image's onnxruntime has (the pip name of its CPU build) and skips the CUDA run.
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=.whl
DASK_CUDA=26.10.0
DASK=2026.7.1          # what rapids-dask-dependency 26.10 pins: dask, distributed >=2026.7.1,<2026.7.2
ORT_GPU=1.31.1
REUSE="numpy scipy scikit-learn joblib threadpoolctl pandas pyarrow matplotlib contourpy cycler fonttools
kiwisolver pyparsing pillow h5py scikit-image imageio tifffile networkx lazy-loader onnx onnxruntime
protobuf ml-dtypes cupy-cuda13x cuda-core cuda-bindings cuda-pathfinder nvidia-ml-py numba llvmlite
packaging pytest pluggy iniconfig pygments pyyaml jinja2 markupsafe"
# not carried at all: bokeh (rapids-dask-dependency asks for it; only Dask's dashboard uses it, and
# without it the dashboard is off) and what only it needs
SKIP="bokeh xyzservices"
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
        "${PLATFORMS[@]}")

norm() { tr 'A-Z_.' 'a-z--'; }   # a distribution's name as pip normalises it

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# the requirements: the project's dependencies, the gpu extra's dask-cuda, what the gpu tests import
"$PY" - "$tmp/reqs.txt" <<'EOF'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
reqs = list(project["dependencies"])
reqs += [r for r in project["optional-dependencies"]["gpu"] if not r.startswith("cupy")]
reqs += ["array-api-strict", "pytest-timeout"]
open(sys.argv[1], "w").write("\n".join(reqs) + "\n")
EOF
# constraints.txt with dask-cuda's dask and distributed
grep -viE '^(dask|distributed)==' constraints.txt > "$tmp/cons.txt"
printf 'dask==%s\ndistributed==%s\ndask-cuda==%s\nrapids-dask-dependency==%s\n' \
    "$DASK" "$DASK" "$DASK_CUDA" "$DASK_CUDA" >> "$tmp/cons.txt"

echo "resolving for CPython 3.12, manylinux x86_64 ..."
"$PY" -m pip download -q --disable-pip-version-check "${TARGET[@]}" -d "$tmp/all" \
    -c "$tmp/cons.txt" -r "$tmp/reqs.txt"

rm -rf "$OUT" && mkdir -p "$OUT"
reuse=$(echo $REUSE | tr ' ' '\n' | norm)
skip=$(echo $SKIP | tr ' ' '\n' | norm)
: > "$OUT/MANIFEST.txt"
for w in "$tmp"/all/*.whl; do
    base=$(basename "$w")
    name=$(echo "${base%%-*}" | norm)
    version=$(echo "$base" | cut -d- -f2)
    if echo "$skip" | grep -qx "$name"; then
        echo "$name==$version (not carried: the dashboard only)" >> "$tmp/reused.txt"
    elif echo "$reuse" | grep -qx "$name"; then
        echo "$name==$version (resolved here; reused from the GPU image)" >> "$tmp/reused.txt"
    else
        cp "$w" "$OUT/" && echo "$name==$version" >> "$OUT/MANIFEST.txt"
    fi
done
sort -o "$OUT/MANIFEST.txt" "$OUT/MANIFEST.txt"
sort "$tmp/reused.txt" > "$OUT/REUSED.txt"

echo "building the vbcluster wheel from this checkout ..."
had_build=$([ -d build ] && echo 1 || true)
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$OUT" . >/dev/null
[ -n "$had_build" ] || rm -rf build   # setuptools' scratch folder
echo "vbcluster==$(grep -m1 '^version' pyproject.toml | cut -d'"' -f2) (this checkout)" >> "$OUT/MANIFEST.txt"

dups=$(ls "$OUT"/*.whl | xargs -n1 basename | cut -d- -f1 | norm | sort | uniq -d)
[ -z "$dups" ] || { echo "gpu_wheels: two versions of: $dups" >&2; exit 1; }

if [ "${1:-}" = "--ort" ]; then
    echo "onnxruntime-gpu $ORT_GPU (CUDA 13) into .ort/ in 48 MiB parts ..."
    rm -rf .ort && mkdir -p .ort
    "$PY" -m pip download -q --disable-pip-version-check --no-deps "${TARGET[@]}" -d "$tmp/ort" \
        "onnxruntime-gpu==$ORT_GPU"
    ort=$(ls "$tmp"/ort/*.whl)
    (cd "$tmp/ort" && sha256sum "$(basename "$ort")") > .ort/SHA256
    split -b 48M -d "$ort" .ort/part-
    ls .ort
fi

tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
wheels=$(du -cb "$OUT" | tail -1 | cut -f1)
echo "$(grep -c . "$OUT/MANIFEST.txt") wheels carried ($(numfmt --to=iec "$wheels")), $(grep -c . "$OUT/REUSED.txt") reused;" \
     "tracked files $(numfmt --to=iec "$tracked"); together $(numfmt --to=iec $((wheels + tracked))) of the 64 MiB a call carries"
