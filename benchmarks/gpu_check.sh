#!/bin/sh
# Check resilient-train on a GPU host: doctor, a chief kill -9 resumed to the uninterrupted
# run's exact weights digest, --gpus-per-worker, and throughput against the plain MWMS loop.
# About 5 minutes on one GPU (an estimate: not yet run on one). Writes one JSON (default benchmarks/results/gpu_check.json)
# with every figure and pass/fail per check; exits 0 when every check passed.
#
#   benchmarks/gpu_check.sh [--out FILE]          (from a checkout with `make test`'s .venv,
#                                                  or PYTHON=/path/to/python)
# What each check does and why: benchmarks/gpu_check.py's docstring, benchmarks/README.md.
set -eu
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
exec "$PYTHON" benchmarks/gpu_check.py "$@"
