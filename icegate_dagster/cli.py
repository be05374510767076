"""``icegate-maintain``: the maintenance pass from a shell.

Exit codes (:data:`EXIT_CODES`): 0 when every operation succeeded, 1 when any failed
(after all ran), 2 for bad usage or configuration. :func:`build_parser` is also what the
documentation's CLI reference is generated from, so each command's help says it all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icegate_dagster import render
from icegate_dagster.config import (
    EMBEDDED_DIR,
    IcegateConfig,
    format_bytes,
    format_duration,
    load_config,
)
from icegate_dagster.errors import IcegateError
from icegate_dagster.maintenance import OPERATIONS, Maintainer, TableRef, TableResult, TableStats

if TYPE_CHECKING:
    from dagster import DagsterInstance
    from pyiceberg.table import Table

    from icegate_dagster.maintenance.health.score import TableHealth
    from icegate_dagster.maintenance.sharing import Sharing

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_CODES = (
    f"exit codes: {EXIT_OK} every operation succeeded; {EXIT_FAILED} any operation or table "
    "failed (after all ran; a table that does not exist, e.g. dropped before its run, counts "
    "as failed and gets a failed log row for each operation it would have run); "
    f"{EXIT_USAGE} bad usage or configuration"
)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every subcommand, its options and their help."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        metavar="PATH",
        help="icegate.yaml to use (default: $ICEGATE_CONFIG, ./icegate.yaml, embedded default)",
    )
    common.add_argument("--json", action="store_true", help="print machine-readable JSON")

    parser = argparse.ArgumentParser(
        prog="icegate-maintain",
        description="Maintain the Iceberg tables of a lakehouse: compact, expire, clean up.",
        epilog=EXIT_CODES,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="build the demo lakehouse in ./.icegate and maintain it",
        description="Rebuild the demo lakehouse (refusing a folder it did not build) and run a "
        "full pass over it, printing each table before and after.",
    )
    demo.add_argument("--root", default=EMBEDDED_DIR, help="folder of the demo lakehouse")
    _history_option(demo)
    sub.add_parser("discover", parents=[common], help="list the tables that would be maintained")
    status = sub.add_parser(
        "status",
        parents=[common],
        help="files, bytes, snapshots per table",
        description="Data files, small files, delete files, bytes, snapshots, manifests, rows, "
        "health score and due operations per table, from metadata only (no JVM). A table "
        "excluded from maintenance shows `excluded` as its due operations and why, one whose "
        "rewrites are left to Amoro says so, and a table sharing its location with others "
        "names them, with a warning below the table when it does so without "
        "`gc.enabled=false` (--json: `health.state`, `health.excluded`, "
        "`health.excluded_operations`, `health.withheld`, and `sharing`: `overlapping`, "
        "`unsafe`, `warning`). Warnings and exclusions do not change the exit code.",
    )
    status.add_argument("--table", action="append", metavar="T", help="namespace.table")
    run = sub.add_parser(
        "run",
        parents=[common],
        help="full maintenance pass",
        description="A full pass over the given tables, or every discovered table. With "
        "--dry-run it plans from metadata, lists orphans, changes nothing and writes no log "
        "rows. Recorded in a Dagster instance when one is configured (--dagster-home).",
    )
    run.add_argument(
        "--table", action="append", metavar="T", help="only these, as namespace.table (repeatable)"
    )
    run.add_argument("--dry-run", action="store_true", help="plan only: change nothing")
    _history_option(run)
    for name, operation in OPERATIONS.cli_commands().items():
        one = sub.add_parser(
            name, parents=[common], help=f"run {operation.name} only: {operation.description}"
        )
        one.add_argument(
            "--table",
            action="append",
            metavar="T",
            required=True,
            help="namespace.table (repeatable)",
        )
        modes = one.add_mutually_exclusive_group()
        modes.add_argument("--dry-run", action="store_true", help=operation.dry_run_help)
        if name == "orphans":  # deferred deletion: collect now, delete later
            modes.add_argument(
                "--collect",
                action="store_true",
                help="record the orphan candidates in the candidates table; delete nothing",
            )
            modes.add_argument(
                "--delete-collected",
                action="store_true",
                help="delete the collected candidates still unreferenced, old and unchanged",
            )
        if operation.force_help is not None:
            one.add_argument("--force", action="store_true", help=operation.force_help)
        _history_option(one)
    migrate = sub.add_parser(
        "migrate",
        parents=[common],
        help="create IceGate's logs/spans/metrics/events tables or add their missing columns",
        description="Create IceGate's logs, spans, metrics and events tables in the namespace, "
        "or add the columns they lack; prints what changed; exit 1 if a table failed.",
    )
    migrate.add_argument(
        "--namespace", metavar="NS", help="default: the first of namespaces, else lakehouse"
    )
    rollback = sub.add_parser(
        "rollback",
        parents=[common],
        help="make an earlier snapshot current again (logged)",
        description="Make snapshot N current again (Iceberg's rollback_to_snapshot), logged as "
        "operation `rollback`; an id not in the table's history is refused with the ids it has.",
    )
    rollback.add_argument("--table", required=True, metavar="T", help="namespace.table")
    rollback.add_argument(
        "--snapshot-id", required=True, type=int, metavar="N", help="the snapshot to make current"
    )
    serve = sub.add_parser(
        "serve",
        help="export the lakehouse's maintenance to Prometheus (/metrics), with /health and "
        "/status/compaction (long-running, no JVM)",
        description="The Prometheus exporter, /health and /status/compaction, until SIGTERM or "
        "Ctrl-C (exit 0); bad options, a bad configuration or an address it cannot listen on "
        "exit 2 before it serves. With $ICEGATE_SERVE_BASIC_AUTH (user:password) or "
        "$ICEGATE_SERVE_BASIC_AUTH_FILE (a file holding it) set, /metrics and "
        "/status/compaction require those credentials (HTTP basic auth); /health answers its "
        "status to anyone, its details only with them.",
    )
    serve.add_argument(
        "--config",
        metavar="PATH",
        help="icegate.yaml to use (default: $ICEGATE_CONFIG, ./icegate.yaml, embedded default)",
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    serve.add_argument(
        "--port", default=8080, type=int, help="port to listen on (default: %(default)s)"
    )
    serve.add_argument(
        "--max-age",
        default="60s",
        metavar="DURATION",
        help="refresh the figures this often: a scrape serves figures at most about this old "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--dagster-home",
        metavar="DIR",
        help="also check this Dagster instance and its daemon's heartbeat (default: "
        "$DAGSTER_HOME when set)",
    )
    return parser


def _history_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dagster-home",
        metavar="DIR",
        help="record the pass in this Dagster instance, as a run would (default: "
        "$DAGSTER_HOME when set; neither: record nothing)",
    )


def _targets(maintainer: Maintainer, names: list[str] | None) -> list[TableRef | TableResult]:
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


def _maintain(
    maintainer: Maintainer,
    names: list[str] | None,
    operations: Sequence[str] | None,
    dry_run: bool,
    force: bool = False,
) -> list[TableResult]:
    targets = [_failed_ops(maintainer, t, operations, dry_run) for t in _targets(maintainer, names)]
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


def _emit_results(
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


def _recorded(
    instance: DagsterInstance | None, maintainer: Maintainer, results: list[TableResult]
) -> str | None:
    """Record a pass in the Dagster instance, if one is configured (see ``cli_history``);
    what was recorded. Why it could not be goes to stderr: the pass and its log rows
    stand, so the exit code is the pass's."""
    if instance is None:
        return None
    from icegate_dagster.cli_history import record_or_warn

    try:
        recorded, line = record_or_warn(instance, maintainer, results)
    finally:
        instance.dispose()
    if not recorded:
        print(f"icegate-maintain: warning: {line}", file=sys.stderr)
    return line


def _instance(args: argparse.Namespace) -> DagsterInstance | None:
    """The Dagster instance a maintaining command records in, if one is configured (only
    Dagster's import cost when one is). One named by ``--dagster-home`` that cannot be
    opened is bad usage (exit 2, before anything runs); one that ``$DAGSTER_HOME`` merely
    points at gets a warning, and the pass runs as without one."""
    if getattr(args, "dry_run", False) or "dagster_home" not in args:
        return None
    if not args.dagster_home and not os.environ.get("DAGSTER_HOME"):
        return None
    from icegate_dagster.cli_history import open_instance

    try:
        return open_instance(args.dagster_home)
    except IcegateError as exc:
        if args.dagster_home:
            raise
        print(f"icegate-maintain: warning: {exc}; the pass is not recorded", file=sys.stderr)
        return None


def _health(maintainer: Maintainer, ref: TableRef, table: Table) -> TableHealth:
    """The table's health score and due operations, from metadata (and its WAL folder)."""
    from icegate_dagster.maintenance.health.score import assess_table
    from icegate_dagster.maintenance.wal import wal_stats

    config = maintainer.config
    wal = wal_stats(config.wal_root, ref) if config.wal_root else None
    return assess_table(table, ref.key, maintainer.settings(ref), datetime.now(UTC), wal)


def _status(maintainer: Maintainer, names: list[str] | None, as_json: bool) -> int:
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
    for target in _targets(maintainer, names):
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


def _migrate(maintainer: Maintainer, namespace: str | None, as_json: bool) -> int:
    from icegate_dagster.maintenance.migrate import migrate, target_namespace

    target = target_namespace(maintainer.config.namespaces, namespace)
    results = migrate(maintainer.catalog, target)
    if as_json:
        print(json.dumps({"namespace": target, "tables": [r.as_dict() for r in results]}, indent=2))
    else:
        rows = [[r.table, r.action, r.error or ", ".join(r.added_columns) or "-"] for r in results]
        print(render.text_table(["table", "action", "columns added / error"], rows))
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILED


def _deferred_orphans(maintainer: Maintainer, names: list[str], delete: bool, as_json: bool) -> int:
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


def _serve(args: argparse.Namespace) -> int:
    """``serve``: the exporter until SIGTERM or Ctrl-C (exit 0); bad options, configuration
    or an address it cannot listen on exit 2 before it serves."""
    import signal
    import threading

    from icegate_dagster.config import parse_duration
    from icegate_dagster.errors import ConfigError
    from icegate_dagster.monitoring.server import Exporter, make_server
    from icegate_dagster.monitoring.serving import AUTH_VARIABLE, basic_auth_from_environment

    auth = basic_auth_from_environment()
    try:
        max_age = parse_duration(args.max_age)
    except ValueError as exc:
        raise ConfigError(f"invalid --max-age = {args.max_age!r}: {exc}") from None
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"invalid --port = {args.port}: must be between 0 and 65535")
    config = load_config(args.config)
    instance = None
    if args.dagster_home or os.environ.get("DAGSTER_HOME"):
        from icegate_dagster.cli_history import open_instance

        try:
            instance = open_instance(args.dagster_home)
        except IcegateError as exc:
            if args.dagster_home:
                raise
            print(f"icegate-maintain: warning: {exc}; serving without it", file=sys.stderr)
    exporter = Exporter(config, max_age_s=max_age.total_seconds(), instance=instance)
    try:
        server = make_server(exporter, args.host, args.port, auth=auth)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {exc}") from None
    host, port = str(server.server_address[0]), int(server.server_address[1])
    print(
        f"icegate-maintain serve: http://{host}:{port}/metrics, /health, /status/compaction "
        f"(figures refreshed every {format_duration(max_age)}; "
        f"{'credentials required' if auth else 'no credentials required'}; Ctrl-C to stop)",
        flush=True,
    )
    if auth is None and not _loopback(host):
        print(
            f"icegate-maintain: warning: anyone who reaches {host}:{port} can read the figures; "
            f"set {AUTH_VARIABLE} (see docs: Monitoring) or keep it behind a proxy",
            file=sys.stderr,
            flush=True,
        )

    def stop(signum: int, frame: object) -> None:
        # shutdown() waits for serve_forever to return: from another thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    exporter.start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        exporter.stop()
        if instance is not None:
            instance.dispose()
    return EXIT_OK


def _loopback(host: str) -> bool:
    """Whether ``host`` (an address the exporter listens on) is this machine's loopback."""
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _command(args: argparse.Namespace) -> int:
    if args.command == "serve":
        return _serve(args)
    if args.command == "demo":
        from icegate_dagster.demo import build_demo_lakehouse

        if not args.json:
            print(f"building the demo lakehouse in {Path(args.root).resolve()} ...", flush=True)
        instance = _instance(args)
        config: IcegateConfig = build_demo_lakehouse(Path(args.root))
        maintainer = Maintainer(config)
        if not args.json:
            names = [op.name for op in OPERATIONS if op.applies(config, config.defaults)]
            print(f"maintaining it ({', '.join(names)}) ...", flush=True)
        results = maintainer.maintain(maintainer.discover())
        history = _recorded(instance, maintainer, results)
        code = _emit_results(results, args.json, maintainer.run_id, history)
        if not args.json:
            print(f"\nlog rows appended to {config.log_table} (run_id {maintainer.run_id})")
        return code

    config = load_config(args.config)
    maintainer = Maintainer(config)
    if args.command == "discover":
        tables = [ref.key for ref in maintainer.discover()]
        print(json.dumps(tables) if args.json else "\n".join(tables) or "no tables found")
        return EXIT_OK
    if args.command == "status":
        return _status(maintainer, args.table, args.json)
    if args.command == "migrate":
        return _migrate(maintainer, args.namespace, args.json)
    if args.command == "rollback":
        ref = maintainer.resolve(args.table)
        return _emit_results(
            [maintainer.rollback(ref, args.snapshot_id)], args.json, maintainer.run_id
        )
    if args.command == "orphans" and (args.collect or args.delete_collected):
        return _deferred_orphans(maintainer, args.table, args.delete_collected, args.json)
    instance = _instance(args)
    if args.command == "run":
        results = _maintain(maintainer, args.table, None, args.dry_run)
    else:
        operation = OPERATIONS.cli_commands()[args.command]
        results = _maintain(
            maintainer,
            args.table,
            [operation.name],
            args.dry_run,
            force=getattr(args, "force", False),
        )
    history = _recorded(instance, maintainer, results)
    return _emit_results(results, args.json, maintainer.run_id, history)


def run_cli(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code; the Spark session is left running."""
    args = build_parser().parse_args(argv)
    try:
        return _command(args)
    except IcegateError as exc:
        print(f"icegate-maintain: error: {_scrubbed(str(exc), args)}", file=sys.stderr)
        return exc.exit_code


def _scrubbed(text: str, args: argparse.Namespace) -> str:
    """``text`` without any secret of the command's configuration (when it loads)."""
    from icegate_dagster.config.secrets import scrub

    try:
        config = load_config(args.config) if args.command != "demo" else None
    except IcegateError:  # no configuration, so no secret is known
        return text
    return text if config is None else scrub(text, config)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``icegate-maintain``: run the command, then stop Spark if it started."""
    from icegate_dagster.spark.session import stop_spark

    try:
        return run_cli(argv)
    except KeyboardInterrupt:
        print("icegate-maintain: interrupted", file=sys.stderr)
        return 130
    finally:
        stop_spark()


if __name__ == "__main__":
    sys.exit(main())
