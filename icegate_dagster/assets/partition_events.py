"""What Dagster shows for one partition (table) of ``maintained_table``: the metadata of its
materialization and the evaluations of its checks, the same whoever records them: a
maintenance run, an ``icegate-maintain`` pass with a Dagster instance configured, or the
health sensor's assessment of a table no one maintained yet.

Every check evaluation names the materialization it judges (the partition's latest), so
the check's Partitions tab shows each table Passed or Failed: an evaluation that names no
materialization counts there only while the partition has none.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import dagster as dg

from icegate_dagster import render
from icegate_dagster.assets.names import MAINTAINED_TABLE, SOURCE_TAG
from icegate_dagster.config.secrets import scrub
from icegate_dagster.maintenance import OPERATIONS, TableRef, TableResult, TableStats
from icegate_dagster.maintenance.exclusion import NOT_EXCLUDED, Exclusion
from icegate_dagster.maintenance.health.after_pass import health_after
from icegate_dagster.maintenance.health.checks import (
    CheckOutcome,
    evaluate_health,
    failing_checks,
)
from icegate_dagster.maintenance.health.score import TableHealth
from icegate_dagster.maintenance.health.summary import table_state
from icegate_dagster.maintenance.sharing import Sharing
from icegate_dagster.maintenance.trigger.records import error_state, shown_state
from icegate_dagster.maintenance.wal import WalStats, configured_wal_root, wal_stats

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icegate_dagster.maintenance import Maintainer
    from icegate_dagster.maintenance.health.summary import Assessed

#: Every metadata key a partition of ``maintained_table`` may carry (a run's or a CLI pass's
#: materialization, the health sensor's assessment or observation), and what it says: the
#: Dagster reference of the documentation lists them from here, and a test holds the
#: functions below to it. ``<operation>`` stands for each operation of the pass.
PARTITION_METADATA: dict[str, str] = {
    "healthy": "the table's `healthy` verdict after the pass, or now on an observation",
    "health_score": "its health score, 0-100 (a float, so the Plots tab draws it)",
    "due_operations": "the operations due after the pass (`none`: nothing due)",
    "why": "each due operation's reason (markdown), or the verdict",
    "health_error": "why the table's health could not be assessed",
    "excluded": "why the table, or some of its operations, are not maintained here",
    "shares_location_with": "the tables whose location overlaps its own",
    "sharing_warning": "it shares its location without `gc.enabled=false`",
    "recorded_by": "who recorded a materialization outside a maintenance run: "
    "`icegate-maintain, run cli-...` for a CLI pass, `table_health_sensor, from Iceberg "
    "metadata: no maintenance ran` for an assessment",
    "files_before": "data files before the pass",
    "files_after": "data files after it",
    "bytes_before": "bytes of the data files before the pass",
    "bytes_after": "bytes of the data files after it",
    "snapshots_before": "snapshots before the pass",
    "snapshots_after": "snapshots after it",
    "rows_before": "live rows (what a reader sees) before the pass; absent where a table with "
    "delete files saw no commit (not counted: see the `rows_preserved` check)",
    "rows_after": "live rows after it",
    "records_before": "records in data files before the pass",
    "records_after": "records in data files after it",
    "delete_files_before": "delete files of every kind before the pass",
    "delete_files_after": "delete files of every kind after it",
    "small_files_after": "data files under `optimize.file_size_threshold` after the pass",
    "wal_files_ingested": "WAL files the pass ingested",
    "orphans_removed": "orphan files the pass removed",
    "wal_files_count": "WAL files left waiting after the run",
    "wal_size_bytes": "bytes of WAL left waiting after the run",
    "wal_files_quarantined": "WAL files in `_quarantine`",
    "wal_error": "the WAL folder could not be listed (the `wal_backlog` check fails with it)",
    "duration_s": "seconds the table's pass took",
    "ops_failed": "operations that failed",
    "ops_held_elsewhere": "operations skipped because another maintainer held the table (the "
    "work may still be due)",
    "<operation>_status": "each operation's outcome: `completed`, `failed` or `skipped`",
    "<operation>_duration_s": "seconds each operation took",
    "error": "the table's error, when the pass failed for the whole table",
    "tables_consulted": "the tables sharing the location whose references kept files from "
    "this pass's deletes",
    "ops": "a markdown table of the operations: status, time, data files, details",
    "ops_json": "the operations' outcomes and output, as JSON",
    "checks": "the checks' verdicts stored with the materialization, which a check executed "
    "on its own re-reports",
    "trigger": "what keeps failing or stays due for the health trigger: which operation, "
    "how many times in a row, the last error and the next attempt",
}


def partition_metadata(result: TableResult, wal: WalStats) -> dict[str, Any]:
    """The contract's metadata for one partition's materialization (the table's health after
    the pass apart: :func:`health_metadata`)."""
    before, after = result.before, result.after

    def number(stats: TableStats | None, name: str) -> int | None:
        value = getattr(stats, name) if stats is not None else None
        return int(value) if value is not None else None

    metadata: dict[str, Any] = {
        "files_before": number(before, "data_files"),
        "files_after": number(after, "data_files"),
        "bytes_before": number(before, "data_bytes"),
        "bytes_after": number(after, "data_bytes"),
        "snapshots_before": number(before, "snapshots"),
        "snapshots_after": number(after, "snapshots"),
        # Live rows (what a reader sees); absent where a table with delete files saw no
        # commit (not counted: see rows_preserved). Records in data files apart.
        "rows_before": number(before, "live_rows"),
        "rows_after": number(after, "live_rows"),
        "records_before": number(before, "rows"),
        "records_after": number(after, "rows"),
        "delete_files_before": number(before, "delete_files"),
        "delete_files_after": number(after, "delete_files"),
        "small_files_after": number(after, "small_files"),
        **{key: render.output_sum(result, key) for key in OPERATIONS.metadata_sums()},
        "wal_files_count": wal.files,
        "wal_size_bytes": wal.bytes,
        "wal_files_quarantined": wal.quarantined,
        "duration_s": round(result.duration_s, 3),
        "ops_failed": sum(1 for op in result.ops if op.status == "failed"),
        # Skipped because another maintainer held the table: the work may still be due.
        "ops_held_elsewhere": sum(1 for op in result.ops if op.output.get("held_elsewhere")),
    }
    metadata = {k: v for k, v in metadata.items() if v is not None}
    for op in result.ops:
        metadata[f"{op.operation}_status"] = op.status
        metadata[f"{op.operation}_duration_s"] = round(op.duration_s, 3)
    if result.error:
        metadata["error"] = result.error
    consulted = sorted({t for op in result.ops for t in op.output.get("tables_consulted") or ()})
    if consulted:  # tables sharing the location whose references kept files from deletion
        metadata["tables_consulted"] = ", ".join(consulted)
    metadata["ops"] = dg.MetadataValue.md(render.ops_markdown(result))
    metadata["ops_json"] = dg.MetadataValue.json([op.as_dict() for op in result.ops])
    return metadata


def health_metadata(health: Assessed | None, verdict: CheckOutcome) -> dict[str, Any]:
    """How healthy the table is: ``healthy`` (its ``healthy`` verdict), ``health_score`` (a
    float, so the Plots tab draws each table's score over time), ``due_operations`` and
    ``why`` (each due operation's reason, or the verdict). The same keys on a run's
    materialization and on the health sensor's observations, so a partition's page shows
    the newest of them first."""
    metadata: dict[str, Any] = {"healthy": dg.MetadataValue.bool(verdict.passed)}
    if health is not None:
        metadata["health_score"] = dg.MetadataValue.float(float(health.score))
        metadata["due_operations"] = dg.MetadataValue.text(
            ", ".join(health.due_operations) or "none"
        )
    if health is not None and health.due:
        rows = [[d.operation, d.reason] for d in health.due]
        metadata["why"] = dg.MetadataValue.md(
            render.markdown_table(["due operation", "reason"], rows)
        )
    else:
        metadata["why"] = dg.MetadataValue.text(verdict.description)
    return metadata


def verdicts_metadata(outcomes: list[CheckOutcome]) -> dg.MetadataValue:
    """The checks' verdicts as stored with a materialization (metadata ``checks``): what a
    check executed on its own re-reports, and what the health sensor compares with."""
    return dg.MetadataValue.json(
        {o.name: {"passed": o.passed, "description": o.description} for o in outcomes}
    )


@dataclass(frozen=True)
class TableRecord:
    """One table's materialization metadata and check verdicts after a pass."""

    metadata: dict[str, Any]
    outcomes: list[CheckOutcome]
    health: TableHealth | None
    #: The WAL folder could not be listed (its ``wal_backlog`` check fails with this).
    wal_error: str | None = None
    #: The table's state right after the pass (``summary.table_state``), when assessed.
    settled_state: str | None = None

    def shown(self) -> str:
        """What the partition page shows once this is recorded (``records.shown_state``)."""
        verdict = next(o for o in self.outcomes if o.name == "healthy")
        failing = failing_checks(self.outcomes)
        if self.health is None:
            return error_state(verdict.description, failing)
        return shown_state(
            verdict.passed, self.health.due_operations, self.health.excluded is not None, failing
        )

    def still_due(self) -> dict[str, str] | None:
        """The operations due right after the pass, with why (None: not assessed)."""
        return None if self.health is None else {d.operation: d.reason for d in self.health.due}


def exclusion_metadata(exclusion: Exclusion, sharing: Sharing | None) -> dict[str, Any]:
    """What a partition's page says of the table's exclusion and sharing: ``excluded`` (why
    it, or some of its operations, are not maintained here), ``shares_location_with`` (the
    tables whose location overlaps its own) and ``sharing_warning`` (when it shares its
    location without ``gc.enabled=false``). Empty for a table with neither."""
    metadata: dict[str, Any] = {}
    if exclusion.summary is not None:
        metadata["excluded"] = dg.MetadataValue.text(exclusion.summary)
    if sharing is not None and sharing.shared:
        metadata["shares_location_with"] = dg.MetadataValue.text(", ".join(sharing.overlapping))
    warning = sharing.warning() if sharing is not None else None
    if warning is not None:
        metadata["sharing_warning"] = dg.MetadataValue.text(warning)
    return metadata


def _standing(
    maintainer: Maintainer, ref: TableRef | None
) -> tuple[Table | None, Exclusion, Sharing | None]:
    """The table now, what it is excluded from and its sharing, as far as they can be read
    (what cannot be is left out here: its health check says why)."""
    if ref is None:
        return None, NOT_EXCLUDED, None
    try:
        table = maintainer.load(ref)
    except Exception:
        return None, NOT_EXCLUDED, None
    try:
        exclusion = maintainer.exclusion(ref, table)
    except Exception:  # a bad icegate.maintenance.enabled: its operations failed, naming it
        exclusion = NOT_EXCLUDED
    try:
        sharing: Sharing | None = maintainer.sharing(ref, table)
    except Exception:  # the catalog cannot be listed now: nothing to say of sharing
        sharing = None
    return table, exclusion, sharing


def table_record(maintainer: Maintainer, ref: TableRef | None, result: TableResult) -> TableRecord:
    """What a pass over one table records in Dagster: the contract's metadata, one verdict
    per check, and the table's health after the pass (pyiceberg, no JVM). A table whose WAL
    cannot be listed, or whose health cannot be assessed, fails that check alone; checks of
    operations the table is excluded from pass, saying so."""
    config = maintainer.config
    table, exclusion, sharing = _standing(maintainer, ref)
    wal_error: str | None = None
    try:
        wal = wal_stats(configured_wal_root(config), ref) if ref is not None else WalStats(0, 0)
    except Exception as exc:
        wal_error = scrub(
            f"cannot list the WAL of {result.table}: {type(exc).__name__}: {exc}", config
        )
        wal = WalStats(0, 0)
    outcomes = evaluate_health(result, config.for_table(result.table), wal, exclusion)
    if wal_error is not None:
        outcomes = [
            CheckOutcome("wal_backlog", False, wal_error, {"error": wal_error})
            if outcome.name == "wal_backlog"
            else outcome
            for outcome in outcomes
        ]
    health, health_check, location = health_after(
        maintainer, result.table, ref, wal if wal_error is None else None, table
    )
    outcomes.append(health_check)
    # The state the trigger compares with: the WAL as it sees it (none without wal.root).
    seen_wal = (wal.files, wal.bytes, wal.oldest) if config.wal_root else None
    settled = (
        table_state(location, seen_wal, health.due)
        if health is not None and wal_error is None
        else None
    )
    metadata = {
        **health_metadata(health, health_check),
        **exclusion_metadata(exclusion, sharing),
        **partition_metadata(result, wal),
    }
    if health is None:
        metadata["health_error"] = health_check.description
    if wal_error is not None:
        for name in ("wal_files_count", "wal_size_bytes", "wal_files_quarantined"):
            metadata.pop(name, None)  # unknown, not zero
        metadata["wal_error"] = wal_error
        metadata.setdefault("error", wal_error)
    metadata["checks"] = verdicts_metadata(outcomes)
    return TableRecord(metadata, outcomes, health, wal_error, settled)


# -- which materialization a check evaluation judges -----------------------------------------


def _target_type() -> Any:
    """The type of ``AssetCheckEvaluation``'s documented ``target_materialization_data``
    argument. Dagster 1.13 does not export it, so it is read from the public class's own
    annotations; None (evaluations name no materialization) if that ever changes."""
    try:
        hint = typing.get_type_hints(dg.AssetCheckEvaluation)["target_materialization_data"]
    except (KeyError, NameError, TypeError):
        return None
    return next((t for t in typing.get_args(hint) if t is not type(None)), None)


_TARGET = _target_type()


def check_target(record: dg.EventLogRecord | None) -> Any:
    """What an evaluation passes as ``target_materialization_data`` to judge ``record``'s
    materialization (None: no materialization, or the type is unavailable)."""
    if record is None or _TARGET is None:
        return None
    return _TARGET(storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp)


def latest_materialization(
    instance: dg.DagsterInstance, partition: str, run_id: str | None = None
) -> dg.EventLogRecord | None:
    """The partition's latest materialization, by anyone; with ``run_id``, that run's own
    latest one among the last few (another writer may have recorded the partition since)."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[partition]),
        limit=1 if run_id is None else 5,
    ).records
    if run_id is not None:
        return next((r for r in records if r.run_id == run_id), records[0] if records else None)
    return records[0] if records else None


def source_of(record: dg.EventLogRecord) -> str | None:
    """Who recorded a materialization outside a run (``cli``, ``assessment``), or None."""
    materialization = record.asset_materialization
    tags = materialization.tags if materialization is not None else None
    return (tags or {}).get(SOURCE_TAG)


def check_event(
    outcome: CheckOutcome, partition: str, target: Any = None
) -> dg.AssetCheckEvaluation:
    """One check's verdict on one partition, as a Dagster event judging ``target`` (see
    :func:`check_target`)."""
    metadata = {
        k: (dg.MetadataValue.json(v) if isinstance(v, list | dict) else v)
        for k, v in outcome.metadata.items()
    }
    metadata["summary"] = dg.MetadataValue.text(outcome.description)
    return dg.AssetCheckEvaluation(
        asset_key=MAINTAINED_TABLE,
        check_name=outcome.name,
        passed=outcome.passed,
        partition=partition,
        metadata=metadata,
        description=outcome.description,
        severity=dg.AssetCheckSeverity.ERROR
        if outcome.name in ("rows_preserved", "ops_succeeded")
        else dg.AssetCheckSeverity.WARN,
        target_materialization_data=target,
    )


def log_checks(context: dg.OpExecutionContext, key: str, outcomes: Sequence[CheckOutcome]) -> None:
    """One evaluation of each check on ``key``, judging its latest materialization (logged
    just before), so the check's Partitions tab shows the table Passed or Failed."""
    target = check_target(latest_materialization(context.instance, key, context.run.run_id))
    for outcome in outcomes:
        # Dagster 1.13 takes check evaluations here; its annotation leaves them out.
        context.log_event(check_event(outcome, key, target))  # type: ignore[arg-type]
