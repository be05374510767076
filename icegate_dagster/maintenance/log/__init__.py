"""The maintenance log: an Iceberg table with one row per table per operation.

- :mod:`.writer`: the log table's schema, creation, appends and reads;
- :mod:`.upkeep`: the log table's own settings and what it is due for (it rots like
  any table).

May import: ``catalog``, ``config``, ``errors``, :mod:`..identifiers`, :mod:`..results`,
:mod:`..pyiceberg_writes`. Never Dagster or presentation.
"""
