#!/usr/bin/env bash
# Set up, then run the benchmarks (bench/run.py): every side of a comparison in its own cold
# process on its own fixture, sides alternating, medians and ratios printed.
# Usage: ./scripts/bench.sh [NAME ...] [--reps N] [--quick]   (more options: --help)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m bench.run "$@"
