"""The candidates table of deferred orphan deletion, and the rules for a candidate's fate.

Collecting records a table's orphan candidates (Iceberg's own dry-run list, stat'ed) as
``pending`` rows of an Iceberg table next to the maintenance log, where an operator can
query them and veto one by deleting its row. Deleting them later asks Iceberg again and
deletes only the candidates it still lists, unchanged since they were collected; every
other candidate is kept, and its row says why (``referenced``, ``gone``, ``younger``,
``changed``). The operations are in :mod:`~icegate_dagster.maintenance.ops.deferred_orphans`.

Resolved rows are history: those resolved longer ago than ``maintain.history.orphan_candidates``
are dropped when their table's rows are next rewritten (collecting or deleting); ``pending``
rows are never dropped by age.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from icegate_dagster.maintenance.discovery import normalize_location
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.orphans.listing import fs_path, table_filesystem
from icegate_dagster.maintenance.pyiceberg_writes import commit_attempts, create_table_once

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from icegate_dagster.config import IcegateConfig

#: A candidate's row: ``pending`` until deleting resolves it.
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

Rows = list[dict[str, Any]]


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
    return create_table_once(
        catalog,
        ref,
        candidates_schema(),
        partition_spec=spec,
        properties=_TABLE_PROPERTIES,
    )


def _table_filter(key: str) -> Any:
    from pyiceberg.expressions import EqualTo

    # pyiceberg's runtime signature is (term, literal); its pydantic stub hides that from mypy.
    return EqualTo("table_name", key)  # type: ignore[call-arg,arg-type]


def read_candidates(catalog: Catalog, ref: TableRef, table: str | None = None) -> Rows:
    """Rows of the candidates table ``ref`` (only ``table``'s when given), with pyiceberg;
    none when it does not exist yet."""
    from pyiceberg.expressions import AlwaysTrue

    if not catalog.table_exists(ref.identifier):
        return []
    row_filter = _table_filter(table) if table is not None else AlwaysTrue()
    rows: Rows = (
        catalog.load_table(ref.identifier).scan(row_filter=row_filter).to_arrow().to_pylist()
    )
    return rows


def resolved_cutoff(keep: timedelta | None, now: datetime) -> datetime | None:
    """Resolved rows resolved before this instant are dropped (None: kept forever)."""
    return None if keep is None else now - keep


def without_old_resolved(rows: Rows, cutoff: datetime | None) -> Rows:
    """``rows`` less the resolved ones whose ``resolved_at`` is before ``cutoff``; a
    ``pending`` row stays whatever its age, and so does a row with no ``resolved_at``."""
    if cutoff is None:
        return rows
    return [
        row
        for row in rows
        if row["status"] == "pending" or row["resolved_at"] is None or row["resolved_at"] >= cutoff
    ]


def rewrite_rows(
    catalog: Catalog,
    ref: TableRef,
    key: str,
    change: Callable[[Rows], Rows],
    resolved_before: datetime | None = None,
) -> None:
    """Replace table ``key``'s rows of the candidates table by ``change(rows)``, less the
    rows resolved before ``resolved_before`` (see :func:`without_old_resolved`), in one
    commit; re-read and redone when another writer committed first. The whole partition
    is rewritten, so it stays one file whatever the history."""
    import pyarrow as pa

    ensure_candidates_table(catalog, ref)
    for attempt in commit_attempts():
        with attempt:
            table = catalog.load_table(ref.identifier)
            old = table.scan(row_filter=_table_filter(key)).to_arrow().to_pylist()
            new = without_old_resolved(change(old), resolved_before)
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

    @classmethod
    def of_row(cls, row: dict[str, Any]) -> OrphanFile:
        """The candidate a row of the candidates table records."""
        return cls(row["path"], int(row["size_bytes"] or 0), row["modified_at"])

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


def stat_files(table: Table, paths: Sequence[str]) -> dict[str, OrphanFile | None]:
    """Size and modification time of each path, through the table's own FileIO settings;
    ``None`` for a path that no longer exists."""
    from pyarrow import fs

    if not paths:
        return {}
    filesystem, _root = table_filesystem(table)
    infos = filesystem.get_file_info([fs_path(p) for p in paths])
    found: dict[str, OrphanFile | None] = {}
    for path, info in zip(paths, infos, strict=True):
        if info.type != fs.FileType.File:
            found[path] = None
            continue
        # pyarrow gives microseconds, as the timestamptz column stores them: comparable.
        found[path] = OrphanFile(path, int(info.size or 0), info.mtime)
    return found


def pending_rows(
    key: str, candidates: Iterable[OrphanFile], collected_at: datetime, run_id: str, reason: str
) -> Rows:
    """The ``pending`` rows recording ``candidates`` of table ``key``."""
    return [
        {
            "table_name": key,
            "path": f.path,
            "size_bytes": f.size_bytes,
            "modified_at": f.modified_at,
            "age_s": int((collected_at - f.modified_at).total_seconds()) if f.modified_at else None,
            "collected_at": collected_at,
            "run_id": run_id,
            "status": "pending",
            "reason": reason,
            "resolved_at": None,
            "resolved_run_id": None,
        }
        for f in candidates
    ]


def triage(
    pending: list[OrphanFile],
    orphans_now: Iterable[str],
    now: dict[str, OrphanFile | None],
    floor: datetime,
    elsewhere: Callable[[str], str | None] = lambda path: None,
) -> tuple[list[OrphanFile], list[KeptFile]]:
    """Which collected candidates may go (listed again as orphans and unchanged), and which
    stay, with why. ``elsewhere`` names the table sharing the location that references a
    path, if any (such a path is left out of ``orphans_now``)."""
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
                owner = elsewhere(collected.path)
                kept.append(
                    KeptFile(
                        collected.path,
                        "referenced",
                        f"{owner}, which shares this table's location, references it"
                        if owner is not None
                        else "Iceberg no longer lists it as an orphan: the table references it",
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


def resolve_rows(
    rows: Rows,
    fate: dict[str, tuple[CandidateStatus, str]],
    collections: dict[str, str | None],
    resolved_at: datetime,
    run_id: str,
) -> Rows:
    """``rows`` with each triaged pending row given its fate (status, reason): only rows
    of the collection that was triaged (``collections``: path -> collecting run), so a
    collection committed meanwhile keeps its own pending rows. A fate of ``pending`` (a
    failed delete) keeps the row pending with the new reason."""
    new = []
    for row in rows:
        path = row["path"]
        triaged = path in fate and path in collections and row["run_id"] == collections[path]
        if row["status"] == "pending" and triaged:
            status, reason = fate[path]
            row = {**row, "status": status, "reason": reason}
            if status != "pending":
                row.update(resolved_at=resolved_at, resolved_run_id=run_id)
        new.append(row)
    return new
