# The README's two set-up commands are `make demo` and `make test`; each creates or refreshes
# .venv/ and installs what it needs first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.attnlab-installed

.PHONY: demo test test-unit test-slow test-all test-ecosystem test-slurm slurm lint

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,export,hf]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/attnlab demo

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q --durations=10

# the fast unit run: no test that starts a process or trains a model (see docs/testing.md)
test-unit: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m 'not slow and not integration'

test-slow: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m slow

test-all: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m 'slow or not slow'

# Debian's SLURM and munge for tests/studies/test_slurm.py's one-node cluster, installed where missing
# (apt, as root); the tests start and stop the daemons themselves
slurm:
	test -x /usr/sbin/slurmctld -a -x /usr/sbin/slurmd -a -x /usr/sbin/munged || \
		(apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge)

test-slurm: $(STAMP) slurm
	$(BIN)/python -m pytest -q -m 'slow or not slow' --durations=5 tests/studies/test_slurm.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The clients whose pins conflict with the main venv, each in a venv of its own: Optimum pins
# transformers < 4.58 (also the transformers 4.x check), lm-eval and PEFT take the newest.
# Without them those tests skip, saying which variable would name the interpreter.
HF4 := .venv-hf4
LMEVAL := .venv-lmeval
# llama.cpp, built from the source llama-cpp-python's sdist bundles (PyPI has no Linux wheel):
# several minutes on 2 cores, once
LLAMA := .venv-llama

$(HF4)/.installed: constraints.txt
	test -x $(HF4)/bin/python || $(PYTHON) -m venv $(HF4)
	$(HF4)/bin/python -m pip install --quiet torch==2.13.0 'transformers<4.58' optimum-onnx \
		onnxruntime tokenizers safetensors
	touch $@

$(LMEVAL)/.installed: constraints.txt
	test -x $(LMEVAL)/bin/python || $(PYTHON) -m venv $(LMEVAL)
	$(LMEVAL)/bin/python -m pip install --quiet torch==2.13.0 transformers lm-eval peft
	touch $@

$(LLAMA)/.installed: constraints.txt
	test -x $(LLAMA)/bin/python || $(PYTHON) -m venv $(LLAMA)
	$(LLAMA)/bin/python -m pip install --quiet --no-binary llama-cpp-python llama-cpp-python
	touch $@

test-ecosystem: $(STAMP) $(HF4)/.installed $(LMEVAL)/.installed $(LLAMA)/.installed
	ATTNLAB_OPTIMUM_PYTHON=$(CURDIR)/$(HF4)/bin/python ATTNLAB_LMEVAL_PYTHON=$(CURDIR)/$(LMEVAL)/bin/python \
		ATTNLAB_HF_PYTHON=$(CURDIR)/$(LMEVAL)/bin/python \
		$(BIN)/python -m pytest -q -m 'slow or not slow' tests/export/test_onnx_ecosystem.py \
		tests/export/test_hf_ecosystem.py
	ATTNLAB_HF_PYTHON=$(CURDIR)/$(HF4)/bin/python $(BIN)/python -m pytest -q tests/export/test_hf_ecosystem.py
	ATTNLAB_LLAMA_PYTHON=$(CURDIR)/$(LLAMA)/bin/python $(BIN)/python -m pytest -q -m slow \
		tests/export/test_llama_cpp_ecosystem.py
