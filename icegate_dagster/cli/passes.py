"""The commands that maintain: ``run``, one operation alone (``compact``, ``expire``...) and
``rollback``; each prints its pass and records it in Dagster when an instance is configured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from icegate_dagster import render
from icegate_dagster.cli.parser import EXIT_FAILED, EXIT_OK
from icegate_dagster.errors import IcegateError
from icegate_dagster.maintenance import OPERATIONS, Maintainer, TableRef, TableResult

if TYPE_CHECKING:
    from dagster import DagsterInstance


def run_pass(maintainer: Maintainer, args: argparse.Namespace) -> int:
    """``run`` (the full pass) or one operation's command, over the tables asked for."""
    instance = dagster_instance(args)
    if args.command == "run":
        results = maintain_tables(maintainer, args.table, None, args.dry_run)
    else:
        operation = OPERATIONS.cli_commands()[args.command]
        results = maintain_tables(
            maintainer,
            args.table,
            [operation.name],
            args.dry_run,
            force=getattr(args, "force", False),
        )
    history = record_in_dagster(instance, maintainer, results)
    return emit_results(results, args.json, maintainer.run_id, history)


def rollback(maintainer: Maintainer, table: str, snapshot_id: int, as_json: bool) -> int:
    """``rollback``: make ``snapshot_id`` current again, logged."""
    ref = maintainer.resolve(table)
    return emit_results([maintainer.rollback(ref, snapshot_id)], as_json, maintainer.run_id)


def tables_asked_for(
    maintainer: Maintainer, names: list[str] | None
) -> list[TableRef | TableResult]:
    """The tables asked for: each resolved, or a failed result naming why not."""
    if not names:
        return list(maintainer.discover())
    targets: list[TableRef | TableResult] = []
    for name in dict.fromkeys(names):  # a table named twice is maintained once
        try:
            targets.append(maintainer.resolve(name))
        except IcegateError as exc:
            targets.append(TableResult(str(name), None, None, [], 0.0, error=str(exc)))
    return targets


def _failed_ops(
    maintainer: Maintainer,
    target: TableRef | TableResult,
    operations: Sequence[str] | None,
    dry_run: bool,
) -> TableRef | TableResult:
    """A table asked for by name that does not exist (dropped before its run, or never
    there) fails every operation it would have run, each logged as a ``failed`` row."""
    if isinstance(target, TableRef) or target.ops or target.error is None:
        return target
    try:
        ref = TableRef.parse(target.table)
    except IcegateError:  # not a table name at all: bad usage, nothing to log
        return target
    names = operations if operations is not None else maintainer.operations_for(ref)
    failed = TableResult.failed(ref.key, target.error, names)
    if not dry_run:
        maintainer.write_logs([failed])
    return failed


def maintain_tables(
    maintainer: Maintainer,
    names: list[str] | None,
    operations: Sequence[str] | None,
    dry_run: bool,
    force: bool = False,
) -> list[TableResult]:
    asked = tables_asked_for(maintainer, names)
    targets = [_failed_ops(maintainer, t, operations, dry_run) for t in asked]
    if force:
        return [
            t
            if isinstance(t, TableResult)
            else maintainer.maintain_table(t, operations, force=True)
            for t in targets
        ]
    # The tables run side by side (maintain.parallel_tables); the report keeps their order.
    refs = [t for t in targets if isinstance(t, TableRef)]
    done = iter(maintainer.maintain(refs, operations, dry_run=dry_run))
    return [t if isinstance(t, TableResult) else next(done) for t in targets]


def emit_results(
    results: list[TableResult], as_json: bool, run_id: str, history: str | None = None
) -> int:
    """Print the pass (and what was recorded in Dagster); its exit code."""
    if as_json:
        document: dict[str, Any] = {"run_id": run_id, "tables": [r.as_dict() for r in results]}
        if history is not None:
            document["dagster"] = history
        print(json.dumps(document, indent=2))
    else:
        print(render.op_lines(results))
        print()
        print(render.before_after(results))
        if not results:
            print("no tables to maintain")
        if history is not None:
            print(f"\n{history}")
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILED


def record_in_dagster(
    instance: DagsterInstance | None, maintainer: Maintainer, results: list[TableResult]
) -> str | None:
    """Record a pass in the Dagster instance, if one is configured (see :mod:`.history`);
    what was recorded. Why it could not be goes to stderr: the pass and its log rows
    stand, so the exit code is the pass's."""
    if instance is None:
        return None
    from icegate_dagster.cli.history import record_or_warn

    try:
        recorded, line = record_or_warn(instance, maintainer, results)
    finally:
        instance.dispose()
    if not recorded:
        print(f"icegate-maintain: warning: {line}", file=sys.stderr)
    return line


def dagster_instance(args: argparse.Namespace) -> DagsterInstance | None:
    """The Dagster instance a maintaining command records in, if one is configured (only
    Dagster's import cost when one is). One named by ``--dagster-home`` that cannot be
    opened is bad usage (exit 2, before anything runs); one that ``$DAGSTER_HOME`` merely
    points at gets a warning, and the pass runs as without one."""
    if getattr(args, "dry_run", False) or "dagster_home" not in args:
        return None
    if not args.dagster_home and not os.environ.get("DAGSTER_HOME"):
        return None
    from icegate_dagster.cli.history import open_instance

    try:
        return open_instance(args.dagster_home)
    except IcegateError as exc:
        if args.dagster_home:
            raise
        print(f"icegate-maintain: warning: {exc}; the pass is not recorded", file=sys.stderr)
        return None
