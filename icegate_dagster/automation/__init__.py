"""The automation: the sensors that keep every table healthy unattended, what they
remember, the runs they ask for, and the healing of runs whose worker died.

Read one tick top-down in its sensor's module; each says its steps first:

- :mod:`.health_sensor`: ``table_health_sensor``: list, heal, look, remember, decide,
  record;
- :mod:`.wal_sensor`: ``wal_size_sensor``: one WAL listing, the due backlogs, back-off;
- :mod:`.discovery_sensor`: ``iceberg_table_discovery``: partitions follow the catalog,
  removed only once a table is confirmed gone.

What the ticks share:

- :mod:`.tick`: the deadline and clock, the lease store and the trigger's memory, busy
  tables, requests no run answered;
- :mod:`.look`: each table's health, read again only where it may have changed;
- :mod:`.requests`: run requests and their keys (a decision number each);
- :mod:`.events`: partition pages and ``lakehouse_health``, recorded on change;
- :mod:`.healing`: runs whose worker is provably gone;
- :mod:`.runs`: run tags and jobs, the tables an unfinished run covers.

The rules themselves are plain Python in ``maintenance.trigger`` (the memory, back-off,
the selection), shared with the CLI's passes, which write the same memory. This package
imports nothing on its own: ``definitions`` takes the sensors from their modules.
"""
