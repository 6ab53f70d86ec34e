# Two verbs for newcomers: `make demo` and `make test`. Everything they need is installed here.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch first, pinned to the CPU build: left to the resolver, PyPI's default Linux wheel
# is a multi-GB CUDA build. Elsewhere: TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=

.PHONY: install system-deps demo test pytest check format clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/.installed

# PostgreSQL server binaries: the tests start throwaway clusters from them.
system-deps:
	@bash scripts/system-deps.sh

demo: install
	$(BIN)/epiflow demo

test: install system-deps check pytest

pytest: install
	$(BIN)/pytest

check: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .epiflow .pytest_cache .mypy_cache .ruff_cache
