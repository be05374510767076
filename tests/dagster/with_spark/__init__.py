"""Dagster tests that run the code location's jobs for real, each run starting Spark (marker
``spark``, set by ``conftest.py``)."""
