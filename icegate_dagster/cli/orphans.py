"""``orphans --collect`` and ``orphans --delete-collected``: deferred deletion of orphan
files, collected now and deleted on a later call (``orphans`` alone is a pass:
:mod:`.passes`)."""

from __future__ import annotations

import json

from icegate_dagster import render
from icegate_dagster.cli.parser import EXIT_FAILED, EXIT_OK
from icegate_dagster.config import format_bytes
from icegate_dagster.maintenance import Maintainer


def deferred_orphans(maintainer: Maintainer, names: list[str], delete: bool, as_json: bool) -> int:
    """``orphans --collect`` / ``--delete-collected``: exit 1 if a table or a delete failed."""
    from icegate_dagster.maintenance.ops import deferred_orphans as deferred
    from icegate_dagster.maintenance.orphans.candidates import candidates_table

    where = candidates_table(maintainer.config).key
    mode = "delete_collected" if delete else "collect"
    if delete:
        results = maintainer.run_each(names, deferred.DeleteCollectedOrphans())
    else:
        results = maintainer.run_each(names, deferred.CollectOrphans(), write_log=False)
    reports = [deferred.deferred_report(result, mode) for result in results]
    if as_json:
        document = {
            "run_id": maintainer.run_id,
            "mode": mode,
            "candidates_table": where,
            "tables": reports,
        }
        print(json.dumps(document, indent=2))
    else:
        for report in reports:
            print(f"{report['table']}: {report['status']}: {report['details']}")
            if delete:
                rows = [
                    ["deleted", f["path"], format_bytes(f["size_bytes"])] for f in report["deleted"]
                ]
                rows += [[f"kept: {k['reason']}", k["path"], k["detail"]] for k in report["kept"]]
                rows += [["failed", f["path"], f["error"]] for f in report["failed"]]
            else:
                rows = [
                    ["pending", c["path"], format_bytes(c["size_bytes"])]
                    for c in report["candidates"]
                ]
            if rows:
                print(render.text_table(["status", "file", "size / why"], rows))
        print(f"\ncandidates table: {where} (run_id {maintainer.run_id})")
    return EXIT_OK if all(result.ok for result in results) else EXIT_FAILED
