#!/usr/bin/env bash
# Set up, then run the benchmarks (bench/run.py): every side of a comparison in its own cold
# process on its own fixture, sides alternating, medians and ratios printed.
# Usage: ./scripts/bench.sh [NAME ...] [--reps N] [--quick]   (more options: --help)
set -euo pipefail
cd "$(dirname "$0")/.."
# spark_lines (run by default) measures Spark 4.1 too: its environment, .venv-spark4.
setup_options=()
if [ "$#" -eq 0 ] || [[ " $* " == *" spark_lines "* ]]; then
  setup_options=(--spark4)
fi
./scripts/setup.sh "${setup_options[@]}"
exec .venv/bin/python -m bench.run "$@"
