# Everything a fresh clone needs, from nothing but a Python 3.11, 3.12 or 3.13.
#
# Installs come from requirements/lock.txt (every package pinned, per Python where they
# differ), so a release elsewhere cannot change what the tests run on; `make lock` refreshes
# it. `make test-latest` and `make test-oldest` try the newest releases and the lowest
# versions pyproject.toml allows.

# Every Python started from here (the tests' servers, workers and command-line runs too) keeps
# the bytecode it compiles: with PYTHONDONTWRITEBYTECODE set, as some machines set it, each new
# process compiles dask, xarray and pandas again, which doubled the cost of starting one.
unexport PYTHONDONTWRITEBYTECODE

# python3 when it is 3.11-3.13, else the newest of those found on PATH or through pyenv
PYTHON ?= $(shell tools/find-python)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOCK := requirements/lock.txt
UV_VERSION := 0.13.9
SUPPORTED := 3.11 3.12 3.13
# Test modules are spread over JOBS processes, each module whole in one of them (its
# module-scoped servers and clusters start once).
JOBS ?= 2
PYTEST := -m pytest -q --durations=20 -n $(JOBS) --dist loadfile

.PHONY: serve demo test test-smoke test-latest test-oldest test-matrix lock bench bench-service \
        bench-load bench-out-of-core fuzz clean conformance

# $(call venv,DIR,PYTHON,ARGUMENTS OF uv pip install): a new environment with the project and
# its test extra. uv resolves and installs in seconds; it comes from PyPI into the environment.
define venv
	@test -n "$(2)" || { echo "no Python for $(1): see tools/find-python" >&2; exit 1; }
	rm -rf $(1)
	$(2) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	$(1)/bin/uv pip install --quiet --python $(1)/bin/python $(3) -e '.[test]'
	$(1)/bin/python -c 'import sys; print("$(1):", sys.version.split()[0])'
	touch $(1)/.installed
endef

$(STAMP): pyproject.toml $(LOCK)
	$(call venv,$(VENV),$(PYTHON),-c $(LOCK))

# One environment per supported Python, from the lock: .venv-3.11, .venv-3.12, .venv-3.13
# (precious: make would otherwise delete the stamp of a pattern rule after using it once)
.PRECIOUS: .venv-%/.installed
.venv-%/.installed: pyproject.toml $(LOCK)
	$(call venv,.venv-$*,$(shell tools/find-python $*),-c $(LOCK))

# The service on 127.0.0.1:8000 with an embedded Dask cluster; arrays and jobs under ./data.
serve: $(STAMP)
	$(BIN)/python -m service --host 127.0.0.1 --port $(or $(PORT),8000) --data-root data

demo: $(STAMP)
	$(BIN)/python -m ops.demo

# The whole suite (what CI runs), with the 20 slowest tests listed at the end.
test: $(STAMP)
	$(BIN)/python $(PYTEST)

# The representative subset (at least one test of every module, a real service process and a
# real dask scheduler/worker cluster) on one supported Python: make test-smoke-3.13
test-smoke-%: .venv-%/.installed
	.venv-$*/bin/python $(PYTEST) -m smoke

# The whole suite on every supported Python.
test-matrix: $(foreach v,$(SUPPORTED),test-matrix-$(v))
test-matrix-%: .venv-%/.installed
	.venv-$*/bin/python $(PYTEST)

# The newest release of everything (no lock), in a new environment each time.
test-latest:
	$(call venv,.venv-latest,$(PYTHON),--upgrade --refresh)
	.venv-latest/bin/python -m pip list --format=freeze --disable-pip-version-check > .venv-latest/versions.txt
	.venv-latest/bin/python $(PYTEST)

# The lowest versions pyproject.toml declares for its own dependencies, on the oldest Python.
test-oldest:
	$(call venv,.venv-oldest,$(shell tools/find-python 3.11),--resolution lowest-direct --refresh)
	.venv-oldest/bin/python -m pip list --format=freeze --disable-pip-version-check > .venv-oldest/versions.txt
	.venv-oldest/bin/python $(PYTEST)

# Re-resolve the lock to today's newest releases (for every supported Python), then run
# `make test-matrix` before committing it.
lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml --extra test --universal --python-version 3.11 --upgrade \
	    --quiet -o $(LOCK)

# OGC API - Processes 1.0 conformance: the ported subset of OGC's test suite against a live
# service on 127.0.0.1 (tests/service/api/test_conformance_suite.py, which the suite runs too),
# one PASS/FAIL line per requirement; non-zero exit on any failure.
conformance: $(STAMP)
	$(BIN)/python tools/conformance.py

bench: $(STAMP)
	$(BIN)/python -m bench.rearrange
	$(BIN)/python -m bench.gather_dequant

bench-service: $(STAMP)
	$(BIN)/python -m bench.service

bench-load: $(STAMP)
	$(BIN)/python -m bench.load

# Out of core: every operator on a 3 GiB Zarr input on 2 workers x 384 MiB, local disk and a local S3 server.
bench-out-of-core: $(STAMP)
	$(BIN)/python -m bench.out_of_core

# API fuzzing, the long run: schemathesis over every operation, all phases (make fuzz EXAMPLES=1000).
fuzz: $(STAMP)
	$(BIN)/python -m bench.fuzz --examples $(or $(EXAMPLES),300)

clean:
	rm -rf $(VENV) .venv-* .pytest_cache .hypothesis
