# Quick start:  make run   (installs into .venv, then explains the seed's example)
#               make test  (the whole test suite)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test install clean

run: $(STAMP)
	$(VENV)/bin/selfattn explain

test: $(STAMP)
	$(PY) -m pytest -q

install: $(STAMP)

# torch first, pinned to the CPU build, so nothing later pulls a CUDA build.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
