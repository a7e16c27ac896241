# The README's two set-up commands are `make demo` and `make test`; each creates or refreshes
# .venv/ and installs what it needs first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.attnlab-installed

.PHONY: demo test test-slow test-all lint

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,export,hf]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/attnlab demo

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m slow

test-all: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m 'slow or not slow'

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
