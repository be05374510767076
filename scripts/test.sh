#!/usr/bin/env bash
# Set up (scripts/setup.sh), then lint, type-check and run the whole test suite.
# pytest's "no tests collected" (exit 5) counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --test || exit 1
.venv/bin/ruff check . || exit 1
.venv/bin/mypy || exit 1
.venv/bin/python -m pytest "$@"
code=$?
if [ "$code" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$code"
