"""The exporter's metrics: every family, its labels and where its value comes from, rendered
from one :class:`~.snapshot.Snapshot` in Prometheus' text format with ``prometheus_client``.

Names: the seed's four keep their exact names (``wal_files_count``, ``wal_size_bytes``,
``compaction_duration_seconds``, ``snapshot_count``), so alerts written for IceGate's
Maintain service work unchanged; every other family starts with ``icegate_``. Units are in
the names (``_seconds``, ``_bytes``, ``_total`` for counters). Every per-table family has
the labels ``table`` (``namespace.table``) and ``namespace``; per-operation families add
``operation``, and ``icegate_operation_last_outcome`` ``outcome``.

A budget of series per table (:data:`SERIES_BUDGET`): by default only the series a shipped
alert rule (``deploy/prometheus``) or dashboard panel (``deploy/grafana``) reads are
rendered, 22 gauges a table (18 without ``wal.root``), ``compaction_duration_seconds``
for the compactions that did work (at most 2) and ``icegate_operation_consecutive_failures``
for each operation failing now (0 series while none fails): at most 25 a table with at
most one operation failing. The counters are summed by operation over the log's rows (of
every table, dropped ones included), and
``icegate_operation_due_tables`` counts the tables each operation is due on. With
``operation_detail`` (``serve --operation-detail``) every series is rendered per table
and operation as well: about 49 a table and 9 more per operation run on it.

A snapshot is rendered once, when it is taken (:func:`render`), and every scrape until the
next one serves those bytes: a scrape costs no work however many tables there are. The
values that depend on the moment (``..._seconds_since_...``, ``icegate_table_due_seconds``)
are as of the snapshot (``icegate_exporter_snapshot_timestamp_seconds``); the timestamps
beside them give exact ages in PromQL (``time() - ...``). A few figures about the exporter
itself are rendered at each scrape (:func:`render_live`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from icegate_dagster.maintenance.health.score import DUE_ORDER, WEIGHTS
from icegate_dagster.maintenance.health.summary import HealthSummary
from icegate_dagster.maintenance.log.totals import COMPACTIONS, OperationTotals
from icegate_dagster.maintenance.trigger.records import OUTCOMES
from icegate_dagster.monitoring.snapshot import SOURCES, Snapshot, TableFigures

TABLE_LABELS = ("table", "namespace")
OP_LABELS = ("table", "namespace", "operation")

#: Series per table the default rendering stays within (see the module docstring).
SERIES_BUDGET = 25

#: Operations whose log rows count files and bytes rewritten, and freed.
REWRITES = ("optimize", "rewrite_position_delete_files")
FREES = ("expire_snapshots", "remove_orphan_files")


@dataclass(frozen=True)
class TableGauge:
    """A gauge with one value per table (None: no sample for that table)."""

    name: str
    help: str
    value: Callable[[TableFigures, float], float | None]
    #: Rendered only with the operation detail (``serve --operation-detail``): no shipped
    #: alert rule or dashboard panel reads it.
    detail: bool = False
    #: Rendered only where ``wal.root`` is set (a WAL figure, or a threshold only WAL
    #: figures are compared with).
    wal: bool = False


def _health(t: TableFigures) -> HealthSummary | None:
    return t.look.health if t.look is not None else None


def _of_health(
    read: Callable[[HealthSummary], float],
) -> Callable[[TableFigures, float], float | None]:
    def value(t: TableFigures, now: float) -> float | None:
        health = _health(t)
        return read(health) if health is not None else None

    return value


def _figure(name: str) -> Callable[[TableFigures, float], float | None]:
    def value(t: TableFigures, now: float) -> float | None:
        health = _health(t)
        return float(health.figures()[name]) if health is not None else None

    return value


def _wal(attribute: str) -> Callable[[TableFigures, float], float | None]:
    def value(t: TableFigures, now: float) -> float | None:
        return float(getattr(t.wal, attribute)) if t.wal is not None else None

    return value


def _due_seconds(t: TableFigures, now: float) -> float | None:
    look = t.look
    if look is None or look.health is None:
        return None
    if not look.health.due or look.due_since is None:
        return 0.0
    return max(0.0, now - look.due_since)


def _wal_age(t: TableFigures, now: float) -> float | None:
    if t.wal is None:
        return None
    return max(0.0, now - t.wal.oldest_at) if t.wal.oldest_at else 0.0


#: The per-table gauges, in the order they are rendered.
TABLE_GAUGES: tuple[TableGauge, ...] = (
    TableGauge(
        "wal_files_count",
        "WAL files waiting to be ingested (the seed's name)",
        _wal("files"),
        wal=True,
    ),
    TableGauge(
        "wal_size_bytes",
        "Bytes of the WAL files waiting to be ingested (the seed's name)",
        _wal("bytes"),
        wal=True,
    ),
    TableGauge(
        "snapshot_count",
        "Snapshots in the table's metadata (the seed's name)",
        _figure("snapshots"),
    ),
    TableGauge(
        "icegate_table_health_score",
        "Health score, 100 = healthy (see docs/concepts/health.md)",
        _of_health(lambda h: h.score),
    ),
    TableGauge(
        "icegate_table_healthy",
        "1 when the table's healthy verdict passes (score at least its min_score, or excluded)",
        _of_health(lambda h: float(h.healthy)),
    ),
    TableGauge(
        "icegate_table_due_operations",
        "Operations due on the table now",
        _of_health(lambda h: float(len(h.due))),
    ),
    TableGauge(
        "icegate_table_due_seconds",
        "Seconds the table has been due without a break (0: nothing due)",
        _due_seconds,
        detail=True,
    ),
    TableGauge(
        "icegate_table_unmaintained_seconds",
        "Seconds the table has been due without a due operation doing its job (0: nothing due)",
        lambda t, now: t.unmaintained_s(now) if _health(t) is not None else None,
    ),
    TableGauge(
        "icegate_table_work_bytes",
        "Bytes the due operations would read and rewrite",
        _of_health(lambda h: float(h.work_bytes)),
        detail=True,
    ),
    TableGauge(
        "icegate_table_data_files", "Data files in the current snapshot", _figure("data_files")
    ),
    TableGauge(
        "icegate_table_data_bytes",
        "Bytes of the current snapshot's data files",
        _figure("data_bytes"),
    ),
    TableGauge(
        "icegate_table_rows", "Records in the current snapshot's data files", _figure("rows")
    ),
    TableGauge(
        "icegate_table_small_files",
        "Data files under optimize.file_size_threshold",
        _figure("small_files"),
    ),
    TableGauge(
        "icegate_table_delete_files",
        "Delete files (position, equality, deletion vectors) that apply",
        _figure("delete_files"),
    ),
    TableGauge(
        "icegate_table_manifests", "Manifests of the current snapshot", _figure("manifests")
    ),
    TableGauge(
        "icegate_table_expirable_snapshots",
        "Snapshots an expiry would remove now",
        _figure("expirable_snapshots"),
    ),
    TableGauge(
        "icegate_table_wal_quarantined_files",
        "WAL files set aside in _quarantine (they need a person)",
        _wal("quarantined"),
        wal=True,
    ),
    TableGauge(
        "icegate_table_wal_oldest_age_seconds",
        "Age of the oldest waiting WAL file (0: none waiting)",
        _wal_age,
        wal=True,
    ),
    TableGauge(
        "icegate_table_unreadable",
        "1 when the table's metadata could not be read at its last look",
        lambda t, now: float(t.look is not None and t.look.error is not None),
    ),
    TableGauge(
        "icegate_table_excluded",
        "1 when the table is excluded from maintenance (opt-out)",
        _of_health(lambda h: float(h.excluded is not None)),
        detail=True,
    ),
    TableGauge(
        "icegate_table_maintenance_in_progress",
        "1 while a maintainer holds the table's lease",
        lambda t, now: float(t.held_by is not None),
        detail=True,
    ),
    TableGauge(
        "icegate_table_look_timestamp_seconds",
        "When the table's health was last read from its metadata",
        lambda t, now: t.look.looked_at if t.look is not None else None,
        detail=True,
    ),
    TableGauge(
        "icegate_check_max_snapshots",
        "maintain.checks.max_snapshots for the table (the snapshot_count check's threshold)",
        lambda t, now: float(t.checks.max_snapshots),
    ),
    TableGauge(
        "icegate_check_max_wal_files",
        "maintain.checks.max_wal_files for the table (the wal_backlog check's threshold)",
        lambda t, now: float(t.checks.max_wal_files),
        wal=True,
    ),
    TableGauge(
        "icegate_check_max_wal_bytes",
        "maintain.checks.max_wal_bytes for the table (the wal_backlog check's threshold)",
        lambda t, now: float(t.checks.max_wal_bytes),
        wal=True,
    ),
    TableGauge(
        "icegate_check_max_compaction_duration_seconds",
        "maintain.checks.max_compaction_duration for the table",
        lambda t, now: t.checks.max_compaction_duration.total_seconds(),
    ),
    TableGauge(
        "icegate_health_min_score",
        "health.min_score for the table (its healthy check fails below)",
        lambda t, now: t.min_score,
        detail=True,
    ),
    TableGauge(
        "icegate_health_min_interval_seconds",
        "health.min_interval for the table (the health trigger maintains it at most this often)",
        lambda t, now: t.min_interval_s,
    ),
)

#: Counters summed from the log rows appended since the exporter started (Prometheus'
#: counters start at 0 with their process): family -> (help, operations it is kept for,
#: figure).
COUNTERS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("icegate_files_rewritten", "Files rewritten by compaction", REWRITES, "files_rewritten"),
    ("icegate_bytes_rewritten", "Bytes rewritten by compaction", REWRITES, "bytes_rewritten"),
    (
        "icegate_files_freed",
        "Files deleted by snapshot expiry and orphan removal",
        FREES,
        "files_freed",
    ),
    (
        "icegate_bytes_freed",
        "Bytes deleted by snapshot expiry (on the driver) and deferred orphan deletion",
        FREES,
        "bytes_freed",
    ),
)
#: Counters per table without an operation label: family -> (help, operation, figure).
TABLE_COUNTERS: tuple[tuple[str, str, str, str], ...] = (
    (
        "icegate_orphan_files_removed",
        "Orphan files removed",
        "remove_orphan_files",
        "orphans_removed",
    ),
    (
        "icegate_wal_rows_ingested",
        "Rows ingested from the WAL",
        "wal_compaction",
        "wal_rows_ingested",
    ),
    (
        "icegate_wal_files_ingested",
        "WAL files ingested",
        "wal_compaction",
        "wal_files_ingested",
    ),
)


def _labels(t: TableFigures, *more: str) -> list[str]:
    return [t.table, t.namespace, *more]


class SnapshotCollector(Collector):
    """Yields every family of one snapshot (see the module docstring): with
    ``operation_detail``, every series per table and operation; without (the default),
    only those a shipped alert rule or dashboard panel reads (see :data:`SERIES_BUDGET`)."""

    def __init__(self, snapshot: Snapshot, *, operation_detail: bool = False) -> None:
        self.snapshot = snapshot
        self.operation_detail = operation_detail

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot
        now = snapshot.taken_at
        tables = snapshot.tables
        for gauge in TABLE_GAUGES:
            if (gauge.wal and not snapshot.has_wal) or (gauge.detail and not self.operation_detail):
                continue
            family = GaugeMetricFamily(gauge.name, gauge.help, labels=TABLE_LABELS)
            for t in tables:
                value = gauge.value(t, now)
                if value is not None:
                    family.add_metric(_labels(t), value)
            yield family
        yield self._due_tables(tables)
        if self.operation_detail:
            yield from self._health_parts(tables)
            yield from self._operations(tables, now)
            yield from self._counters(tables)
        else:
            yield from self._failing_and_durations(tables)
            yield from self._lakehouse_counters()
        yield from self._exporter(snapshot)

    def _due_operations(self) -> tuple[str, ...]:
        return tuple(op for op in DUE_ORDER if op != "wal_compaction" or self.snapshot.has_wal)

    def _due_tables(self, tables: Sequence[TableFigures]) -> Metric:
        """Per operation, the tables it is due on (a few series whatever the tables)."""
        family = GaugeMetricFamily(
            "icegate_operation_due_tables",
            "Tables the operation is due on now",
            labels=("operation",),
        )
        counts = dict.fromkeys(self._due_operations(), 0)
        for t in tables:
            health = _health(t)
            if health is not None:
                for operation in health.due_operations:
                    if operation in counts:
                        counts[operation] += 1
        for operation, count in counts.items():
            family.add_metric([operation], float(count))
        return family

    def _failing_and_durations(self, tables: Sequence[TableFigures]) -> Iterator[Metric]:
        """The default's per-operation series: what the alert rules compare per operation
        (an operation's failures in a row, only while it fails; the last compaction's
        duration)."""
        failures = GaugeMetricFamily(
            "icegate_operation_consecutive_failures",
            "Failed or lost attempts of the operation in a row (0 after a success; without "
            "--operation-detail, only operations failing now)",
            labels=OP_LABELS,
        )
        for t in tables:
            for name, memory in sorted(t.operations.items()):
                if memory.failures > 0:
                    failures.add_metric(_labels(t, name), float(memory.failures))
        yield failures
        yield self._durations(tables)

    def _durations(self, tables: Sequence[TableFigures]) -> Metric:
        duration = GaugeMetricFamily(
            "compaction_duration_seconds",
            "Seconds the last WAL ingest (wal_compaction) or compaction (optimize) that did "
            "work took (the seed's name)",
            labels=OP_LABELS,
        )
        for t in tables:
            for name in COMPACTIONS:
                totals = t.totals.get(name)
                if totals is not None and totals.last_duration_ms is not None:
                    duration.add_metric(_labels(t, name), totals.last_duration_ms / 1000.0)
        return duration

    def _lakehouse_counters(self) -> Iterator[Metric]:
        """The default's counters: the per-table ones summed by operation (the dashboard
        sums them so) over every log row read since the start, tables dropped since
        included: a sum over the tables listed now would go down when one is dropped,
        which Prometheus reads as a reset (and ``increase()`` as a jump)."""
        log = self.snapshot.log
        every = log.totals if log is not None else {}
        by_operation: dict[str, list[OperationTotals]] = {}
        for (_, operation), totals in sorted(every.items()):
            by_operation.setdefault(operation, []).append(totals)
        for name, help_text, operations, figure in COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=("operation",))
            for operation in operations:
                total = sum(_sum(t, figure) for t in by_operation.get(operation, []))
                family.add_metric([operation], total)
            yield family
        for name, help_text, operation, figure in TABLE_COUNTERS:
            total = sum(_sum(t, figure) for t in by_operation.get(operation, []))
            yield CounterMetricFamily(name, help_text, value=total)
        summed = {
            operation: (
                sum(t.duration_ms for t in found) / 1000.0,
                float(sum(t.rows for t in found)),
                float(sum(t.failures for t in found)),
            )
            for operation, found in sorted(by_operation.items())
        }
        for index, (name, help_text) in enumerate(_RUN_COUNTERS):
            family = CounterMetricFamily(name, help_text, labels=("operation",))
            for operation, values in summed.items():
                family.add_metric([operation], values[index])
            yield family

    def _health_parts(self, tables: Sequence[TableFigures]) -> Iterator[Metric]:
        penalty = GaugeMetricFamily(
            "icegate_table_health_penalty",
            "Points the health score loses to each component (small_files, deletes, manifests, "
            "snapshots, wal)",
            labels=(*TABLE_LABELS, "component"),
        )
        due = GaugeMetricFamily(
            "icegate_table_operation_due",
            "1 when the operation is due on the table now",
            labels=OP_LABELS,
        )
        for t in tables:
            health = _health(t)
            if health is None:
                continue
            for component in WEIGHTS:
                penalty.add_metric(_labels(t, component), health.penalties.get(component, 0.0))
            due_now = set(health.due_operations)
            for operation in self._due_operations():
                due.add_metric(_labels(t, operation), float(operation in due_now))
        yield penalty
        yield due

    def _operations(self, tables: Sequence[TableFigures], now: float) -> Iterator[Metric]:
        attempt = GaugeMetricFamily(
            "icegate_operation_last_attempt_timestamp_seconds",
            "When the operation was last attempted on the table (any outcome)",
            labels=OP_LABELS,
        )
        success = GaugeMetricFamily(
            "icegate_operation_last_success_timestamp_seconds",
            "When the operation last succeeded on the table (completed, or nothing to do)",
            labels=OP_LABELS,
        )
        since_attempt = GaugeMetricFamily(
            "icegate_operation_seconds_since_last_attempt",
            "Seconds since the operation was last attempted, as of the snapshot",
            labels=OP_LABELS,
        )
        since_success = GaugeMetricFamily(
            "icegate_operation_seconds_since_last_success",
            "Seconds since the operation last succeeded, as of the snapshot",
            labels=OP_LABELS,
        )
        outcome = GaugeMetricFamily(
            "icegate_operation_last_outcome",
            "1 for the outcome of the operation's last attempt (completed, skipped, failed, "
            "held, lost, ineffective)",
            labels=(*OP_LABELS, "outcome"),
        )
        failures = GaugeMetricFamily(
            "icegate_operation_consecutive_failures",
            "Failed or lost attempts of the operation in a row (0 after a success)",
            labels=OP_LABELS,
        )
        for t in tables:
            for name, memory in sorted(t.operations.items()):
                labels = _labels(t, name)
                attempt.add_metric(labels, memory.attempted_at)
                since_attempt.add_metric(labels, max(0.0, now - memory.attempted_at))
                if memory.succeeded_at is not None:
                    success.add_metric(labels, memory.succeeded_at)
                    since_success.add_metric(labels, max(0.0, now - memory.succeeded_at))
                outcome.add_metric(
                    [*labels, memory.outcome if memory.outcome in OUTCOMES else "failed"], 1.0
                )
                failures.add_metric(labels, float(memory.failures))
        yield from (attempt, success, since_attempt, since_success, outcome, failures)
        yield self._durations(tables)

    def _counters(self, tables: Sequence[TableFigures]) -> Iterator[Metric]:
        for name, help_text, operations, figure in COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=OP_LABELS)
            for t in tables:
                for operation in operations:
                    family.add_metric(_labels(t, operation), _sum(t.totals.get(operation), figure))
            yield family
        for name, help_text, operation, figure in TABLE_COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=TABLE_LABELS)
            for t in tables:
                family.add_metric(_labels(t), _sum(t.totals.get(operation), figure))
            yield family
        seconds, runs, failed = (
            CounterMetricFamily(name, help_text, labels=OP_LABELS)
            for name, help_text in _RUN_COUNTERS
        )
        for t in tables:
            for operation, totals in sorted(t.totals.items()):
                labels = _labels(t, operation)
                seconds.add_metric(labels, totals.duration_ms / 1000.0)
                runs.add_metric(labels, float(totals.rows))
                failed.add_metric(labels, float(totals.failures))
        yield from (seconds, runs, failed)

    def _exporter(self, snapshot: Snapshot) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "icegate_dependency_up",
            "1 when the source could be read at the last refresh (catalog, lease_store, "
            "log_table, wal, dagster_instance, dagster_daemon)",
            labels=("dependency",),
        )
        for name in SOURCES:
            state = snapshot.sources.get(name)
            if state is not None:
                up.add_metric([name], float(state.ok))
        yield up
        daemons = GaugeMetricFamily(
            "icegate_dagster_daemon_heartbeat_age_seconds",
            "Seconds since the Dagster daemon's last heartbeat (required daemons; -1: never)",
            labels=("daemon",),
        )
        for beat in snapshot.daemons:
            if beat.required:
                daemons.add_metric([beat.daemon], beat.age_s if beat.age_s is not None else -1.0)
        yield daemons
        yield GaugeMetricFamily(
            "icegate_exporter_snapshot_timestamp_seconds",
            "When the figures of this scrape were gathered",
            value=snapshot.taken_at,
        )
        yield GaugeMetricFamily(
            "icegate_exporter_tables",
            "Tables the catalog lists for maintenance",
            value=float(len(snapshot.tables)),
        )
        yield GaugeMetricFamily(
            "icegate_exporter_tables_waiting",
            "Tables whose changed metadata the last refresh had no time to read (next one)",
            value=float(snapshot.waiting),
        )
        if snapshot.log is not None:
            yield CounterMetricFamily(
                "icegate_exporter_log_rows_read",
                "Maintenance log rows this process has read",
                value=float(snapshot.log.rows_read),
            )
            yield CounterMetricFamily(
                "icegate_exporter_log_full_reads",
                "Times this process read the maintenance log beyond its appended files (at its "
                "start, the last week of it; a log table made anew, in full)",
                value=float(snapshot.log.full_reads),
            )


#: Counters of every operation's log rows: family -> help.
_RUN_COUNTERS: tuple[tuple[str, str], ...] = (
    (
        "icegate_maintenance_run_seconds",
        "Seconds spent in the operation, summed over the maintenance log rows since the "
        "exporter started",
    ),
    (
        "icegate_maintenance_operations",
        "Log rows of the operation (one per attempt) since the exporter started",
    ),
    (
        "icegate_maintenance_failures",
        "Failed attempts of the operation (log rows with status failed) since the exporter started",
    ),
)


def _sum(totals: OperationTotals | None, figure: str) -> float:
    return float(totals.figures.get(figure, 0)) if totals is not None else 0.0


def render(snapshot: Snapshot, *, operation_detail: bool = False) -> bytes:
    """The snapshot in Prometheus' text format (see :class:`SnapshotCollector`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot, operation_detail=operation_detail))
    return generate_latest(registry)


@dataclass
class ExporterState:
    """What the exporter says of itself at each scrape."""

    taken_at: float | None
    refreshes: int
    refresh_errors: int
    #: Seconds the last successful refresh took, start to end: gathering, rendering and
    #: compressing the figures (None: none yet).
    refresh_s: float | None = None


def render_live(
    state: ExporterState, now: float | None = None, *, age_s: float | None = None
) -> bytes:
    """The few figures rendered at each scrape: the snapshot's age (``age_s`` where the
    caller measured it on one clock, else ``now`` minus its ``taken_at``), the last
    refresh's duration (rendering included, so it is known only once the figures are
    rendered) and the refresh counts."""
    moment = time.time() if now is None else now

    class _Live(Collector):
        def collect(self) -> Iterator[Metric]:
            if state.taken_at is not None:
                yield GaugeMetricFamily(
                    "icegate_exporter_snapshot_age_seconds",
                    "Seconds since the figures of this scrape were gathered",
                    value=age_s if age_s is not None else max(0.0, moment - state.taken_at),
                )
            if state.refresh_s is not None:
                yield GaugeMetricFamily(
                    "icegate_exporter_refresh_duration_seconds",
                    "Seconds the last refresh of the figures took, start to end: gathering, "
                    "rendering and compressing them",
                    value=state.refresh_s,
                )
            yield CounterMetricFamily(
                "icegate_exporter_refreshes",
                "Refreshes of the figures since the exporter started",
                value=float(state.refreshes),
            )
            yield CounterMetricFamily(
                "icegate_exporter_refresh_errors",
                "Refreshes that failed as a whole since the exporter started",
                value=float(state.refresh_errors),
            )

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Live())
    return generate_latest(registry)
