"""The bottom of the Dagster layer: what this code location names and records, and its
assets.

- :mod:`.names`: the Dagster names: asset keys, the ``iceberg_tables`` partitions (one per
  table), job and sensor names, run and event tags;
- :mod:`.runs`: the tables a run of this code location covers (its batch config, its
  partition tags);
- :mod:`.trigger_state`: the health trigger's stores, clock and busy tables, as a tick or
  a run reads them;
- :mod:`.partition_events`: a partition's page after a pass: its metadata and check
  evaluations, whoever records them;
- :mod:`.partition_observations`: what the health sensor records on partition pages
  without a run;
- :mod:`.partition_checks`: the health sensor's check verdicts, in a short run;
- :mod:`.maintained_table`: ``maintained_table``, one partition per table, its ops and
  checks;
- :mod:`.maintenance_log`: ``maintenance_log``, the log table;
- :mod:`.lakehouse_health`: ``lakehouse_health``, the whole lakehouse's health, and its
  event.

May import: ``resources`` and everything below the Dagster layer. Never ``sensors``,
``jobs`` or ``definitions``.
"""
