#!/usr/bin/env bash
# Set up, then run the benchmarks (bench/run.py): both sides measured in this run, with ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m bench.run "$@"
