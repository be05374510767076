"""The sensors that keep every table healthy unattended, the runs they ask for, the healing
of runs whose worker died, and the pruning of old runs.

Read one tick top-down in its sensor's module; each says its steps first:

- :mod:`.health_sensor`: ``table_health_sensor``: list, heal, look, remember, decide,
  record;
- :mod:`.wal_sensor`: ``wal_size_sensor``: one WAL listing, the due backlogs, back-off;
- :mod:`.discovery_sensor`: ``iceberg_table_discovery``: partitions follow the catalog,
  removed only once a table is confirmed gone; it also prunes old runs.

What the ticks share:

- :mod:`.tick`: the deadline, the healing and the requests no run answered, on top of the
  trigger's state (``assets.trigger_state``: stores, clock, busy tables);
- :mod:`.requests`: run requests and their keys (a decision number each);
- :mod:`.healing`: runs whose worker is provably gone;
- :mod:`.run_history`: old runs of this code location, forgotten past
  ``maintain.history.runs``.

The rules themselves are plain Python in ``maintenance.trigger`` (the look, the decision,
the memory, back-off, the selection), shared with the CLI's passes and the exporter; what
the sensors record and name comes from ``assets``. May import ``resources``, ``assets``
and everything below the Dagster layer; never ``jobs`` or ``definitions``. This package
imports nothing on its own: ``definitions`` takes the sensors from their modules.
"""
