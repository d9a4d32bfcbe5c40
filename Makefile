# vbcluster developer entry points. Needs only Python 3.11 as `python3` (override: make PYTHON=...).
# OPENBLAS_* and other environment variables are passed through untouched.

PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# Environment for test runs: a throwaway Prefect home, no telemetry, a patient ephemeral server,
# and a non-interactive matplotlib backend.
TEST_ENV := PREFECT_SERVER_ANALYTICS_ENABLED=false \
            PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120 \
            MPLBACKEND=Agg

LINT_PATHS := $(wildcard vbcore pipeline flows tests bench scripts examples)

.PHONY: venv test demo bench bench-quick lint docs clean gpu-wheels gpu-check

venv: $(STAMP)

# Reinstall only when the dependency declarations change.
$(STAMP): pyproject.toml constraints.txt
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --upgrade pip
	$(VPY) -m pip install -c constraints.txt -e '.[dev]'
	touch $@

test: venv
	@tmp=$$(mktemp -d); \
	PREFECT_HOME=$$tmp $(TEST_ENV) $(VPY) -m pytest -q; \
	rc=$$?; rm -rf "$$tmp"; exit $$rc

# cluster_flow end to end (digits + a small synthetic store) on Prefect's ephemeral API and a Dask
# LocalCluster; Prefect's home (its SQLite database) lives in .vbcluster/prefect.
demo: venv
	@mkdir -p .vbcluster/prefect
	PREFECT_HOME=$(CURDIR)/.vbcluster/prefect $(TEST_ENV) $(VPY) -m flows.demo --out .vbcluster/demo

# All benchmarks (about 20-25 minutes on 2 cores by the parts, plus bench_refresh: 6-7 minutes at load 6;
# the synthetic stores are kept in bench/out/).
bench: venv
	$(VPY) bench/bench_vbem.py
	$(VPY) bench/bench_ingest.py
	mkdir -p bench/out && $(VPY) bench/bench_engine.py --workdir bench/out
	$(VPY) bench/bench_checkpoint.py --workdir bench/out
	$(VPY) bench/bench_ncg.py --workdir bench/out
	$(VPY) bench/bench_sga.py --workdir bench/out --vbem-iter 5
	$(VPY) bench/bench_converge.py --store bench/out/sun397.zarr
	$(VPY) bench/bench_projection.py --store bench/out/sun397.zarr --parts  # both solvers, the SYRK floor
	$(VPY) bench/bench_sketch.py --store bench/out/sun397.zarr --pca 128  # randomized variants: cost, captured variance
	$(VPY) bench/bench_extract.py --workdir bench/out --images 64
	$(VPY) bench/bench_moves_cost.py
	$(VPY) bench/bench_refresh.py --workdir bench/out  # 500,000 x 128: memoized refresh, partial_fit, coreset
	$(VPY) bench/bench_scale.py --rows 1000000,4000000 --workdir bench/out  # VB EM at 1M and 4M x 256, persisted and streamed: ~15 min
	$(VPY) bench/bench_dask_scale.py --store bench/out/scale-1000000-256-lz4.zarr  # memory-limited Dask workers: bits against in-process, a worker killed
	$(VPY) bench/bench_minibatch_scale.py --store bench/out/scale-1000000-256-lz4.zarr  # sga-f, svi vs VB EM to convergence at 1M x 256
	$(VPY) bench/bench_real.py --out bench/out  # the real-data study: hours (features cached in bench/out/real)
	$(VPY) bench/bench_sklearn_converge.py --out bench/out  # VB EM vs scikit-learn's BGM to convergence: ~10 min
	$(VPY) bench/bench_choosing_k.py wider  # issue 26's planted checks, 21 sets x 5 starts x 2 learners: ~10 min
	$(VPY) bench/bench_battery.py --out bench/out  # issue 51's real sets: what the defaults and --select auto find
	$(VPY) bench/bench_select.py --out bench/out  # screening against fitting every candidate in full
	$(VPY) bench/bench_restarts.py --out bench/out  # the default's kept model from 5 seeds; its screen against a full comparison

# One VB EM iteration against scikit-learn and the GEMM share, interleaved rounds (about 1 minute).
bench-quick: venv
	$(VPY) bench/bench_vbem.py

# The API reference, generated from the docstrings by pdoc into docs/api/ (open docs/api/index.html).
# tests/test_docs.py runs the same build, so `make test` fails when a page is missing or pdoc warns.
docs: venv
	@tmp=$$(mktemp -d); PREFECT_HOME=$$tmp MPLBACKEND=Agg $(VPY) scripts/build_api_docs.py --out docs/api; \
	rc=$$?; rm -rf "$$tmp"; exit $$rc

# The GPU check of issue 27 (docs/benchmarks.md, "GPU"): the wheel set for a Python 3.12 GPU machine
# into .whl/ (carry it to the device), and the check itself (a dry run where CuPy sees no device).
gpu-wheels: venv
	PYTHON=$(VPY) scripts/gpu_wheels.sh

gpu-check:
	bash scripts/gpu_check.sh

lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)

clean:
	rm -rf $(VENV) build dist docs/api *.egg-info .pytest_cache .ruff_cache .mypy_cache .hypothesis \
	       bench/out
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
