"""The exactly-once protocol of a WAL batch: stage on a branch, publish in one checked commit.

Spark writes the batch to a staging branch (created with Iceberg's SQL, so also on a
Spark Connect server). The publish is one pyiceberg catalog commit, made in this
process with no JVM: it appends the staged snapshot's data files to main, records the
batch and removes the branch, and it requires that main has not moved since the WAL
record was read (:func:`publish`). Only format-version 3 tables, whose snapshots
pyiceberg 0.12 cannot write, publish through Iceberg's Java API on the driver.

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

from icegate_dagster.catalog import PYICEBERG_MAX_FORMAT_VERSION
from icegate_dagster.errors import OperationError, describe_error
from icegate_dagster.maintenance.identifiers import TableRef, quote_identifier
from icegate_dagster.maintenance.leases.store import check_lease
from icegate_dagster.maintenance.wal.checkpoints import FaultHook, checkpoint
from icegate_dagster.maintenance.wal.files import WalFile, WalRoot, list_wal_files, wal_filesystem
from icegate_dagster.maintenance.wal.frame import batch_frame, require_nanos_as_long

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
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


# -- staging branches (Iceberg's SQL: also over Spark Connect, on every format version) --


def _change_branch(spark: SparkSession, statement: str) -> None:
    """Run one branch statement (``ALTER TABLE ... CREATE/DROP BRANCH``), retried when
    another writer committed in between (Iceberg's own retry of a reference change
    replays it on stale metadata and gives up); each attempt loads the table afresh."""
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    retrying = Retrying(
        stop=stop_after_attempt(PUBLISH_ATTEMPTS),
        wait=wait_exponential(multiplier=0.1, max=2.0),  # 0.1 s, 0.2 s, ... at most 2 s
        retry=retry_if_exception(lambda exc: "CommitFailedException" in describe_error(exc)),
        reraise=True,
    )
    for attempt in retrying:
        with attempt:
            spark.sql(statement)


def drop_branch(spark: SparkSession, identifier: str, table: Table, branch: str) -> None:
    """Remove ``branch`` if it exists; best effort, never raises. (Iceberg's SQL, not
    pyiceberg: pyiceberg 0.12 cannot write format-version 3 metadata.)"""
    with contextlib.suppress(Exception):  # best effort: a stale branch is removed later
        if branch in table.refresh().metadata.refs:
            name = quote_identifier(branch)
            _change_branch(spark, f"ALTER TABLE {identifier} DROP BRANCH IF EXISTS {name}")


def drop_stale_staging(
    table: Table, spark_provider: Callable[[], SparkSession], identifier: str
) -> int:
    """Remove staging branches left by runs that died before publishing; return how many.

    With pyiceberg (no JVM); a format-version 3 table, whose metadata pyiceberg cannot
    write, through Iceberg's SQL (``spark_provider`` is only called then)."""
    cutoff_ms = int((datetime.now(UTC) - STALE_STAGING).timestamp() * 1000)
    stale = []
    for name, snapshot_ref in table.metadata.refs.items():
        snapshot = table.snapshot_by_id(snapshot_ref.snapshot_id)
        if name.startswith(STAGING_PREFIX) and (
            snapshot is None or snapshot.timestamp_ms < cutoff_ms
        ):
            stale.append(name)
    if stale and table.format_version > PYICEBERG_MAX_FORMAT_VERSION:
        spark = spark_provider()
        for name in stale:
            branch = quote_identifier(name)
            _change_branch(spark, f"ALTER TABLE {identifier} DROP BRANCH IF EXISTS {branch}")
    elif stale:
        manage = table.manage_snapshots()
        for name in stale:
            manage = manage.remove_branch(name)
        manage.commit()
    return len(stale)


def stage_batch(
    spark: SparkSession,
    identifier: str,
    table: Table,
    good: list[GoodFile],
    branch: str,
    target_file_size: int,
) -> None:
    """Write the batch to the staging ``branch`` (created fresh): the main branch and its
    readers see nothing until :func:`publish` commits it.

    On a table with no snapshot yet, Iceberg branches from a new empty snapshot."""
    drop_branch(spark, identifier, table, branch)  # an earlier attempt of this run
    _change_branch(spark, f"ALTER TABLE {identifier} CREATE BRANCH {quote_identifier(branch)}")
    require_nanos_as_long(spark, any(g.nanos for g in good))
    (
        batch_frame(spark, identifier, good)
        .writeTo(f"{identifier}.{quote_identifier('branch_' + branch)}")
        .option("target-file-size-bytes", str(target_file_size))
        .append()
    )


# -- publishing ------------------------------------------------------------------

#: How pyiceberg (and Iceberg's Java metadata builder, behind a REST catalog) refuse a
#: snapshot whose sequence number another commit took since the table was read.
_SEQUENCE_TAKEN = "older than last sequence number"


class AlreadyCommitted(Exception):
    """Another ingester committed some of this batch's WAL files first."""

    def __init__(self, files: set[tuple[str, int, int]]) -> None:
        super().__init__(f"{len(files)} WAL files already committed")
        self.files = files


class _LostRace(Exception):
    """A publish commit another writer beat (``error`` is the commit's own): worth retrying."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _label(table: Table) -> str:
    return ".".join(table.name())


def _is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client (no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def require_publishable(spark: SparkSession, table: Table) -> None:
    """Raise, before anything is written, when this session cannot publish a batch of
    ``table``: a format-version 3 table needs Iceberg's Java API, which a Spark Connect
    client does not have in its process. Every WAL file then waits."""
    version = table.format_version
    if version > PYICEBERG_MAX_FORMAT_VERSION and _is_connect(spark):
        raise OperationError(
            f"WAL ingest into {_label(table)} (format-version {version}) needs Iceberg's Java "
            "API on the Spark driver: pyiceberg writes snapshots only up to format-version "
            f"{PYICEBERG_MAX_FORMAT_VERSION}, and this session is a Spark Connect client. "
            "Run the table's WAL compaction with a local Spark session (spark.remote unset); "
            "no file was touched: every WAL file waits"
        )


def staged_data_files(table: Table, branch: str) -> list[DataFile]:
    """The data files the staging ``branch``'s head snapshot added, as its manifests hold
    them (partition, metrics and bounds intact)."""
    from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus

    staged = table.snapshot_by_name(branch)
    if staged is None:
        raise OperationError(f"staging branch {branch} of {_label(table)} is gone")
    files = []
    for manifest in staged.manifests(table.io):
        if manifest.added_snapshot_id != staged.snapshot_id:
            continue
        if manifest.content != ManifestContent.DATA:
            raise OperationError(f"staging branch {branch} holds delete files: not a WAL batch")
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            added_here = entry.snapshot_id == staged.snapshot_id
            if entry.status == ManifestEntryStatus.ADDED and added_here:
                if entry.data_file.content != DataFileContent.DATA:
                    raise OperationError(f"staging branch {branch} holds delete files")
                files.append(entry.data_file)
    return files


def _commit_with_pyiceberg(
    table: Table, files: list[DataFile], summary: dict[str, str], ledger: str, branch: str
) -> None:
    """Append ``files`` to main, set the ledger and remove ``branch``: one catalog commit,
    refused unless main is still at the snapshot ``table`` holds (pyiceberg's
    ``AssertRefSnapshotId``). Raise :class:`_LostRace` when refused."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table.update.snapshot import ManageSnapshots

    default_spec = table.spec().spec_id
    moved = {f.spec_id for f in files} - {default_spec}
    if moved:  # a partition spec changed since staging: the manifest is written in one spec
        raise OperationError(
            f"the partition spec of {_label(table)} changed while the WAL batch was staged "
            f"(files in spec {sorted(moved)}, table now {default_spec}): run again"
        )
    transaction = table.transaction()
    append = transaction.update_snapshot(snapshot_properties=summary).fast_append()
    for data_file in files:
        append.append_data_file(data_file)
    # Staged, not committed through the producer: pyiceberg retries a producer's failed
    # commit by rebasing the append onto whatever another writer committed meanwhile,
    # which would skip the WAL-record check. Its requirement (main still at the snapshot
    # read here) goes first: a transaction keeps one requirement of each kind.
    transaction._stage(*append._commit())
    transaction.set_properties({LEDGER_PROPERTY: ledger})
    ManageSnapshots(transaction).remove_branch(branch).commit()
    try:
        transaction.commit_transaction()
    except Exception as exc:
        # Refused, nothing landed: a requirement no longer held or the catalog's swap
        # failed (another commit to main), or another commit on any branch (a staging
        # write) took the sequence number this snapshot was given.
        refused = isinstance(exc, CommitFailedException) or _SEQUENCE_TAKEN in str(exc)
        if not refused:
            raise  # the outcome may be unknown: the caller looks for the batch's snapshot
        append._clean_all_uncommitted()  # this attempt's manifests and manifest list
        raise _LostRace(exc) from exc


def _commit_with_java(
    spark: SparkSession,
    identifier: str,
    base_snapshot_id: int | None,
    branch: str,
    summary: dict[str, str],
    ledger: str,
) -> None:
    """The same commit through Iceberg's Java API on the driver (format-version 3 tables:
    it keeps row lineage). ``validateFromSnapshot`` + ``validateNoConflictingData`` make
    any data another writer added since ``base_snapshot_id`` fail it, also on Iceberg's
    internal retries."""
    from icegate_dagster.maintenance.iceberg_java import java_table

    jvm: Any = spark._jvm
    table_api = java_table(spark, identifier)
    staged = table_api.snapshot(branch)
    if staged is None:
        raise OperationError(f"staging branch {branch} of {identifier} is gone")
    iterator = staged.addedDataFiles(table_api.io()).iterator()
    transaction = table_api.newTransaction()
    append = transaction.newOverwrite()
    while iterator.hasNext():
        append.addFile(iterator.next())
    if base_snapshot_id is not None:
        append.validateFromSnapshot(base_snapshot_id)
    append.conflictDetectionFilter(jvm.org.apache.iceberg.expressions.Expressions.alwaysTrue())
    append.validateNoConflictingData()
    for key, value in summary.items():
        append.set(key, value)
    try:
        append.commit()
        transaction.updateProperties().set(LEDGER_PROPERTY, ledger).commit()
        transaction.manageSnapshots().removeBranch(branch).commit()
        transaction.commitTransaction()
    except Exception as exc:
        # Another writer committed first (Iceberg's validation, or a reference change it
        # could not replay); never when the commit's outcome is unknown.
        text = describe_error(exc)
        conflict = "ValidationException" in text or "CommitFailedException" in text
        if conflict and "CommitStateUnknown" not in text:
            raise _LostRace(exc) from exc
        raise


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
    The commit itself requires that main is still at exactly that state (pyiceberg's
    ``AssertRefSnapshotId``, checked by the catalog in the same compare-and-swap that
    commits): any commit another writer made to main in between refuses it, so a second
    ingester of the same files cannot slip in between the check and the commit, with or
    without locks. The refused attempt is retried from the check. Data (the staged
    snapshot's data files, appended with their statistics), the WAL record (snapshot
    summary and the ledger property) and the removal of the staging branch land in one
    atomic catalog commit. No JVM is reached, so this works over Spark Connect; only a
    format-version 3 table goes through Iceberg's Java API (:func:`require_publishable`).
    """
    from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

    batch = {g.file.identity for g in good}
    summary = {
        BATCH_PROPERTY: batch_id,
        FILES_PROPERTY: json.dumps(sorted(list(i) for i in batch), separators=(",", ":")),
    }
    with_java = table.refresh().format_version > PYICEBERG_MAX_FORMAT_VERSION
    files = [] if with_java else staged_data_files(table, branch)

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
        if with_java:
            base_id = base.snapshot_id if base is not None else None
            _commit_with_java(spark, identifier, base_id, branch, summary, ledger)
        else:
            _commit_with_pyiceberg(current, files, summary, ledger, branch)

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
    except _LostRace as lost:  # the last attempt lost too: raise the commit's own error
        raise lost.error from None
