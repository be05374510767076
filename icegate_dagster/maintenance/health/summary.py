"""A table's health in the few figures the trigger keeps between looks: its score, what is
due and why, the work bytes and the figures the checks and totals show. Small enough to
store for every table (the trigger's memory, :mod:`..memory`) and to rebuild the trigger's
picture of a large lakehouse without reading every table again.

:class:`~icegate_dagster.maintenance.health.score.TableHealth` (the full assessment, with
its metrics) and :class:`HealthSummary` both satisfy :class:`Assessed`, which is all the
selection, the totals and the ``healthy`` check read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from icegate_dagster.maintenance.health.score import DueOperation, health_state

if TYPE_CHECKING:
    from icegate_dagster.maintenance.health.score import TableHealth

#: The figures kept (what the ``healthy`` check, an assessment and the totals show).
FIGURES = (
    "data_files",
    "data_bytes",
    "rows",
    "small_files",
    "compactable_files",
    "worst_partition_small_files",
    "delete_files",
    "position_delete_files",
    "equality_delete_files",
    "deletion_vectors",
    "manifests",
    "small_manifests",
    "snapshots",
    "expirable_snapshots",
    "wal_files",
    "wal_bytes",
    "work_bytes",
)

#: The version of what a summary keeps: part of each look's settings digest, so that a
#: summary kept by an older version (without a figure added since, such as
#: ``compactable_files``) makes its table out of date once.
SUMMARY_FORMAT = 2


class Assessed(Protocol):
    """What is read of a table's health: a full assessment or its summary."""

    @property
    def table(self) -> str: ...

    @property
    def score(self) -> float: ...

    @property
    def due(self) -> tuple[DueOperation, ...]: ...

    @property
    def work_bytes(self) -> int: ...

    @property
    def penalties(self) -> Mapping[str, float]: ...

    @property
    def excluded(self) -> str | None: ...

    @property
    def excluded_operations(self) -> Mapping[str, str]: ...

    @property
    def withheld(self) -> tuple[DueOperation, ...]: ...

    @property
    def judged_score(self) -> float: ...

    @property
    def state(self) -> str: ...

    @property
    def need(self) -> float: ...

    @property
    def due_operations(self) -> tuple[str, ...]: ...

    def figures(self) -> dict[str, int]: ...


@dataclass(frozen=True)
class HealthSummary:
    """A table's health as the trigger keeps it (see the module docstring)."""

    table: str
    score: float
    due: tuple[DueOperation, ...]
    work_bytes: int
    penalties: Mapping[str, float] = field(default_factory=dict)
    kept: Mapping[str, int] = field(default_factory=dict)
    #: The table's own thresholds: its ``healthy`` check fails below ``min_score``; the
    #: trigger maintains it at most once per ``min_interval_s``.
    min_score: float = 50.0
    min_interval_s: float = 120.0
    #: Why the whole table is excluded from maintenance, or None (``maintenance.exclusion``).
    excluded: str | None = None
    #: Every operation it is excluded from, with the reason.
    excluded_operations: Mapping[str, str] = field(default_factory=dict)
    #: What its figures make due but it is excluded from.
    withheld: tuple[DueOperation, ...] = ()
    #: The score counting only what is maintained here (what ``healthy`` judges).
    judged: float | None = None

    @classmethod
    def of(cls, health: TableHealth, min_score: float, min_interval_s: float) -> HealthSummary:
        """The summary of a full assessment."""
        return cls(
            table=health.table,
            score=health.score,
            due=tuple(health.due),
            work_bytes=health.work_bytes,
            penalties=dict(health.penalties),
            kept={name: value for name, value in health.figures().items() if value},
            min_score=min_score,
            min_interval_s=min_interval_s,
            excluded=health.excluded,
            excluded_operations=dict(health.excluded_operations),
            withheld=tuple(health.withheld),
            judged=health.judged_score if health.excluded_operations else None,
        )

    @property
    def judged_score(self) -> float:
        """The score the ``healthy`` check judges (see ``TableHealth.judged_score``)."""
        return self.score if self.judged is None else self.judged

    @property
    def state(self) -> str:
        """``excluded`` (the whole table), ``due`` (something to do) or ``healthy``."""
        return health_state(self.excluded, bool(self.due))

    @property
    def need(self) -> float:
        """How much the table needs maintenance: ``100 - score``."""
        return round(100.0 - self.score, 1)

    @property
    def due_operations(self) -> tuple[str, ...]:
        """The due operations' names, in pass order."""
        return tuple(d.operation for d in self.due)

    @property
    def healthy(self) -> bool:
        """Its ``healthy`` verdict: an excluded table passes; otherwise the judged score
        reaches its ``min_score``."""
        return self.excluded is not None or self.judged_score >= self.min_score

    def figures(self) -> dict[str, int]:
        """The kept figures (0 for one an older summary did not keep)."""
        return dict(self._figures)

    @cached_property
    def _figures(self) -> dict[str, int]:
        return {name: int(self.kept.get(name, 0)) for name in FIGURES}

    def to_json(self) -> str:
        """Compact JSON, as stored."""
        return json.dumps(
            {
                "s": self.score,
                "d": [[d.operation, d.reason] for d in self.due],
                "w": self.work_bytes,
                "p": dict(self.penalties),
                "f": {k: v for k, v in self.kept.items() if v},
                "m": self.min_score,
                "i": self.min_interval_s,
                **({"x": self.excluded} if self.excluded is not None else {}),
                **({"xo": dict(self.excluded_operations)} if self.excluded_operations else {}),
                **(
                    {"wh": [[d.operation, d.reason] for d in self.withheld]}
                    if self.withheld
                    else {}
                ),
                **({"j": self.judged} if self.judged is not None else {}),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, table: str, text: str) -> HealthSummary:
        """A stored summary (``ValueError`` when it does not read)."""
        data: Any = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a health summary")
        return cls(
            table=table,
            score=float(data["s"]),
            due=tuple(DueOperation(str(op), str(reason)) for op, reason in data["d"]),
            work_bytes=int(data["w"]),
            penalties={str(k): float(v) for k, v in dict(data.get("p") or {}).items()},
            kept={str(k): int(v) for k, v in dict(data.get("f") or {}).items()},
            min_score=float(data.get("m", 50.0)),
            min_interval_s=float(data.get("i", 120.0)),
            excluded=str(data["x"]) if data.get("x") is not None else None,
            excluded_operations={str(k): str(v) for k, v in dict(data.get("xo") or {}).items()},
            withheld=tuple(DueOperation(str(op), str(why)) for op, why in data.get("wh") or ()),
            judged=float(data["j"]) if data.get("j") is not None else None,
        )


def table_state(
    metadata_location: str | None,
    wal: tuple[int, int, str | None] | None,
    due: Sequence[DueOperation],
) -> str:
    """Names what the trigger knows of a table: its metadata file, its waiting WAL (files,
    bytes, oldest file) and what is due and why. A pass that leaves a table in one state
    records it; the trigger asks for no new run while the table stays in it."""
    wal_part = f"{wal[0]}/{wal[1]}/{wal[2]}" if wal is not None else "-"
    reasons = "\n".join(f"{d.operation}: {d.reason}" for d in due)
    text = f"{metadata_location}\n{wal_part}\n{reasons}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]
