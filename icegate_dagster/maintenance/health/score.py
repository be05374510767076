"""A table's health from its metadata alone (pyiceberg, no JVM): a score from 0 to 100,
and which operations are due and why.

**Figures** (:func:`collect_metrics`): the walk over the manifests of the current
snapshot that the table's stats read too (:mod:`~icegate_dagster.maintenance.health.manifest_walk`,
cached once per metadata file) gives data files, bytes and rows per partition, the small
files (under ``optimize.file_size_threshold``) per partition, the delete files by kind
(position files, deletion vectors, equality files) with the rows they delete, and
the manifests (small: under 3/4 of the table's ``commit.manifest.target-size-bytes``,
8 MB by default). The snapshot list gives the snapshot count, how many an expiry now
would remove, the oldest snapshot and the newest rewrite (``replace``); the WAL folder's
:class:`~icegate_dagster.maintenance.wal.WalStats`, when passed, its backlog.

A delete file is *dangling* when it can no longer apply to any data file (the rules are
the walk's: a file-scoped position delete whose data file is gone; else Iceberg's
``RemoveDanglingDeleteFiles`` rule by data sequence number, an equality delete file of
an unpartitioned spec applying table-wide). Dangling files are counted in their kinds
but delete nothing: ``deleted_rows``, the score and ``optimize``'s due rule count only
the live ones. The data files a rewrite would pick for their deletes are counted as
Iceberg's planner picks them (``optimize.delete_file_threshold`` file-scoped deletes on
a file, or ``delete_ratio_threshold`` of its rows), each live delete file that names no
data file counting as one, as ``optimize``'s plan counts them.

**Score** (:func:`assess`): 100 is healthy; each component loses up to its weight,
``weight x pressure`` with the pressure in [0, 1]; the score is 100 minus the points
lost, rounded to 0.1. A pressure reaches 1 where the figure reaches the threshold that
makes the component's operation due, so a table with something due has lost points.

============  ======  ==================================================================
component     weight  pressure
============  ======  ==================================================================
small_files   40      over the *fragmented* partitions (2 small files or more), the mean
                      of ``min(1, (s - 1) / (health.small_files - 1))`` weighted by each
                      one's small files ``s``. A partition with at most one small file is
                      left out: no rewrite can improve it, and leaving it out keeps the
                      one fragmented partition of a day-partitioned table from being
                      averaged away by a year of compacted days (as Amoro's per-partition
                      mean would). The table's size does not matter: a tiny table with
                      one file per partition scores 100 (Gravitino's mean squared
                      shortfall from the target size would compact it again and again).
deletes       30      the larger of the live deleted rows' share of all rows, over
                      ``optimize.delete_ratio_threshold`` (where Iceberg rewrites a file),
                      and the live delete files per data file, ``(position files +
                      deletion vectors + 4 x equality files) / data files``: an equality
                      file applies to every older data file of its partition and is
                      joined on read, a position file or vector to a file or a few.
manifests     10      the larger of ``(manifests - 1) / (health.manifests - 1)`` and
                      ``(small manifests - 1) / (health.small_manifests - 1)``.
snapshots     10      the larger of the expirable snapshots' share of all snapshots and
                      ``(snapshots - 1) / (checks.max_snapshots - 1)``.
wal           10      the larger of the WAL's files over ``compaction.min_files`` and its
                      bytes over ``compaction.min_size_bytes`` (0 without a WAL).
============  ======  ==================================================================

Every pressure is capped at 1. Time since the last rewrite is reported, not scored: a
compacted idle table stays healthy however long nobody touches it.

**Due operations**, in pass order, each with a reason naming the figure and the threshold:

- ``wal_compaction``: the WAL reached ``compaction.min_files`` or ``min_size_bytes``
  (tables with a WAL only);
- ``optimize``: a partition holds ``max(health.small_files, optimize.min_input_files)``
  small files (below ``min_input_files`` the rewrite would pick nothing), or the live
  delete files reach ``health.delete_files`` and the rewrite would pick a data file for
  them;
- ``rewrite_position_delete_files``: position delete files (not deletion vectors) reach
  ``health.delete_files`` and one partition holds
  ``max(health.delete_files, rewrite_position_delete_files.min_input_files)`` of them,
  or ``health.delete_files`` position delete files are dangling (the operation drops them);
- ``rewrite_manifests``: manifests reach ``health.manifests``, or small manifests of the
  current partition spec ``health.small_manifests``, and a rewrite would remove at least
  half that threshold (it leaves other specs' manifests, as the Spark procedure does, and
  about one per ``commit.manifest.target-size-bytes`` of the rest): a large table's
  manifests that are already at their target size are no reason to run again; never on
  a table that keeps row lineage (format version 3: the operation is skipped there, see
  :func:`~icegate_dagster.maintenance.ops.rewrite_manifests.row_lineage_reason`), though
  its manifests still weigh in the score;
- ``expire_snapshots``: ``health.expirable_snapshots`` snapshots, and a tenth of the
  table's, can expire (a steady writer always has one just past retention: it must not
  get a run every interval), and never where ``gc.enabled=false`` (the operation is
  skipped there).

An operation the table is excluded from (:mod:`~icegate_dagster.maintenance.exclusion`:
``icegate.maintenance.enabled=false``, the config's ``enabled: false``, rewrites left to
Apache Amoro) is never due: it is listed as *withheld*, and a wholly excluded table's
``state`` is ``excluded``, not ``healthy``. Its score is still computed, but the
``healthy`` check judges :attr:`TableHealth.judged_score`, which leaves out the points of
components only excluded operations would improve.

``retention`` and ``remove_orphan_files`` are never due from metadata: one needs a data
read to know whether any row is past its TTL, the other a listing of the table's folder.
The daily schedule runs them. Each rule asks for no less than the operation's own plan
needs to find work, so that a trigger acting on ``due`` does not request a run that
would change nothing, again and again.

``work_bytes`` estimates what the due operations read and rewrite: the small files of the
partitions ``optimize`` would compact, the data files it would rewrite for their deletes
(a whole partition where a delete file names none), the position delete files, and the WAL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from pyiceberg.table.snapshots import Operation as SnapshotOperation

from icegate_dagster.config import HealthSettings, format_bytes, format_duration
from icegate_dagster.errors import ConfigError
from icegate_dagster.maintenance.exclusion import NOT_EXCLUDED, Exclusion, table_exclusion
from icegate_dagster.maintenance.health.manifest_walk import (
    SMALL_MANIFEST_SHARE,
    WALK_CACHE,
    PartitionFragments,
    WalkCache,
    WalkRules,
    walk,
)
from icegate_dagster.maintenance.ops import OPERATIONS
from icegate_dagster.maintenance.ops.base import gc_disabled
from icegate_dagster.maintenance.ops.expire_snapshots import expirable_snapshots
from icegate_dagster.maintenance.ops.rewrite_manifests import row_lineage_reason
from icegate_dagster.maintenance.wal import compaction_due

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icegate_dagster.config import TableSettings
    from icegate_dagster.maintenance.wal import WalStats

#: Table properties that override ``maintain.health`` for one table:
#: ``icegate.health.<key>`` (e.g. ``icegate.health.small_files=30``).
PROPERTY_PREFIX = "icegate.health."

#: Points each component of the score can lose (they sum to 100).
WEIGHTS: Mapping[str, float] = {
    "small_files": 40.0,
    "deletes": 30.0,
    "manifests": 10.0,
    "snapshots": 10.0,
    "wal": 10.0,
}
#: The operations that improve each component: where all of a component's are excluded,
#: its points are not judged (:attr:`TableHealth.judged_score`).
COMPONENT_OPERATIONS: Mapping[str, tuple[str, ...]] = {
    "small_files": ("optimize",),
    "deletes": ("optimize", "rewrite_position_delete_files"),
    "manifests": ("rewrite_manifests",),
    "snapshots": ("expire_snapshots",),
    "wal": ("wal_compaction",),
}
#: An equality delete file weighs this many position delete files in the deletes pressure.
EQUALITY_DELETE_WEIGHT = 4
#: Operations the health model may find due, in pass order (``retention`` and
#: ``remove_orphan_files`` never are: see the module docstring).
DUE_ORDER = (
    "wal_compaction",
    "optimize",
    "rewrite_position_delete_files",
    "rewrite_manifests",
    "expire_snapshots",
)


@dataclass(frozen=True)
class HealthMetrics:
    """What a table's metadata says about its upkeep (one current snapshot, no data read)."""

    table: str
    data_files: int
    data_bytes: int
    #: Records in the data files (rows deleted by delete files still count).
    rows: int
    partitions: int
    #: Data files under ``optimize.file_size_threshold``, and their bytes.
    small_files: int
    small_bytes: int
    #: The most small files any one partition holds.
    worst_partition_small_files: int
    position_delete_files: int
    equality_delete_files: int
    #: Deletion vectors (format v3, Puffin blobs), counted apart from position files.
    deletion_vectors: int
    #: Records of the live delete files: rows deleted (an upper bound where deletes
    #: overlap, and for equality deletes, whose records are keys).
    deleted_rows: int
    manifests: int
    small_manifests: int
    snapshots: int
    #: Snapshots an expiry now would remove (Iceberg's rules, see ``expirable_snapshots``).
    expirable_snapshots: int
    oldest_snapshot_at: datetime | None
    wal_files: int = 0
    wal_bytes: int = 0
    #: The newest ``replace`` snapshot (a rewrite: compaction or manifest rewrite).
    last_rewrite_at: datetime | None = None
    #: The partition holding ``worst_partition_small_files`` (None when none holds two).
    worst_partition: str | None = None
    #: Partitions with two small files or more, the most fragmented first. Empty in
    #: hand-built metrics: :func:`assess` then reads ``worst_partition_small_files`` as
    #: the one fragmented partition.
    fragmented_partitions: tuple[PartitionFragments, ...] = ()
    #: Small files in partitions holding at least ``optimize.min_input_files`` of them: what
    #: a binpack rewrite would pick up (the ``small_files`` check). None in hand-built
    #: metrics: every small file.
    compactable_files: int | None = None
    #: Delete files that can no longer apply to any data file (see the module docstring),
    #: by kind.
    dangling_position_deletes: int = 0
    dangling_deletion_vectors: int = 0
    dangling_equality_deletes: int = 0
    #: Data files a rewrite would pick to apply their deletes, as Iceberg's planner does
    #: (``optimize.delete_file_threshold``/``delete_ratio_threshold``), each live delete
    #: file that names no data file counting as one. None (hand-built): every live one.
    delete_rewrite_files: int | None = None
    #: The most position delete files (deletion vectors apart) one partition holds; None
    #: (hand-built): ``position_delete_files``.
    max_partition_position_deletes: int | None = None
    #: Bytes a rewrite applying the deletes reads, at most: the picked data files, and
    #: every data file of a partition where a delete file naming none applies.
    delete_affected_bytes: int = 0
    position_delete_bytes: int = 0
    wal_quarantined: int = 0
    #: Small manifests of the current partition spec (what a rewrite merges); None
    #: (hand-built): ``small_manifests``.
    rewritable_small_manifests: int | None = None
    #: About how many manifests a rewrite would leave; None (hand-built): one.
    manifests_after_rewrite: int | None = None
    #: The table's format version: from 3, rows carry lineage and no manifest rewrite is
    #: due (the operation is skipped there).
    format_version: int = 2

    @property
    def delete_files(self) -> int:
        """Every delete file: position, equality and deletion vectors."""
        return self.position_delete_files + self.equality_delete_files + self.deletion_vectors

    @property
    def live_delete_files(self) -> int:
        """Delete files that may still delete a row (``delete_files`` minus dangling ones)."""
        return max(0, self.delete_files - self.dangling_delete_files)

    @property
    def dangling_delete_files(self) -> int:
        """Delete files of every kind that can no longer apply to any data file."""
        return (
            self.dangling_position_deletes
            + self.dangling_deletion_vectors
            + self.dangling_equality_deletes
        )


def health_state(excluded: str | None, due: bool) -> str:
    """A table's state in one word: ``excluded`` (the whole table), ``due`` (something to
    do) or ``healthy`` (a table's health and its summary say it alike)."""
    if excluded is not None:
        return "excluded"
    return "due" if due else "healthy"


@dataclass(frozen=True)
class DueOperation:
    """One operation the table needs, and why (thresholds named with the figures)."""

    operation: str
    reason: str


@dataclass(frozen=True)
class TableHealth:
    """A table's score, what lowered it, and what is due."""

    table: str
    #: 100 is healthy; see the module docstring for the formula.
    score: float
    #: Points lost per component (``small_files``, ``deletes``, ...), summing to 100 - score.
    penalties: Mapping[str, float]
    due: tuple[DueOperation, ...]
    metrics: HealthMetrics
    #: Bytes the due operations would read and rewrite: what a byte budget counts.
    work_bytes: int
    #: The thresholds used (``maintain.health`` with the table's properties applied).
    thresholds: Mapping[str, Any] = field(default_factory=dict)
    #: Why the whole table is excluded from maintenance (nothing is ever due), or None.
    excluded: str | None = None
    #: Every operation the table is excluded from (the whole table's, or the rewrites
    #: another optimizer owns), with the reason.
    excluded_operations: Mapping[str, str] = field(default_factory=dict)
    #: What the figures make due but the table is excluded from (never in ``due``).
    withheld: tuple[DueOperation, ...] = ()

    @property
    def state(self) -> str:
        """``excluded`` (the whole table), ``due`` (something to do) or ``healthy``."""
        return health_state(self.excluded, bool(self.due))

    @property
    def judged_score(self) -> float:
        """The score counting only what this service maintains here: the points a
        component lost are left out when every operation that would improve it is
        excluded (:data:`COMPONENT_OPERATIONS`). What the ``healthy`` check judges."""
        if not self.excluded_operations:
            return self.score
        lost = sum(
            points
            for component, points in self.penalties.items()
            if not all(op in self.excluded_operations for op in COMPONENT_OPERATIONS[component])
        )
        return round(max(0.0, 100.0 - lost), 1)

    @property
    def need(self) -> float:
        """How much the table needs maintenance: ``100 - score``."""
        return round(100.0 - self.score, 1)

    @property
    def due_operations(self) -> tuple[str, ...]:
        """The names of the due operations, in pass order."""
        return tuple(d.operation for d in self.due)

    def reason(self, operation: str) -> str | None:
        """Why ``operation`` is due; None when it is not."""
        return next((d.reason for d in self.due if d.operation == operation), None)

    def figures(self) -> dict[str, int]:
        """The figures the ``healthy`` check, an assessment and the lakehouse's totals show
        (``summary.FIGURES``)."""
        m = self.metrics
        return {
            "data_files": m.data_files,
            "data_bytes": m.data_bytes,
            "rows": m.rows,
            "small_files": m.small_files,
            "compactable_files": (
                m.small_files if m.compactable_files is None else m.compactable_files
            ),
            "worst_partition_small_files": m.worst_partition_small_files,
            "delete_files": m.delete_files,
            "position_delete_files": m.position_delete_files,
            "equality_delete_files": m.equality_delete_files,
            "deletion_vectors": m.deletion_vectors,
            "manifests": m.manifests,
            "small_manifests": m.small_manifests,
            "snapshots": m.snapshots,
            "expirable_snapshots": m.expirable_snapshots,
            "wal_files": m.wal_files,
            "wal_bytes": m.wal_bytes,
            "work_bytes": self.work_bytes,
        }

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for JSON output and metadata (instants as ISO 8601 text)."""
        data = asdict(self) | {
            "need": self.need,
            "due_operations": list(self.due_operations),
            "state": self.state,
            "judged_score": self.judged_score,
        }
        data["penalties"] = dict(self.penalties)
        data["thresholds"] = dict(self.thresholds)
        data["excluded_operations"] = dict(self.excluded_operations)
        metrics = data["metrics"]
        for name in ("oldest_snapshot_at", "last_rewrite_at"):
            if metrics[name] is not None:
                metrics[name] = metrics[name].isoformat()
        metrics["delete_files"] = self.metrics.delete_files
        metrics["live_delete_files"] = self.metrics.live_delete_files
        metrics["dangling_delete_files"] = self.metrics.dangling_delete_files
        return data


# --- thresholds -------------------------------------------------------------------------


def thresholds_for(settings: TableSettings, properties: Mapping[str, str]) -> HealthSettings:
    """``settings.health`` with the table's ``icegate.health.<key>`` properties applied;
    a bad property value fails naming the property and the value.

    Values are parsed as the YAML's are (``30``, ``2m``, ``12.5``); an unknown
    ``icegate.health.*`` key fails listing the allowed ones.
    """
    overrides: dict[str, str] = {}
    allowed = list(HealthSettings.model_fields)
    for name, value in properties.items():
        if not name.startswith(PROPERTY_PREFIX):
            continue
        key = name[len(PROPERTY_PREFIX) :]
        if key not in HealthSettings.model_fields:
            raise ConfigError(
                f"invalid table property {name} = {value!r}: unknown key "
                f"(allowed: {', '.join(PROPERTY_PREFIX + k for k in allowed)})"
            )
        overrides[key] = value
    if not overrides:
        return settings.health
    base: dict[str, Any] = dict(settings.health)
    try:
        return HealthSettings.model_validate(base | overrides)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = str(error["loc"][0]) if error["loc"] else next(iter(overrides))
        ctx = error.get("ctx") or {}
        rule = str(ctx.get("error", error["msg"]))
        raise ConfigError(
            f"invalid table property {PROPERTY_PREFIX}{key} = {overrides.get(key)!r}: {rule}"
        ) from None


def _thresholds_record(thresholds: HealthSettings) -> dict[str, Any]:
    return {k: format_duration(v) if isinstance(v, timedelta) else v for k, v in thresholds}


# --- collecting -------------------------------------------------------------------------


def _instant(timestamp_ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=timestamp_ms)


def collect_metrics(
    table: Table,
    key: str,
    settings: TableSettings,
    now: datetime,
    wal: WalStats | None = None,
    *,
    cache: WalkCache | None = WALK_CACHE,
) -> HealthMetrics:
    """Read a table's health figures from its current metadata (pyiceberg, no JVM).

    The manifest walk is cached per metadata file, shared with the table's stats
    (``cache=None``: read afresh); the snapshot figures, which change with ``now``, and
    the WAL's are computed each call.
    """
    rules = WalkRules.of(settings)
    figures = cache.walk(key, table, rules) if cache is not None else walk(table, rules)
    snapshots = table.metadata.snapshots
    rewrites = [
        s.timestamp_ms
        for s in snapshots
        if s.summary is not None and s.summary.operation == SnapshotOperation.REPLACE
    ]
    worst = figures.fragmented[0] if figures.fragmented else None
    return HealthMetrics(
        table=key,
        data_files=figures.data_files,
        data_bytes=figures.data_bytes,
        rows=figures.rows,
        partitions=figures.partitions,
        small_files=figures.small_files,
        small_bytes=figures.small_bytes,
        worst_partition_small_files=worst.small_files if worst else min(figures.small_files, 1),
        position_delete_files=figures.position_delete_files,
        equality_delete_files=figures.equality_delete_files,
        deletion_vectors=figures.deletion_vectors,
        deleted_rows=figures.deleted_rows,
        manifests=figures.manifests,
        small_manifests=figures.small_manifests,
        snapshots=len(snapshots),
        # Where gc.enabled=false the operation is skipped: nothing is ever due for it.
        expirable_snapshots=(
            0 if gc_disabled(table) else expirable_snapshots(table, settings.expire_snapshots, now)
        ),
        oldest_snapshot_at=(
            _instant(min(s.timestamp_ms for s in snapshots)) if snapshots else None
        ),
        wal_files=wal.files if wal is not None else 0,
        wal_bytes=wal.bytes if wal is not None else 0,
        last_rewrite_at=_instant(max(rewrites)) if rewrites else None,
        worst_partition=worst.partition if worst else None,
        fragmented_partitions=figures.fragmented,
        compactable_files=figures.compactable_files(settings.optimize.min_input_files),
        dangling_position_deletes=figures.dangling_position_deletes,
        dangling_deletion_vectors=figures.dangling_deletion_vectors,
        dangling_equality_deletes=figures.dangling_equality_deletes,
        delete_rewrite_files=figures.delete_rewrite_files,
        max_partition_position_deletes=figures.max_partition_position_deletes,
        delete_affected_bytes=figures.delete_affected_bytes,
        position_delete_bytes=figures.position_delete_bytes,
        wal_quarantined=wal.quarantined if wal is not None else 0,
        rewritable_small_manifests=figures.rewritable_small_manifests,
        manifests_after_rewrite=figures.manifests_after_rewrite,
        format_version=int(table.metadata.format_version),
    )


def next_look_at(table: Table, settings: TableSettings, now: datetime) -> datetime | None:
    """When the table's health may change with no commit: the next instant one of its
    snapshots grows older than ``expire_snapshots.retention_threshold`` (the expirable
    count, and so the score and ``expire_snapshots``' due rule, depend on time alone).
    None: no snapshot will cross it."""
    retention = settings.expire_snapshots.retention_threshold
    crossings = [
        _instant(s.timestamp_ms) + retention
        for s in table.metadata.snapshots
        if _instant(s.timestamp_ms) + retention > now
    ]
    return min(crossings) if crossings else None


# --- assessing --------------------------------------------------------------------------


def _ramp(value: float, threshold: float) -> float:
    """0 at one, 1 at ``threshold`` (and beyond), linear between."""
    if threshold <= 1:
        return 1.0 if value >= 1 else 0.0
    return min(1.0, max(0.0, (value - 1) / (threshold - 1)))


def _share(value: float, whole: float) -> float:
    return min(1.0, value / whole) if whole > 0 else 0.0


def _fragments(metrics: HealthMetrics) -> tuple[PartitionFragments, ...]:
    """The fragmented partitions; from the worst one alone in hand-built metrics."""
    if metrics.fragmented_partitions or metrics.worst_partition_small_files < 2:
        return metrics.fragmented_partitions
    count = metrics.worst_partition_small_files
    share = count / metrics.small_files if metrics.small_files else 1.0
    return (
        PartitionFragments(
            partition=metrics.worst_partition or "(one partition)",
            spec_id=0,
            data_files=count,
            small_files=count,
            small_bytes=int(metrics.small_bytes * min(1.0, share)),
        ),
    )


def _live_deletes(metrics: HealthMetrics) -> tuple[int, int]:
    """Live position files and vectors, and live equality files."""
    positions = metrics.position_delete_files + metrics.deletion_vectors
    dangling = metrics.dangling_position_deletes + metrics.dangling_deletion_vectors
    live_positions = max(0, positions - dangling)
    live_equality = max(0, metrics.equality_delete_files - metrics.dangling_equality_deletes)
    return live_positions, live_equality


def _pressures(
    metrics: HealthMetrics, settings: TableSettings, thresholds: HealthSettings
) -> dict[str, float]:
    fragments = _fragments(metrics)
    weight = sum(p.small_files for p in fragments)
    small_files = (
        sum(p.small_files * _ramp(p.small_files, thresholds.small_files) for p in fragments)
        / weight
        if weight
        else 0.0
    )
    live_positions, live_equality = _live_deletes(metrics)
    deleted_share = _share(metrics.deleted_rows, metrics.rows)
    deletes = max(
        _share(deleted_share, settings.optimize.delete_ratio_threshold),
        _share(live_positions + EQUALITY_DELETE_WEIGHT * live_equality, max(1, metrics.data_files)),
    )
    manifests = max(
        _ramp(metrics.manifests, thresholds.manifests),
        _ramp(metrics.small_manifests, thresholds.small_manifests),
    )
    snapshots = max(
        _share(metrics.expirable_snapshots, metrics.snapshots),
        _ramp(metrics.snapshots, settings.checks.max_snapshots),
    )
    compaction = settings.compaction
    wal = max(
        _share(metrics.wal_files, compaction.min_files),
        _share(metrics.wal_bytes, compaction.min_size_bytes),
    )
    return {
        "small_files": small_files,
        "deletes": deletes,
        "manifests": manifests,
        "snapshots": snapshots,
        "wal": wal,
    }


def _due(
    metrics: HealthMetrics, settings: TableSettings, thresholds: HealthSettings
) -> tuple[list[DueOperation], dict[str, int]]:
    """The due operations with their reasons, and the bytes each would rewrite."""
    due: list[DueOperation] = []
    work = 0
    works: dict[str, int] = {}
    compaction = settings.compaction
    if compaction_due(metrics.wal_files, metrics.wal_bytes, compaction):
        due.append(
            DueOperation(
                "wal_compaction",
                f"{metrics.wal_files} WAL files ({format_bytes(metrics.wal_bytes)}) waiting; "
                f"due at {compaction.min_files} files or {format_bytes(compaction.min_size_bytes)}",
            )
        )
        works["wal_compaction"] = metrics.wal_bytes

    optimize = settings.optimize
    reasons = []
    small_due = max(thresholds.small_files, optimize.min_input_files)
    if metrics.worst_partition_small_files >= small_due:
        where = f"partition {metrics.worst_partition}" if metrics.worst_partition else "a partition"
        reasons.append(
            f"{where} holds {metrics.worst_partition_small_files} small files (under "
            f"{format_bytes(optimize.file_size_threshold)}); due at {small_due}"
        )
        work += sum(
            p.small_bytes for p in _fragments(metrics) if p.small_files >= optimize.min_input_files
        )
    live_positions, live_equality = _live_deletes(metrics)
    live = live_positions + live_equality
    picked = metrics.delete_rewrite_files if metrics.delete_rewrite_files is not None else live
    # Only where the rewrite would pick a file: else it would run again and again for nothing.
    if live >= thresholds.delete_files and picked > 0:
        dangling = metrics.dangling_delete_files
        reasons.append(
            f"{live} delete files apply to live data ({metrics.position_delete_files} "
            f"position, {metrics.deletion_vectors} deletion vectors, "
            f"{metrics.equality_delete_files} equality, less {dangling} dangling), deleting "
            f"{metrics.deleted_rows} of {metrics.rows} rows; {picked} data files to rewrite; "
            f"due at {thresholds.delete_files}"
        )
        work += metrics.delete_affected_bytes
    if reasons:
        due.append(DueOperation("optimize", "; ".join(reasons)))
        works["optimize"] = work

    positions = settings.rewrite_position_delete_files
    most = (
        metrics.max_partition_position_deletes
        if metrics.max_partition_position_deletes is not None
        else metrics.position_delete_files
    )
    per_partition = max(thresholds.delete_files, positions.min_input_files)
    position_reasons = []
    if metrics.position_delete_files >= thresholds.delete_files and most >= per_partition:
        position_reasons.append(
            f"a partition holds {most} of {metrics.position_delete_files} position delete "
            f"files (deletion vectors apart); due at {per_partition}"
        )
    if metrics.dangling_position_deletes >= thresholds.delete_files:
        position_reasons.append(
            f"{metrics.dangling_position_deletes} position deletes are dangling (their data "
            f"files are gone); due at {thresholds.delete_files}"
        )
    if position_reasons:
        due.append(DueOperation("rewrite_position_delete_files", "; ".join(position_reasons)))
        works["rewrite_position_delete_files"] = metrics.position_delete_bytes

    # Only what a rewrite can reduce: it leaves other specs' manifests (the procedure) and
    # about one per target size of the rest, or it would be due again after every run.
    after = metrics.manifests_after_rewrite if metrics.manifests_after_rewrite is not None else 1
    reducible = metrics.manifests - after
    small = (
        metrics.rewritable_small_manifests
        if metrics.rewritable_small_manifests is not None
        else metrics.small_manifests
    )
    manifest_reasons = []
    if metrics.manifests >= thresholds.manifests and reducible >= thresholds.manifests // 2:
        manifest_reasons.append(
            f"{metrics.manifests} manifests, about {after} after a rewrite; due at "
            f"{thresholds.manifests}"
        )
    if small >= thresholds.small_manifests and reducible >= thresholds.small_manifests // 2:
        manifest_reasons.append(
            f"{small} of {metrics.manifests} manifests are small (under "
            f"{SMALL_MANIFEST_SHARE:.0%} of the manifest target size), about {after} after "
            f"a rewrite; due at {thresholds.small_manifests}"
        )
    # Where rows carry lineage the operation is skipped: it must never be due there.
    if manifest_reasons and row_lineage_reason(metrics.format_version) is None:
        due.append(DueOperation("rewrite_manifests", "; ".join(manifest_reasons)))

    expire_at = max(thresholds.expirable_snapshots, -(-metrics.snapshots // 10))
    if metrics.expirable_snapshots >= expire_at:
        rule = settings.expire_snapshots
        due.append(
            DueOperation(
                "expire_snapshots",
                f"{metrics.expirable_snapshots} of {metrics.snapshots} snapshots can expire "
                f"(older than {format_duration(rule.retention_threshold)}, beyond the last "
                f"{rule.retain_last} and the branch and tag heads); due at {expire_at}",
            )
        )
    return due, works


def assess(
    metrics: HealthMetrics,
    settings: TableSettings,
    thresholds: HealthSettings,
    exclusion: Exclusion = NOT_EXCLUDED,
) -> TableHealth:
    """Score ``metrics`` and list the due operations (pure: no I/O). An operation the
    table is excluded from (``exclusion``) is never due: it is listed as withheld."""
    penalties = {
        name: round(WEIGHTS[name] * pressure, 1)
        for name, pressure in _pressures(metrics, settings, thresholds).items()
    }
    score = round(max(0.0, 100.0 - sum(penalties.values())), 1)
    found, works = _due(metrics, settings, thresholds)
    order = {name: i for i, name in enumerate(DUE_ORDER)}
    found.sort(key=lambda d: order.get(d.operation, len(order)))
    due = [d for d in found if exclusion.reason(d.operation) is None]
    withheld = [d for d in found if exclusion.reason(d.operation) is not None]
    work = sum(works.get(d.operation, 0) for d in due)
    return TableHealth(
        table=metrics.table,
        score=score,
        penalties=penalties,
        due=tuple(due),
        metrics=metrics,
        work_bytes=min(
            work, metrics.data_bytes + metrics.wal_bytes + metrics.position_delete_bytes
        ),
        thresholds=_thresholds_record(thresholds),
        excluded=exclusion.table,
        excluded_operations=exclusion.operations(OPERATIONS.names()),
        withheld=tuple(withheld),
    )


def assess_table(
    table: Table,
    key: str,
    settings: TableSettings,
    now: datetime,
    wal: WalStats | None = None,
    *,
    cache: WalkCache | None = WALK_CACHE,
) -> TableHealth:
    """:func:`collect_metrics`, then :func:`assess` with the table's own thresholds and its
    exclusion (:func:`~icegate_dagster.maintenance.exclusion.table_exclusion`)."""
    exclusion = table_exclusion(settings, key, table.properties)
    thresholds = thresholds_for(settings, table.properties)
    metrics = collect_metrics(table, key, settings, now, wal, cache=cache)
    return assess(metrics, settings, thresholds, exclusion)
