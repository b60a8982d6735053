# Everything a fresh clone needs, from nothing but Python 3.11.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve demo test bench bench-service bench-load bench-out-of-core fuzz clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# The service on 127.0.0.1:8000 with an embedded Dask cluster; arrays and jobs under ./data.
serve: $(STAMP)
	$(BIN)/python -m service --host 127.0.0.1 --port $(or $(PORT),8000) --data-root data

demo: $(STAMP)
	$(BIN)/python -m ops.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

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
	rm -rf $(VENV) .pytest_cache .hypothesis
