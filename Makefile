# Two commands a person needs: `make run` (the demo) and `make test` (the suite).
# Both create .venv with the project installed (tests and examples extras) on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test test-all chaos bench bench-smoke clean slurm-deps browser-deps

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,examples]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/resilient-train run recipes/digits_cnn.py --workers 2

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=25

test-all: $(STAMP)
	RT_SLOW=1 RT_REQUIRE_SLURM=1 RT_REQUIRE_NETNS=1 RT_REQUIRE_CHROMIUM=1 $(BIN)/python -m pytest -q

# Debian's Slurm and munge for tests/integration/test_slurm.py (a local cluster, as root).
slurm-deps:
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurm-wlm munge

# Debian's Chromium for tests/integration/test_report_browser.py (the report page in a real browser).
browser-deps:
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y chromium

chaos: $(STAMP)
	$(BIN)/python -m resilient_train.chaos run --all

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python benchmarks/checkpoint_overhead.py
	$(BIN)/python benchmarks/recovery.py
	$(BIN)/python benchmarks/throughput.py
	$(BIN)/python benchmarks/epochs.py
	$(BIN)/python benchmarks/reentry.py
	$(BIN)/python benchmarks/resize.py
	$(BIN)/python benchmarks/goodput.py
	$(BIN)/python benchmarks/notice_save.py
	$(BIN)/python benchmarks/ray_recovery.py
	$(BIN)/python benchmarks/keras_fit.py
	$(BIN)/python benchmarks/ps_throughput.py
	$(BIN)/python benchmarks/supervisor_scaling.py

# Every benchmark script at smoke size (`--smoke --out FILE`), the slow ones included:
# tests/test_benchmarks.py, benchmarks/README.md. Nothing is written into benchmarks/results/.
bench-smoke: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	RT_SLOW=1 $(BIN)/python -m pytest -q tests/test_benchmarks.py

clean:
	rm -rf runs .pytest_cache
