"""Maintenance in the operators' own monitoring: ``icegate-maintain serve``, a long-running,
JVM-free exporter beside the Dagster daemon.

- :mod:`.snapshot`: one picture of the lakehouse from what already lasts (the catalog's
  metadata through the trigger's looks, the trigger's memory, the lease store, the
  maintenance log's totals, the WAL listing, the Dagster daemons' heartbeats);
- :mod:`.metrics`: the Prometheus families rendered from a snapshot (``prometheus_client``);
- :mod:`.probes`: ``/health``'s checks (catalog, lease store, Dagster instance and daemon,
  the figures' freshness);
- :mod:`.server`: the refresher thread and the HTTP endpoints (``/metrics``, ``/health``,
  ``/status/compaction``).

An entry point like the CLI and the sensors: it reads ``maintenance.trigger.look`` (the health
trigger's looks) and the maintenance layer; nothing imports it but the CLI. The alert rules
and the Grafana dashboard built on its metrics are in ``deploy/prometheus`` and
``deploy/grafana``.
"""
