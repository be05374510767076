"""Benchmarks, measured side by side in one run: ``./scripts/bench.sh`` (not part of the tests)."""
