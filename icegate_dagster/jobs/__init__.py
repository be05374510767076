"""This code location's jobs and its schedule, the top of the Dagster layer below
``definitions``.

- :mod:`.maintenance`: ``maintenance_job`` (partitions of ``maintained_table``, then
  ``maintenance_log``) and ``daily_maintenance``, the daily schedule;
- :mod:`.daily`: one tick of ``daily_maintenance``: runs of ``maintenance_batch_job`` for the
  tables with work, log rows for the rest;
- :mod:`.batch`: ``maintenance_batch_job``, the runs the sensors request, several scattered
  tables each;
- :mod:`.tables`: ``migrate_job`` and ``rollback_job``;
- :mod:`.orphans`: ``collect_orphans_job`` and ``delete_collected_orphans_job``.

May import: ``resources``, ``assets``, ``sensors`` and everything below the Dagster layer.
"""
