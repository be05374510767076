"""Deferred orphan deletion: collect the candidates now, delete them later (as Nessie GC
splits "mark" from "sweep").

``collect`` asks Iceberg (``remove_orphan_files`` as a dry run, with the operation's own
refusals and floor) which files of a table's folder are unreferenced and old, stats them
(size, modification time) and records them as ``pending`` rows of an Iceberg table next to
the maintenance log, where an operator can query them, and veto one by deleting its row.

``delete_collected`` asks Iceberg again, under the table's lease, and deletes only the
pending candidates it still lists, unchanged since they were collected, one file at a
time; every other candidate is kept, and its row says why (``referenced``, ``gone``,
``younger``, ``changed``). The outcome is one ``remove_orphan_files`` row of the
maintenance log. A candidate whose delete fails stays ``pending`` and is retried next time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from icegate_dagster.catalog import scrub
from icegate_dagster.errors import IcegateError, describe_error
from icegate_dagster.maintenance.discovery import normalize_location
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.locks import check_lease
from icegate_dagster.maintenance.ops.remove_orphan_files import RemoveOrphanFiles
from icegate_dagster.maintenance.orphans import _fs_path, _table_filesystem
from icegate_dagster.maintenance.results import OpResult, Outcome, Status, TableResult

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from icegate_dagster.config import IcegateConfig
    from icegate_dagster.maintenance.maintainer import Maintainer

OPERATION = RemoveOrphanFiles.name

#: A candidate's row: ``pending`` until ``delete_collected`` resolves it.
CandidateStatus = Literal["pending", "deleted", "referenced", "gone", "younger", "changed"]
#: Why a collected candidate was not deleted.
KeptReason = Literal["referenced", "gone", "younger", "changed"]

#: The candidates table's columns, in order: (name, kind).
CANDIDATE_COLUMNS = (
    ("table_name", "string"),
    ("path", "string"),
    ("size_bytes", "long"),
    ("modified_at", "timestamptz"),
    ("age_s", "long"),
    ("collected_at", "timestamptz"),
    ("run_id", "string"),
    ("status", "string"),
    ("reason", "string"),
    ("resolved_at", "timestamptz"),
    ("resolved_run_id", "string"),
)
#: The candidates table keeps few metadata files: nobody time-travels it.
_TABLE_PROPERTIES = {
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "10",
}


def candidates_table(config: IcegateConfig) -> TableRef:
    """Where candidates are recorded: ``<log namespace>._orphan_candidates``, or
    ``<log namespace>.orphan_candidates`` when the log table's own name avoids a leading
    ``_`` (catalogs such as SeaweedFS and S3 Tables refuse such names)."""
    log = TableRef.parse(config.log_table)
    return TableRef(log.namespace, "_orphan_candidates" if log.is_internal else "orphan_candidates")


def candidates_schema() -> Schema:
    """The Iceberg schema of the candidates table."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

    kinds: dict[str, Any] = {
        "string": StringType(),
        "long": LongType(),
        "timestamptz": TimestamptzType(),
    }
    return Schema(
        *(
            NestedField(field_id, name, kinds[kind], required=False)
            for field_id, (name, kind) in enumerate(CANDIDATE_COLUMNS, start=1)
        )
    )


def ensure_candidates_table(catalog: Catalog, ref: TableRef) -> Table:
    """The candidates table, created (partitioned by ``table_name``) if missing. Another
    maintainer creating it at the same moment is fine."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    spec = PartitionSpec(
        PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(), name="table_name")
    )
    for _attempt in range(3):
        try:
            catalog.create_namespace_if_not_exists(ref.namespace)
            return catalog.create_table_if_not_exists(
                ref.identifier,
                schema=candidates_schema(),
                partition_spec=spec,
                properties=_TABLE_PROPERTIES,
            )
        except Exception:
            if catalog.table_exists(ref.identifier):
                return catalog.load_table(ref.identifier)
    return catalog.create_table_if_not_exists(
        ref.identifier,
        schema=candidates_schema(),
        partition_spec=spec,
        properties=_TABLE_PROPERTIES,
    )


def _table_filter(key: str) -> Any:
    from pyiceberg.expressions import EqualTo

    # pyiceberg's runtime signature is (term, literal); its pydantic stub hides that from mypy.
    return EqualTo("table_name", key)  # type: ignore[call-arg,arg-type]


def read_candidates(
    catalog: Catalog, ref: TableRef, table: str | None = None
) -> list[dict[str, Any]]:
    """Rows of the candidates table ``ref`` (only ``table``'s when given), with pyiceberg;
    none when it does not exist yet."""
    from pyiceberg.expressions import AlwaysTrue

    if not catalog.table_exists(ref.identifier):
        return []
    row_filter = _table_filter(table) if table is not None else AlwaysTrue()
    rows: list[dict[str, Any]] = (
        catalog.load_table(ref.identifier).scan(row_filter=row_filter).to_arrow().to_pylist()
    )
    return rows


def _rewrite_rows(
    catalog: Catalog,
    ref: TableRef,
    key: str,
    change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
) -> None:
    """Replace table ``key``'s rows of the candidates table by ``change(rows)``, in one
    commit; re-read and redone when another writer committed first. The whole partition
    is rewritten, so it stays one file whatever the history."""
    import pyarrow as pa
    from pyiceberg.exceptions import CommitFailedException
    from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

    ensure_candidates_table(catalog, ref)
    for attempt in Retrying(
        stop=stop_after_attempt(5),
        wait=wait_exponential(multiplier=0.2, max=4),
        retry=retry_if_exception_type(CommitFailedException),
        reraise=True,
    ):
        with attempt:
            table = catalog.load_table(ref.identifier)
            old = table.scan(row_filter=_table_filter(key)).to_arrow().to_pylist()
            new = change(old)
            if not old and not new:
                return
            frame = pa.Table.from_pylist(new, schema=table.schema().as_arrow())
            if old:
                table.overwrite(frame, overwrite_filter=_table_filter(key))
            else:
                table.append(frame)


@dataclass(frozen=True)
class OrphanFile:
    """One candidate: where, how big, last modified (``None`` where the store does not say)."""

    path: str
    size_bytes: int
    modified_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for JSON output and metadata."""
        modified = self.modified_at.isoformat() if self.modified_at else None
        return {"path": self.path, "size_bytes": self.size_bytes, "modified_at": modified}


@dataclass(frozen=True)
class KeptFile:
    """A collected candidate left in place, and why."""

    path: str
    reason: KeptReason
    detail: str

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for JSON output and metadata."""
        return {"path": self.path, "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True)
class FailedDelete:
    """A candidate that could not be deleted (it stays ``pending``)."""

    path: str
    error: str

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for JSON output and metadata."""
        return {"path": self.path, "error": self.error}


@dataclass
class CollectResult:
    """What ``collect`` recorded for one table."""

    table: str
    status: Status
    details: str
    candidates: list[OrphanFile] = field(default_factory=list)
    #: Earlier pending candidates of the table that this collection replaced.
    replaced: int = 0

    @property
    def ok(self) -> bool:
        """Completed or skipped: anything but a failure."""
        return self.status != "failed"

    @property
    def bytes(self) -> int:
        """Bytes of all candidates."""
        return sum(c.size_bytes for c in self.candidates)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for JSON output and metadata."""
        return {
            "table": self.table,
            "ok": self.ok,
            "status": self.status,
            "details": self.details,
            "candidates": [c.as_dict() for c in self.candidates],
            "candidate_bytes": self.bytes,
            "replaced": self.replaced,
        }


@dataclass
class DeleteResult:
    """What ``delete_collected`` did on one table."""

    table: str
    status: Status
    details: str
    deleted: list[OrphanFile] = field(default_factory=list)
    kept: list[KeptFile] = field(default_factory=list)
    failed: list[FailedDelete] = field(default_factory=list)
    #: A failure after the deletes (recording them), ``None`` when all went well.
    error: str | None = None

    @property
    def ok(self) -> bool:
        """No failure, no failed delete, everything recorded."""
        return self.status != "failed" and not self.failed and self.error is None

    @property
    def problem(self) -> str | None:
        """What went wrong, in one line; ``None`` when :attr:`ok`."""
        parts = [self.details] if self.status == "failed" else []
        if self.failed:
            failures = ", ".join(f"{f.path}: {f.error}" for f in self.failed)
            parts.append(f"{len(self.failed)} deletes failed ({failures})")
        if self.error is not None:
            parts.append(self.error)
        return "; ".join(parts) or None

    @property
    def bytes_deleted(self) -> int:
        """Bytes of the deleted files."""
        return sum(f.size_bytes for f in self.deleted)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for JSON output and metadata."""
        return {
            "table": self.table,
            "ok": self.ok,
            "status": self.status,
            "details": self.details,
            "deleted": [f.as_dict() for f in self.deleted],
            "bytes_deleted": self.bytes_deleted,
            "kept": [k.as_dict() for k in self.kept],
            "failed": [f.as_dict() for f in self.failed],
            "error": self.error,
        }


def _stat(table: Table, paths: Sequence[str]) -> dict[str, OrphanFile | None]:
    """Size and modification time of each path, through the table's own FileIO settings;
    ``None`` for a path that no longer exists."""
    from pyarrow import fs

    if not paths:
        return {}
    filesystem, _root = _table_filesystem(table)
    infos = filesystem.get_file_info([_fs_path(p) for p in paths])
    found: dict[str, OrphanFile | None] = {}
    for path, info in zip(paths, infos, strict=True):
        if info.type != fs.FileType.File:
            found[path] = None
            continue
        # pyarrow gives microseconds, as the timestamptz column stores them: comparable.
        found[path] = OrphanFile(path, int(info.size or 0), info.mtime)
    return found


def _iceberg_orphans(maintainer: Maintainer, ref: TableRef) -> tuple[list[str] | None, OpResult]:
    """Iceberg's own list of the table's orphans older than the floor (the operation as a
    dry run: its refusals, ``gc.enabled`` gate and floor), or ``None`` when it was not
    asked (the operation failed, or was skipped for a reason other than "none")."""
    result = maintainer.run_op(ref, OPERATION, dry_run=True)
    if result.status == "failed" or "orphan_files" not in result.output:
        return None, result
    return list(result.output["orphan_files"]), result


def _age_floor(maintainer: Maintainer, ref: TableRef) -> datetime:
    return datetime.now(UTC) - maintainer.settings(ref).remove_orphan_files.retention_threshold


def collect_table(maintainer: Maintainer, ref: TableRef) -> CollectResult:
    """Record ``ref``'s orphan candidates as Iceberg lists them now, replacing its earlier
    pending ones (its resolved rows are kept as history). Changes no file."""
    floor = _age_floor(maintainer, ref)
    try:
        paths, asked = _iceberg_orphans(maintainer, ref)
        if paths is None:
            return CollectResult(ref.key, asked.status, asked.details)
        stats = _stat(maintainer.load(ref), paths)
        candidates = [f for f in (stats[p] for p in paths) if f is not None]
        collected_at = datetime.now(UTC)
        rows = [
            {
                "table_name": ref.key,
                "path": f.path,
                "size_bytes": f.size_bytes,
                "modified_at": f.modified_at,
                "age_s": int((collected_at - f.modified_at).total_seconds())
                if f.modified_at
                else None,
                "collected_at": collected_at,
                "run_id": maintainer.run_id,
                "status": "pending",
                "reason": f"unreferenced and older than {floor:%Y-%m-%d %H:%M:%S} UTC",
                "resolved_at": None,
                "resolved_run_id": None,
            }
            for f in candidates
        ]
        replaced = 0

        def replace(old: list[dict[str, Any]]) -> list[dict[str, Any]]:
            nonlocal replaced
            kept = [r for r in old if r["status"] != "pending"]
            replaced = len(old) - len(kept)
            return kept + rows

        target = candidates_table(maintainer.config)
        _rewrite_rows(maintainer.catalog, target, ref.key, replace)
    except Exception as exc:
        return CollectResult(ref.key, "failed", _describe(maintainer, exc))
    size = sum(f.size_bytes for f in candidates)
    return CollectResult(
        ref.key,
        "completed",
        f"collected {len(candidates)} orphan candidates ({size} bytes) older than "
        f"{floor:%Y-%m-%d %H:%M:%S} UTC into {target.key}"
        + (f"; replaced {replaced} earlier pending" if replaced else ""),
        candidates,
        replaced,
    )


def _describe(maintainer: Maintainer, exc: BaseException) -> str:
    return describe_error(exc, lambda text: scrub(text, maintainer.config))


def _candidate(row: dict[str, Any]) -> OrphanFile:
    return OrphanFile(row["path"], int(row["size_bytes"] or 0), row["modified_at"])


def _triage(
    pending: list[OrphanFile],
    orphans_now: Iterable[str],
    now: dict[str, OrphanFile | None],
    floor: datetime,
) -> tuple[list[OrphanFile], list[KeptFile]]:
    """Which collected candidates may go (Iceberg lists them again and they are unchanged),
    and which stay, with why."""
    listed = {normalize_location(p) for p in orphans_now}
    go: list[OrphanFile] = []
    kept: list[KeptFile] = []
    for collected in pending:
        current = now.get(collected.path)
        if current is None:
            kept.append(KeptFile(collected.path, "gone", "no longer exists"))
        elif normalize_location(collected.path) not in listed:
            if current.modified_at is None or current.modified_at >= floor:
                kept.append(
                    KeptFile(
                        collected.path,
                        "younger",
                        f"modified {current.modified_at:%Y-%m-%d %H:%M:%S} UTC, after the "
                        f"floor {floor:%Y-%m-%d %H:%M:%S} UTC"
                        if current.modified_at
                        else "its modification time is unknown",
                    )
                )
            else:
                kept.append(
                    KeptFile(
                        collected.path,
                        "referenced",
                        "Iceberg no longer lists it as an orphan: the table references it",
                    )
                )
        elif (current.size_bytes, current.modified_at) != (
            collected.size_bytes,
            collected.modified_at,
        ):
            kept.append(
                KeptFile(
                    collected.path,
                    "changed",
                    f"size or modification time differs from when it was collected "
                    f"({collected.size_bytes} -> {current.size_bytes} bytes)",
                )
            )
        else:
            go.append(collected)
    return go, kept


def delete_collected_table(maintainer: Maintainer, ref: TableRef) -> DeleteResult:
    """Delete ``ref``'s pending candidates that Iceberg still lists as orphans older than
    the floor and that are unchanged, under the table's lease, one file at a time through
    its FileIO; record every candidate's fate and one maintenance-log row."""
    started = time.monotonic()
    target = candidates_table(maintainer.config)
    result = _delete_collected(maintainer, ref, target)
    try:
        before = maintainer.stats(ref)
    except Exception:
        before = None
    details = f"{result.details}; {result.error}" if result.error else result.details
    outcome = Outcome(
        result.status if result.ok else "failed",
        details,
        {
            "deferred": True,
            "orphans_removed": len(result.deleted),
            "bytes_removed": result.bytes_deleted,
            "orphan_files": [f.path for f in result.deleted],
            "kept": [k.as_dict() for k in result.kept],
            "failed": [f.as_dict() for f in result.failed],
        },
    )
    op = OpResult.of(ref.key, OPERATION, outcome, (before, before), time.monotonic() - started)
    logged = TableResult.from_ops(ref.key, before, [op], op.duration_s)
    maintainer.write_logs([logged])
    if logged.error is not None:
        result.error = f"{result.error}; {logged.error}" if result.error else logged.error
    return result


def _delete_collected(maintainer: Maintainer, ref: TableRef, target: TableRef) -> DeleteResult:
    try:
        rows = read_candidates(maintainer.catalog, target, ref.key)
    except Exception as exc:
        return DeleteResult(
            ref.key, "failed", f"cannot read {target.key}: {_describe(maintainer, exc)}"
        )
    pending_rows = [r for r in rows if r["status"] == "pending"]
    pending = [_candidate(r) for r in pending_rows]
    if not pending:
        return DeleteResult(
            ref.key,
            "skipped",
            f"no pending orphan candidates of {ref.key} in {target.key}: collect them first",
        )
    try:
        with maintainer.leasing.hold(ref.key) as held:
            if held.elsewhere is not None:
                return DeleteResult(ref.key, held.elsewhere.status, held.elsewhere.details)
            # Taken before Iceberg's own (a moment later): a file it leaves out although
            # older than this floor is left out because the table references it.
            floor = _age_floor(maintainer, ref)
            orphans, asked = _iceberg_orphans(maintainer, ref)
            if orphans is None:
                return DeleteResult(
                    ref.key,
                    asked.status,
                    f"Iceberg was not asked again, so no collected candidate was deleted "
                    f"({len(pending)} stay pending): {asked.details}",
                )
            table = maintainer.load(ref)
            go, kept = _triage(pending, orphans, _stat(table, [c.path for c in pending]), floor)
            deleted: list[OrphanFile] = []
            failed: list[FailedDelete] = []
            for candidate in go:
                try:
                    check_lease()  # nothing is deleted once the lease is lost
                    table.io.delete(candidate.path)
                    deleted.append(candidate)
                except Exception as exc:
                    failed.append(FailedDelete(candidate.path, _describe(maintainer, exc)))
    except Exception as exc:
        return DeleteResult(ref.key, "failed", _describe(maintainer, exc))
    result = DeleteResult(
        ref.key,
        "completed",
        f"deleted {len(deleted)} of {len(pending)} collected orphan candidates "
        f"({sum(f.size_bytes for f in deleted)} bytes)"
        + _kept_summary(kept)
        + (f"; {len(failed)} deletes failed (still pending)" if failed else ""),
        deleted,
        kept,
        failed,
    )
    try:
        collections = {r["path"]: r["run_id"] for r in pending_rows}
        _record(maintainer, target, ref.key, result, collections)
    except Exception as exc:
        result.error = f"cannot record the outcome in {target.key}: {_describe(maintainer, exc)}"
    return result


def _kept_summary(kept: list[KeptFile]) -> str:
    if not kept:
        return ""
    counts: dict[str, int] = {}
    for k in kept:
        counts[k.reason] = counts.get(k.reason, 0) + 1
    return "; kept " + ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))


def _record(
    maintainer: Maintainer,
    target: TableRef,
    key: str,
    result: DeleteResult,
    collections: dict[str, str | None],
) -> None:
    """Resolve the table's pending rows: deleted, kept (with why); failed deletes stay
    pending with the error as their reason. Only the rows that were triaged are touched
    (``collections``: path -> collecting run): a collection committed meanwhile keeps its
    own pending rows."""
    resolved_at = datetime.now(UTC)
    fate: dict[str, tuple[str, str]] = {f.path: ("deleted", "deleted") for f in result.deleted}
    fate.update({k.path: (k.reason, k.detail) for k in result.kept})
    fate.update({f.path: ("pending", f"delete failed: {f.error}") for f in result.failed})

    def resolve(old: list[dict[str, Any]]) -> list[dict[str, Any]]:
        new = []
        for row in old:
            path = row["path"]
            triaged = path in fate and path in collections and row["run_id"] == collections[path]
            if row["status"] == "pending" and triaged:
                status, reason = fate[path]
                row = {**row, "status": status, "reason": reason}
                if status != "pending":
                    row.update(resolved_at=resolved_at, resolved_run_id=maintainer.run_id)
            new.append(row)
        return new

    _rewrite_rows(maintainer.catalog, target, key, resolve)


def _each(
    maintainer: Maintainer,
    names: Sequence[str] | None,
    run: Callable[[TableRef], Any],
    unresolved: Callable[[str, str], Any],
) -> list[Any]:
    """``run`` on each named table (every discovered table when none is named); a name
    that does not resolve gets ``unresolved(name, why)``."""
    if not names:
        return [run(ref) for ref in maintainer.discover()]
    results = []
    for name in dict.fromkeys(names):
        try:
            ref = maintainer.resolve(name)
        except IcegateError as exc:
            results.append(unresolved(name, str(exc)))
            continue
        results.append(run(ref))
    return results


def collect(maintainer: Maintainer, names: Sequence[str] | None = None) -> list[CollectResult]:
    """:func:`collect_table` on each named table, or on every discovered table."""
    results: list[CollectResult] = _each(
        maintainer,
        names,
        lambda ref: collect_table(maintainer, ref),
        lambda name, why: CollectResult(name, "failed", why),
    )
    return results


def delete_collected(
    maintainer: Maintainer, names: Sequence[str] | None = None
) -> list[DeleteResult]:
    """:func:`delete_collected_table` on each named table, or on every discovered table.
    A named table that does not exist fails, with a ``failed`` log row as every operation."""

    def unresolved(name: str, why: str) -> DeleteResult:
        try:
            key = TableRef.parse(name).key
        except IcegateError:  # not a table name at all: nothing to log
            return DeleteResult(name, "failed", why)
        maintainer.write_logs([TableResult.failed(key, why, [OPERATION])])
        return DeleteResult(key, "failed", why)

    results: list[DeleteResult] = _each(
        maintainer, names, lambda ref: delete_collected_table(maintainer, ref), unresolved
    )
    return results
