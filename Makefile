# The two commands of the README. Each sets up .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
IMPL ?= adapters/reference

.PHONY: conformance test setup clean

$(BIN)/kvspec: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/kvspec

setup: $(BIN)/kvspec

## The main job: the conformance suite against one implementation (default: the reference model).
conformance: setup
	$(BIN)/pytest conformance --impl=$(IMPL)

## The project's own tests.
test: setup
	$(BIN)/pytest tests

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
