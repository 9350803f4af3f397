# The two commands a new user needs: `make demo` and `make test`.
# Both create .venv in the repo root when it is missing and install the project into it.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

export DYNA_HOME    ?= $(CURDIR)/.dyna
export DAGSTER_HOME ?= $(DYNA_HOME)/dagster

.PHONY: demo test ui bench-storage bench-ingest bench-manifest venv clean system-deps

venv: $(STAMP)

# torch is pinned to the CPU build that lies on local disk; an open range pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@$(MAKE) --no-print-directory system-deps
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0" -e ".[dev]"
	@touch $(STAMP)

# A real single-node Slurm for the Slurm tests (tests/infra/test_slurm.py): Debian's slurm-wlm, installed
# when this runs as root with apt and it is missing; otherwise those tests skip and say why.
system-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v slurmctld >/dev/null; then \
		echo "installing slurm-wlm (a single-node Slurm on loopback for the tests) ..."; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm >/dev/null) \
			|| echo "slurm-wlm not installed: the Slurm tests will skip"; \
	fi

demo: $(STAMP)
	$(PY) -m dyna_assets.demo

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile -q

ui: $(STAMP)
	@mkdir -p $(DAGSTER_HOME)
	@cp infra/dagster/dagster.yaml $(DAGSTER_HOME)/  # the embedded instance always runs the project's config
	$(VENV)/bin/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

# Screenshots of the UI for README.md's "Looking at the results" (scripts/screenshots.py, after `make demo`):
# Debian's chromium (apt, as root, as system-deps does) and playwright in .venv, installed here when missing;
# neither is a dependency of the project or of `make test`.
.PHONY: screenshots
screenshots: $(STAMP)
	@if ! command -v chromium >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium (headless, for the screenshots) ..."; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	fi
	@$(PY) -c "import playwright" 2>/dev/null || $(PY) -m pip install --quiet playwright
	$(PY) scripts/screenshots.py

bench-storage: $(STAMP)
	$(PY) -m benchmarks storage

bench-ingest: $(STAMP)
	$(PY) -m benchmarks ingest

bench-manifest: $(STAMP)
	$(PY) -m benchmarks manifest

clean:
	rm -rf $(DYNA_HOME)

# The `lerobot` package, in a venv of its own, for tests/lerobot_interop/ (they skip without it).
# lerobot 0.4 (dataset format v3.0) needs torch<2.11, so it cannot share .venv's torch 2.13; PyPI's
# torch is a CUDA build: ~2 min and ~8 GB. The v2.1 one (lerobot 0.3.2) installs torch from local disk.
LEROBOT_VENV     ?= build/lerobot-venv
LEROBOT_V21_VENV ?= build/lerobot-v21-venv

.PHONY: lerobot-venv lerobot-v21-venv test-lerobot

lerobot-venv: $(LEROBOT_VENV)/.lerobot-stamp

$(LEROBOT_VENV)/.lerobot-stamp: infra/lerobot/build_venv.sh
	infra/lerobot/build_venv.sh $(LEROBOT_VENV)

lerobot-v21-venv: $(LEROBOT_V21_VENV)/.lerobot-stamp

$(LEROBOT_V21_VENV)/.lerobot-stamp: infra/lerobot/build_venv.sh
	LEROBOT_SPEC="lerobot==0.3.2 torch==2.14.1 torchvision==0.29.1" infra/lerobot/build_venv.sh $(LEROBOT_V21_VENV)

test-lerobot: $(STAMP) lerobot-venv
	DYNA_LEROBOT_VENV=$(CURDIR)/$(LEROBOT_VENV) DYNA_LEROBOT_V21_VENV=$(CURDIR)/$(LEROBOT_V21_VENV) \
		$(PY) -m pytest -q tests/lerobot_interop tests/episodes/test_lerobot.py
