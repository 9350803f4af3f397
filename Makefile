# The two commands a new user needs: `make demo` and `make test`.
# Both create .venv in the repo root when it is missing and install the project into it.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

export DYNA_HOME    ?= $(CURDIR)/.dyna
export DAGSTER_HOME ?= $(DYNA_HOME)/dagster

.PHONY: demo test ui bench-storage bench-ingest bench-manifest venv clean

venv: $(STAMP)

# torch is pinned to the CPU build that lies on local disk; an open range pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0" -e ".[dev]"
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m dyna_assets.demo

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile -q

ui: $(STAMP)
	@mkdir -p $(DAGSTER_HOME)
	@cp infra/dagster/dagster.yaml $(DAGSTER_HOME)/  # the embedded instance always runs the project's config
	$(VENV)/bin/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

bench-storage: $(STAMP)
	$(PY) -m benchmarks storage

bench-ingest: $(STAMP)
	$(PY) -m benchmarks ingest

bench-manifest: $(STAMP)
	$(PY) -m benchmarks manifest

clean:
	rm -rf $(DYNA_HOME)
