"""The commands that look and change nothing: ``discover`` (the tables a pass would
maintain) and ``status`` (figures, health and due operations per table, no JVM).
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from icegate_dagster import render
from icegate_dagster.cli.parser import EXIT_FAILED, EXIT_OK
from icegate_dagster.cli.passes import tables_asked_for
from icegate_dagster.maintenance import Maintainer, TableRef, TableResult, TableStats

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icegate_dagster.maintenance.health.score import TableHealth
    from icegate_dagster.maintenance.sharing import Sharing


def discover(maintainer: Maintainer, as_json: bool) -> int:
    """``discover``: the tables a pass would maintain."""
    tables = [ref.key for ref in maintainer.discover()]
    print(json.dumps(tables) if as_json else "\n".join(tables) or "no tables found")
    return EXIT_OK


def _health(maintainer: Maintainer, ref: TableRef, table: Table) -> TableHealth:
    """The table's health score and due operations, from metadata (and its WAL folder)."""
    from icegate_dagster.maintenance.health.score import assess_table
    from icegate_dagster.maintenance.wal import configured_wal_root, wal_stats

    wal_root = configured_wal_root(maintainer.config)
    wal = wal_stats(wal_root, ref) if wal_root is not None else None
    return assess_table(table, ref.key, maintainer.settings(ref), datetime.now(UTC), wal)


def status(maintainer: Maintainer, names: list[str] | None, as_json: bool) -> int:
    """``status``: stats, score and due operations per table, no JVM; a table that cannot
    be read or assessed is reported on its own row (exit 1), the others as usual. Tables
    excluded from maintenance say so (not a failure), and so do tables that share their
    location without ``gc.enabled=false`` (a warning)."""
    from icegate_dagster.config.secrets import scrub
    from icegate_dagster.errors import describe_error

    def describe(exc: Exception) -> str:
        return describe_error(exc, lambda text: scrub(text, maintainer.config))

    stats: list[tuple[str, TableStats | None, str | None]] = []
    healths: dict[str, TableHealth] = {}
    sharings: dict[str, Sharing] = {}
    for target in tables_asked_for(maintainer, names):
        if isinstance(target, TableResult):
            stats.append((target.table, None, target.error))
            continue
        try:
            table = maintainer.load(target)
            table_stats = maintainer.stats(target, table)
        except Exception as exc:  # unreadable metadata (a missing manifest...): this table only
            stats.append((target.key, None, describe(exc)))
            continue
        # The catalog cannot be listed: nothing to say of sharing.
        with contextlib.suppress(Exception):
            sharings[target.key] = maintainer.sharing(target, table)
        try:
            healths[target.key] = _health(maintainer, target, table)
        except Exception as exc:  # e.g. a bad icegate.health.* property: this table only
            stats.append((target.key, table_stats, f"cannot assess its health: {describe(exc)}"))
            continue
        stats.append((target.key, table_stats, None))
    if as_json:
        document = [
            {
                "table": t,
                "stats": s.as_dict() if s else None,
                "health": healths[t].as_dict() if t in healths else None,
                "sharing": sharings[t].as_dict() if t in sharings else None,
                "error": e,
            }
            for t, s, e in stats
        ]
        print(json.dumps(document, indent=2))
    else:
        print(render.status_table(stats, healths, sharings))
        warnings = [w for t, _, _ in stats if t in sharings and (w := sharings[t].warning())]
        for warning in warnings:
            print(f"\nwarning: {warning}")
    return EXIT_OK if all(e is None for _, _, e in stats) else EXIT_FAILED
