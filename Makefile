# Two commands: `make demo` (the main job on the embedded defaults) and `make test` (the test suite).
# Both create .venv if missing and install the project into it.

PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
# textworld's build runs a bare `python`: the venv must be first on PATH during the install.
export PATH := $(BIN):$(PATH)
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-openrlhf clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing into $(VENV) (first time: a few minutes)"
	@# The CPU build of torch 2.13.0 first, so nothing later pulls a multi-GB CUDA build.
	$(PIP) install torch==2.13.0
	@# pyserini without its declared dependencies (1-2 GB we do not use); what it needs is in pyproject.
	$(PIP) install --no-deps pyserini==1.6.0
	$(PIP) install -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/agentgym-opsd demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
