"""A maintainer's side of the trigger's memory (:mod:`.trigger`): opened on first use in the
lease store's database; each table's pass kept in it as the table finishes; where tables
live, from the trigger's looks."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from icegate_dagster.config import IcegateConfig
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance.results import TableResult
from icegate_dagster.maintenance.trigger.records import (
    OperationAttempt,
    OperationMemory,
    PassRecord,
)
from icegate_dagster.maintenance.trigger.store import TriggerMemory, memory_for

if TYPE_CHECKING:
    from icegate_dagster.maintenance.leases.store import TableLocks


class PassMemory:
    """The trigger's memory for one maintainer: in the database of the lease store that
    ``locks`` opens (none without one); ``scrub`` cleans the errors it reports."""

    def __init__(
        self,
        config: IcegateConfig,
        locks: Callable[[], TableLocks | None],
        scrub: Callable[[str], str],
    ) -> None:
        self._config = config
        self._locks = locks
        self._scrub = scrub
        self._memory: TriggerMemory | None = None
        self._lock = threading.Lock()

    @property
    def store(self) -> TriggerMemory | None:
        """The trigger's memory, in the lease store's database (None without a store)."""
        with self._lock:
            if self._memory is None:
                locks = self._locks()
                if locks is not None:
                    self._memory = memory_for(locks.engine)
            return self._memory

    def known_locations(self) -> dict[str, str]:
        """Locations by metadata file from the trigger's looks (none without a store): a pass
        need not load every table of the catalog to know where each one lives."""
        try:
            memory = self.store
            return memory.known_locations() if memory is not None else {}
        except Exception:  # the tables are loaded instead
            return {}

    def remember(self, *records: PassRecord) -> list[OperationMemory] | str:
        """Keep tables' passes in the trigger's memory (their outcomes, per operation), in
        one transaction; the operations' new memory, or why it could not be kept (the pass
        itself stands: the log has every outcome)."""
        try:
            memory = self.store
            if memory is None:
                return "no lease store: the trigger's memory is not kept"
            trigger = self._config.trigger
            kept = memory.record_passes(
                records, backoff=trigger.backoff, backoff_max=trigger.backoff_max
            )
            return [m for ops in kept.values() for m in ops]
        except Exception as exc:
            return f"the trigger's memory could not be updated: {describe_error(exc, self._scrub)}"


def pass_record(
    result: TableResult,
    run_id: str,
    *,
    requested: Sequence[str] = (),
    still_due: dict[str, str] | None = None,
    settled_state: str | None = None,
    shown_state: str | None = None,
) -> PassRecord:
    """A table's pass as the trigger's memory keeps it (see ``memory.records``)."""
    return PassRecord(
        table=result.table,
        run_id=run_id,
        attempts=tuple(
            OperationAttempt(
                op.operation,
                op.status,
                held_elsewhere=bool(op.output.get("held_elsewhere")),
                error=op.error,
            )
            for op in result.ops
        ),
        requested=tuple(requested),
        still_due=still_due,
        settled_state=settled_state,
        shown_state=shown_state,
    )
