"""The maintenance log: an Iceberg table with one row per table per operation.

- :mod:`.writer`: the log table's schema, creation, appends and reads;
- :mod:`.upkeep`: the log table's own settings and what it is due for (it rots like
  any table);
- :mod:`.totals`: what the log adds up to per table and operation (rows, failures, seconds,
  files and bytes rewritten or freed, orphans, WAL rows), read incrementally, no JVM.

May import: ``catalog``, ``config``, ``errors``, :mod:`..identifiers`, :mod:`..results`,
:mod:`..pyiceberg_writes`. Never Dagster or presentation.
"""
