"""The exactly-once protocol of a WAL batch: stage on a branch, publish in one validated commit.

Exactly-once rests on the commit itself: the append's snapshot summary records the
batch's file names and sizes (``icegate.wal-files``), and so does the table property
``icegate.wal-ledger``, in the same atomic commit. A run first looks for WAL files that
the table already holds, which only a crash between commit and delete can leave
behind, and deletes them without ingesting them again. A crash before the commit
leaves the WAL untouched (and at worst unreferenced data files, which orphan removal
collects), so the next run ingests it once.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from icegate_dagster.errors import OperationError, describe_error
from icegate_dagster.maintenance.iceberg_java import java_table
from icegate_dagster.maintenance.identifiers import TableRef, quote_identifier
from icegate_dagster.maintenance.leases.store import check_lease
from icegate_dagster.maintenance.wal.checkpoints import FaultHook, checkpoint
from icegate_dagster.maintenance.wal.files import WalFile, WalRoot, list_wal_files, wal_filesystem
from icegate_dagster.maintenance.wal.frame import batch_frame, require_nanos_as_long

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

    from icegate_dagster.maintenance.wal.schema import GoodFile

#: Snapshot summary keys written by every WAL commit.
BATCH_PROPERTY = "icegate.wal-batch"
FILES_PROPERTY = "icegate.wal-files"
#: Table property naming the WAL files committed but perhaps not yet deleted. Written in
#: the same atomic commit as the data, and kept in table metadata (not in a snapshot), so
#: an expiry run by any engine between a crash and the next run cannot remove it.
LEDGER_PROPERTY = "icegate.wal-ledger"
#: Staging branches: Spark writes a batch there, then one validated commit publishes it.
STAGING_PREFIX = "icegate_wal_"
#: A staging branch older than this belongs to a run that died before publishing.
STALE_STAGING = timedelta(hours=1)
#: Publish attempts when other writers keep committing first (each re-checks the WAL record).
PUBLISH_ATTEMPTS = 8


# -- the WAL record ------------------------------------------------------------


def _identities(text: str | None) -> set[tuple[str, int, int]]:
    if not text:
        return set()
    try:
        return {(str(n), int(size), int(ns)) for n, size, ns in json.loads(text)}
    except (ValueError, TypeError):  # not ours (or damaged): it records nothing we wrote
        return set()


def _main_ancestry(table: Table) -> Iterator[Any]:
    snapshot = table.current_snapshot()
    seen: set[int] = set()
    while snapshot is not None and snapshot.snapshot_id not in seen:
        seen.add(snapshot.snapshot_id)
        yield snapshot
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None


def committed_wal_files(table: Table) -> set[tuple[str, int, int]]:
    """``(name, size, mtime_ns)`` of every WAL file the table has committed and whose
    deletion may not have happened yet.

    Two records: the table property ``icegate.wal-ledger``, written in the same commit as
    the data (it survives snapshot expiry by any engine), and the snapshot summaries of
    the main branch's history (commits made before the ledger existed). The
    modification time tells a new file apart from an ingested one of the same name.
    """
    done = _identities(table.properties.get(LEDGER_PROPERTY))
    for snapshot in _main_ancestry(table):
        summary = snapshot.summary
        done |= _identities(summary.get(FILES_PROPERTY) if summary is not None else None)
    return done


def delete_ingested(filesystem: Any, files: list[WalFile], hook: FaultHook | None) -> int:
    """Delete WAL files whose rows the table holds; return how many (gone ones count).

    The ``mid_delete`` checkpoint falls after the first of several files.
    """
    check_lease()  # deleting WAL files: only while the table's lease is ours
    deleted = 0
    for wal_file in files:
        with contextlib.suppress(FileNotFoundError):
            filesystem.delete_file(wal_file.path)
        deleted += 1
        if deleted == 1 and len(files) > 1:
            checkpoint("mid_delete", hook)
    return deleted


def _leftovers(table: Table, wal_root: WalRoot | None, ref: TableRef) -> list[WalFile]:
    if wal_root is None:
        return []
    waiting = list_wal_files(wal_root, ref)
    if not waiting:
        return []
    committed = committed_wal_files(table)
    return [f for f in waiting if f.identity in committed]


def wal_files_to_settle(table: Table, wal_root: WalRoot | None, ref: TableRef) -> bool:
    """Whether WAL files a commit of ``table`` already holds are still in its folder (a
    plan: metadata and a listing, nothing deleted)."""
    return bool(_leftovers(table, wal_root, ref))


def settle_committed(table: Table, wal_root: WalRoot | None, ref: TableRef) -> int:
    """Delete the WAL files a snapshot of ``table`` already holds; return how many.

    Only a crash between a WAL commit and its deletes leaves such files. WAL ingest and
    snapshot expiry settle them first, so the record is never dropped while they remain.
    """
    leftovers = _leftovers(table, wal_root, ref)
    if not leftovers or wal_root is None:
        return 0
    filesystem, _folder = wal_filesystem(wal_root, ref)
    return delete_ingested(filesystem, leftovers, None)


def find_batch_snapshot(table: Table, batch_id: str) -> Any:
    """The snapshot that committed ``batch_id``, or None (the table is refreshed first)."""
    table = table.refresh()
    for snapshot in reversed(table.metadata.snapshots):
        if snapshot.summary is not None and snapshot.summary.get(BATCH_PROPERTY) == batch_id:
            return snapshot
    return None


# -- staging branches (Iceberg's Java API on the Spark driver) ------------------


def _manage_refs(spark: SparkSession, identifier: str, change: Callable[[Any], Any]) -> None:
    """Commit one branch change with Iceberg's ``manageSnapshots``, retried on a fresh table
    when another writer committed in between (Iceberg's own retry of a snapshot-reference
    change replays it on stale metadata and gives up)."""
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    retrying = Retrying(
        stop=stop_after_attempt(PUBLISH_ATTEMPTS),
        wait=wait_exponential(multiplier=0.1, max=2.0),  # 0.1 s, 0.2 s, ... at most 2 s
        retry=retry_if_exception(lambda exc: "CommitFailedException" in describe_error(exc)),
        reraise=True,
    )
    for attempt in retrying:
        with attempt:
            # The table is loaded again each attempt: the change applies to fresh metadata.
            change(java_table(spark, identifier).manageSnapshots()).commit()


def _java_list(iterable: Any) -> list[Any]:
    iterator = iterable.iterator()
    items = []
    while iterator.hasNext():
        items.append(iterator.next())
    return items


def drop_branch(spark: SparkSession, identifier: str, branch: str) -> None:
    """Remove ``branch`` if it exists; best effort, never raises."""
    with contextlib.suppress(Exception):  # best effort: a stale branch is removed later
        if java_table(spark, identifier).refs().containsKey(branch):
            _manage_refs(spark, identifier, lambda manage: manage.removeBranch(branch))


def drop_stale_staging(table: Table) -> int:
    """Remove staging branches left by runs that died before publishing; return how many."""
    cutoff_ms = int((datetime.now(UTC) - STALE_STAGING).timestamp() * 1000)
    stale = []
    for name, snapshot_ref in table.metadata.refs.items():
        snapshot = table.snapshot_by_id(snapshot_ref.snapshot_id)
        if name.startswith(STAGING_PREFIX) and (
            snapshot is None or snapshot.timestamp_ms < cutoff_ms
        ):
            stale.append(name)
    if stale:
        manage = table.manage_snapshots()
        for name in stale:
            manage = manage.remove_branch(name)
        manage.commit()
    return len(stale)


def stage_batch(
    spark: SparkSession,
    identifier: str,
    good: list[GoodFile],
    branch: str,
    target_file_size: int,
) -> None:
    """Write the batch to the staging ``branch`` (created fresh): the main branch and its
    readers see nothing until :func:`publish` commits it."""
    drop_branch(spark, identifier, branch)  # an earlier attempt of this run: start clean
    # On a table with no snapshot yet, Iceberg branches from a new empty snapshot.
    _manage_refs(spark, identifier, lambda manage: manage.createBranch(branch))
    require_nanos_as_long(spark, any(g.nanos for g in good))
    (
        batch_frame(spark, identifier, good)
        .writeTo(f"{identifier}.{quote_identifier('branch_' + branch)}")
        .option("target-file-size-bytes", str(target_file_size))
        .append()
    )


# -- publishing ------------------------------------------------------------------


class AlreadyCommitted(Exception):
    """Another ingester committed some of this batch's WAL files first."""

    def __init__(self, files: set[tuple[str, int, int]]) -> None:
        super().__init__(f"{len(files)} WAL files already committed")
        self.files = files


class _LostRace(Exception):
    """A publish commit another writer beat (``error`` is Iceberg's own): worth retrying."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _lost_race(exc: Exception) -> bool:
    """Another writer committed first (Iceberg's validation, or a reference change it could
    not replay); never when the commit's outcome is unknown."""
    text = describe_error(exc)
    conflict = "ValidationException" in text or "CommitFailedException" in text
    return conflict and "CommitStateUnknown" not in text


def publish(
    spark: SparkSession,
    identifier: str,
    table: Table,
    wal_root: WalRoot,
    ref: TableRef,
    branch: str,
    batch_id: str,
    good: list[GoodFile],
) -> None:
    """Commit the staged batch to the main branch exactly once, whatever else runs.

    Just before each commit attempt the table's current state is read, and the attempt is
    abandoned (:class:`AlreadyCommitted`) if any file of the batch is already recorded.
    The commit itself is validated by Iceberg against exactly that state: it fails if any
    data was added to the table since (``validateFromSnapshot`` +
    ``validateNoConflictingData`` on every internal retry), so a second ingester of the
    same files cannot slip in between the check and the commit, with or without locks.
    Data, the WAL record (snapshot summary and the ledger property) and the removal of the
    staging branch land in one atomic metadata commit.
    """
    from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

    jvm: Any = spark._jvm
    always_true = jvm.org.apache.iceberg.expressions.Expressions.alwaysTrue()
    batch = {g.file.identity for g in good}
    recorded = json.dumps(sorted(list(i) for i in batch), separators=(",", ":"))
    table_api = java_table(spark, identifier)
    staged = table_api.snapshot(branch)
    if staged is None:
        raise OperationError(f"WAL batch {batch_id}: staging branch {branch} is gone")
    files = _java_list(staged.addedDataFiles(table_api.io()))

    def attempt_commit() -> None:
        # Each attempt looks at the table again, the WAL record included.
        current = table.refresh()
        already = batch & committed_wal_files(current)
        if already:
            raise AlreadyCommitted(already)
        base = current.current_snapshot()
        # The ledger keeps what may still be waiting: this batch, and earlier entries whose
        # files are still in the WAL folder (a crash between commit and delete).
        present = {f.identity for f in list_wal_files(wal_root, ref)}
        earlier = _identities(current.properties.get(LEDGER_PROPERTY)) & present
        ledger = json.dumps(sorted(list(i) for i in batch | earlier), separators=(",", ":"))
        check_lease()  # commits only while the table's lease is ours
        table_api.refresh()
        transaction = table_api.newTransaction()
        append = transaction.newOverwrite()
        for data_file in files:
            append.addFile(data_file)
        if base is not None:
            append.validateFromSnapshot(base.snapshot_id)
        append.conflictDetectionFilter(always_true)
        append.validateNoConflictingData()
        append.set(BATCH_PROPERTY, batch_id)
        append.set(FILES_PROPERTY, recorded)
        try:
            append.commit()
            transaction.updateProperties().set(LEDGER_PROPERTY, ledger).commit()
            transaction.manageSnapshots().removeBranch(branch).commit()
            transaction.commitTransaction()
        except Exception as exc:
            if _lost_race(exc):
                raise _LostRace(exc) from exc
            raise

    # Only a lost race is retried: anything else raised by an attempt (AlreadyCommitted
    # included) ends the publish at once.
    retrying = Retrying(
        stop=stop_after_attempt(PUBLISH_ATTEMPTS),
        wait=wait_exponential(multiplier=0.2, max=4.0),  # 0.2 s, 0.4 s, ... at most 4 s
        retry=retry_if_exception_type(_LostRace),
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                attempt_commit()
    except _LostRace as lost:  # the last attempt lost too: raise Iceberg's own error
        raise lost.error from None
