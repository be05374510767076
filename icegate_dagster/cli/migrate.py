"""``migrate``: create IceGate's logs, spans, metrics and events tables, or add the columns
they lack."""

from __future__ import annotations

import json

from icegate_dagster import render
from icegate_dagster.cli.parser import EXIT_FAILED, EXIT_OK
from icegate_dagster.maintenance import Maintainer


def migrate(maintainer: Maintainer, namespace: str | None, as_json: bool) -> int:
    from icegate_dagster.maintenance.migrate import migrate as migrate_tables
    from icegate_dagster.maintenance.migrate import target_namespace

    target = target_namespace(maintainer.config.namespaces, namespace)
    results = migrate_tables(maintainer.catalog, target)
    if as_json:
        print(json.dumps({"namespace": target, "tables": [r.as_dict() for r in results]}, indent=2))
    else:
        rows = [[r.table, r.action, r.error or ", ".join(r.added_columns) or "-"] for r in results]
        print(render.text_table(["table", "action", "columns added / error"], rows))
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILED
