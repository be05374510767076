"""Benchmarks, every side a cold process on its own fixture: ``./scripts/bench.sh`` (see
``bench.run``; not part of the tests)."""
