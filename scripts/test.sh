#!/usr/bin/env bash
# Set up (scripts/setup.sh), then lint, type-check, build the documentation and run the whole
# test suite: the no-JVM tier, then the tests marked spark, both on the default Spark line
# (3.5, .venv), then the Spark-4 tier: the tests marked spark4 on the 4.1 line (.venv-spark4;
# the selection: tests/conftest.py's SPARK4_TIER). With arguments, one pytest run of the
# caller's selection (ICEGATE_TEST_VENV=.venv-spark4: on the 4.1 line).
# pytest's "no tests collected" (exit 5) counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
# The Spark-4 tier's environment only where it runs: the whole suite, or a selection asked
# of .venv-spark4.
setup_options=(--test)
if [ "$#" -eq 0 ] || [ "${ICEGATE_TEST_VENV:-}" = .venv-spark4 ]; then
  setup_options+=(--spark4)
fi
./scripts/setup.sh "${setup_options[@]}" || exit 1
.venv/bin/ruff check . || exit 1
.venv/bin/mypy || exit 1
# The documentation site (mkdocs.yml): a broken link or anchor, or a reference the code
# cannot generate, fails the build. (The variable silences the theme's end-of-life banner.)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet || exit 1
# Two processes (ICEGATE_TEST_WORKERS; 0 runs in this one), each with its own Spark session;
# a file stays in one process, so a module's servers start once.
workers="${ICEGATE_TEST_WORKERS:-2}"
venv="${ICEGATE_TEST_VENV:-.venv}"
run_pytest() {
  local code
  if [ "$workers" -gt 0 ]; then
    "$venv/bin/python" -m pytest -n "$workers" --dist loadfile --durations=25 "$@"
  else
    "$venv/bin/python" -m pytest --durations=25 "$@"
  fi
  code=$?
  if [ "$code" -eq 5 ]; then
    echo "test.sh: pytest collected no tests; that is a failure" >&2
    return 1
  fi
  return "$code"
}
if [ "$#" -gt 0 ]; then  # the caller's selection, in one run
  run_pytest "$@"
  exit $?
fi
# Without arguments, two tiers (pyproject.toml's marker spark): the tests that start no JVM
# first, in a couple of minutes (that run fails if one starts anyway), then those that do.
# The second runs whatever the first said; either failing fails the script.
run_pytest -m "not spark"
first=$?
run_pytest -m spark
second=$?
# The other Spark line: a selection chosen for coverage in a few minutes (a full pass, the
# WAL's exactly-once with a kill -9, delete files, expiry and orphans, a Dagster batch run).
venv=.venv-spark4
run_pytest -m spark4
third=$?
for code in "$first" "$second"; do
  if [ "$code" -ne 0 ]; then
    exit "$code"
  fi
done
exit "$third"
