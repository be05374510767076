"""WAL -> Iceberg compaction, exactly-once: one run, from the lock to the deletes.

One run takes the WAL files present when it starts (later arrivals wait for the
next run), reads them with Spark, writes them into the table in one append
(Iceberg's write distribution and ordering sort by the table's partition keys
and sort order, files near ``target_file_size``) and then deletes them. How the
append is made exactly once is in :mod:`~icegate_dagster.maintenance.wal.publish`;
the steps in between are the checkpoints of
:mod:`~icegate_dagster.maintenance.wal.checkpoints`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from icegate_dagster.config import CompactionSettings
from icegate_dagster.errors import OperationError
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.results import Outcome, Status
from icegate_dagster.maintenance.wal.checkpoints import FaultHook, checkpoint
from icegate_dagster.maintenance.wal.files import (
    WalFile,
    WalRoot,
    compaction_due,
    list_wal_files,
    quarantine,
    wal_filesystem,
)
from icegate_dagster.maintenance.wal.folder_lock import wal_folder_lock
from icegate_dagster.maintenance.wal.frame import (
    require_wal_filesystem,
    spark_failure,
    spark_problem,
)
from icegate_dagster.maintenance.wal.publish import (
    STAGING_PREFIX,
    AlreadyCommitted,
    delete_ingested,
    drop_branch,
    drop_stale_staging,
    find_batch_snapshot,
    publish,
    require_publishable,
    settle_committed,
    stage_batch,
)
from icegate_dagster.maintenance.wal.schema import GoodFile, inspect_files

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession


def compact_wal(
    spark_provider: Callable[[], SparkSession],
    catalog_name: str,
    ref: TableRef,
    table: Table,
    wal_root: WalRoot | None,
    settings: CompactionSettings,
    *,
    force: bool = False,
    fault_hook: FaultHook | None = None,
) -> Outcome:
    """Ingest the table's WAL files once, if they reach a threshold (or ``force``).

    ``spark_provider`` is only called when there is something to write, so a
    table below its thresholds never starts a JVM.
    """
    if wal_root is None:
        return Outcome.skip("no wal.root configured")
    with wal_folder_lock(wal_root, ref) as held_by:
        if held_by is not None:
            return Outcome.skip(
                f"another WAL compaction of {ref.key} is running (it holds {held_by}); "
                "its WAL is left to that run"
            )
        # Metadata read before the lock may predate a commit made by the lock's last holder.
        return _compact_locked(
            spark_provider,
            catalog_name,
            ref,
            table.refresh(),
            wal_root,
            settings,
            force,
            fault_hook,
        )


def _compact_locked(
    spark_provider: Callable[[], SparkSession],
    catalog_name: str,
    ref: TableRef,
    table: Table,
    wal_root: WalRoot,
    settings: CompactionSettings,
    force: bool,
    hook: FaultHook | None,
) -> Outcome:
    filesystem, _folder = wal_filesystem(wal_root, ref)
    # A crash between commit and delete leaves files a commit already holds.
    settled = settle_committed(table, wal_root, ref)
    identifier = ref.spark_identifier(catalog_name)
    if drop_stale_staging(table, spark_provider, identifier):
        table = table.refresh()
    pending = list_wal_files(wal_root, ref)
    output: dict[str, Any] = {
        "wal_files_ingested": 0,
        "rows_added": 0,
        "wal_files_recovered": settled,
        "quarantined": [],
    }
    recovered = f"; deleted {settled} WAL files an earlier commit already holds" if settled else ""
    pending_bytes = sum(f.size for f in pending)
    output.update(wal_files_pending=len(pending), wal_bytes_pending=pending_bytes)
    # Nothing to ingest: skipped, unless leftovers of an earlier commit were deleted.
    idle: Status = "completed" if settled else "skipped"
    if not pending:
        return Outcome(
            idle, f"no WAL files waiting in {wal_root.location(ref)}{recovered}", output
        )
    if not force and not compaction_due(len(pending), pending_bytes, settings):
        return Outcome(
            idle,
            f"WAL below thresholds: {len(pending)} files, {pending_bytes} bytes "
            f"(runs at {settings.min_files} files or {settings.min_size_bytes} bytes){recovered}",
            output,
        )

    inspected = inspect_files(filesystem, pending, table, full_read=False)
    quarantined = _quarantine_all(wal_root, ref, inspected.bad)
    checkpoint("before_write", hook)
    batch_id = uuid.uuid4().hex
    good = inspected.good
    if good:
        spark = spark_provider()
        require_wal_filesystem(spark, wal_root.hadoop_folder(ref))
        require_publishable(spark, table)
        good, unreadable = _write_batch(
            spark, identifier, filesystem, table, good, batch_id, settings
        )
        quarantined += _quarantine_all(wal_root, ref, unreadable)
        if good:
            try:
                branch = STAGING_PREFIX + batch_id
                publish(spark, identifier, table, wal_root, ref, branch, batch_id, good)
            except AlreadyCommitted as exc:
                # Another ingester got there first: append nothing, settle what it holds.
                drop_branch(spark, identifier, table, STAGING_PREFIX + batch_id)
                output["quarantined"] = quarantined
                output["wal_files_already_committed"] = len(exc.files)
                gone = settle_committed(table.refresh(), wal_root, ref)
                return Outcome.skip(
                    f"another ingester committed {len(exc.files)} of these {len(good)} WAL "
                    f"files first: appended nothing (no duplicate), deleted {gone} files it "
                    "holds; any others wait for the next run",
                    **output,
                )
            except Exception:
                if find_batch_snapshot(table, batch_id) is None:  # not committed: clean up
                    drop_branch(spark, identifier, table, STAGING_PREFIX + batch_id)
                    raise
    output["quarantined"] = quarantined
    if not good:
        return Outcome(
            "failed",
            f"nothing ingested: all {len(quarantined)} waiting WAL files were quarantined"
            f"{recovered}",
            output,
        )
    checkpoint("after_commit", hook)

    snapshot = find_batch_snapshot(table, batch_id)
    if snapshot is None:
        raise OperationError(f"the commit of WAL batch {batch_id} is not in the table's history")
    expected_rows = sum(g.rows for g in good)
    added = int(snapshot.summary.get("added-records", 0) if snapshot.summary else 0)
    if added != expected_rows:
        # Never reached in tests; if it is, keep the files out of reach of the settle step.
        reason = (
            f"batch {batch_id} (snapshot {snapshot.snapshot_id}) added {added} rows but its "
            f"files hold {expected_rows}: compare them with the snapshot before re-ingesting"
        )
        _quarantine_all(wal_root, ref, [(g.file, reason) for g in good])
        raise OperationError(f"WAL batch of {ref.key}: {reason}; its files are in quarantine")
    delete_ingested(filesystem, [g.file for g in good], hook)
    checkpoint("after_delete", hook)
    output.update(
        wal_files_ingested=len(good),
        rows_added=added,
        snapshot_id=snapshot.snapshot_id,
        batch_id=batch_id,
        data_files_added=int(snapshot.summary.get("added-data-files", 0)),
    )
    note = ""
    if quarantined:
        listed = "; ".join(f"{q['file']} ({q['reason']})" for q in quarantined)
        note = f"; quarantined {len(quarantined)}: {listed}"
    return Outcome.done(
        f"ingested {len(good)} WAL files ({added} rows) in snapshot {snapshot.snapshot_id}, "
        f"{output['data_files_added']} data files written{note}{recovered}",
        **output,
    )


def _quarantine_all(
    wal_root: WalRoot, ref: TableRef, bad: list[tuple[WalFile, str]]
) -> list[dict[str, str]]:
    moved = []
    for wal_file, reason in bad:
        target = quarantine(wal_root, ref, wal_file, reason)
        moved.append({"file": wal_file.name, "reason": reason, "moved_to": target})
    return moved


def _write_batch(
    spark: SparkSession,
    identifier: str,
    filesystem: Any,
    table: Table,
    good: list[GoodFile],
    batch_id: str,
    settings: CompactionSettings,
) -> tuple[list[GoodFile], list[tuple[WalFile, str]]]:
    """Stage ``good`` on the batch's branch; return what was staged and what could not be read.

    When the write fails, each file is read on its own (pyarrow, then Spark):
    the ones that fail are set aside and the rest is staged once more. A failure of Spark
    itself (its JVM killed, its context stopped) is never blamed on a file: the operation
    fails and every file waits for the next run. Nothing reaches the main branch here (see
    :func:`~icegate_dagster.maintenance.wal.publish.publish`).
    """
    branch = STAGING_PREFIX + batch_id
    try:
        stage_batch(spark, identifier, table, good, branch, settings.target_file_size)
        return good, []
    except Exception as exc:
        _spark_must_work(spark, exc)
        reread = inspect_files(filesystem, [g.file for g in good], table, full_read=True)
        unreadable = list(reread.bad)
        keep = []
        for item in reread.good:
            problem = spark_problem(spark, identifier, item)
            if problem:
                unreadable.append((item.file, problem))
            else:
                keep.append(item)
        if not unreadable:
            raise
        if len(unreadable) > len(reread.bad):  # Spark refused some: was it Spark's fault?
            _spark_must_work(spark, exc)
    if keep:
        stage_batch(spark, identifier, table, keep, branch, settings.target_file_size)
    else:
        drop_branch(spark, identifier, table, branch)
    return keep, unreadable


def _spark_must_work(spark: SparkSession, cause: Exception) -> None:
    """Raise when Spark itself is broken, so that no WAL file is quarantined for it."""
    failure = spark_failure(spark)
    if failure is not None:
        raise OperationError(
            f"Spark failed while staging the WAL batch and cannot run a query now ({failure}); "
            "no file was quarantined: every file waits for the next run"
        ) from cause
