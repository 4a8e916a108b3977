# Two commands a person needs: `make run` (the demo) and `make test` (the suite).
# Both create .venv with the project installed (tests and examples extras) on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test test-all chaos bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,examples]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/resilient-train run recipes/digits_cnn.py --workers 2

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-all: $(STAMP)
	RT_SLOW=1 $(BIN)/python -m pytest -q

chaos: $(STAMP)
	$(BIN)/python -m chaos run --all

bench: $(STAMP)
	$(BIN)/python benchmarks/checkpoint_overhead.py
	$(BIN)/python benchmarks/recovery.py
	$(BIN)/python benchmarks/ray_recovery.py

clean:
	rm -rf runs .pytest_cache
