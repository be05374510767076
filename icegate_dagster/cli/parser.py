"""The whole command line of ``icegate-maintain``, and its exit codes.

:func:`build_parser` is also what the documentation's CLI reference is generated from
(``docs/gen/cli_reference.py``), so each command's help says it all.
"""

from __future__ import annotations

import argparse

from icegate_dagster.config import EMBEDDED_DIR
from icegate_dagster.maintenance import OPERATIONS

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
    serve.add_argument(
        "--operation-detail",
        action="store_true",
        help="also export every series per table and operation (last attempt and success, "
        "outcome, failures, per-table counters, health penalties; about 49 series a table "
        "and 9 more per operation run on it) and the table gauges no shipped alert or "
        "panel reads. Default: at most 25 series a table, those the shipped alert rules "
        "and dashboard read, the counters summed over the tables",
    )
    return parser


def _history_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dagster-home",
        metavar="DIR",
        help="record the pass in this Dagster instance, as a run would (default: "
        "$DAGSTER_HOME when set; neither: record nothing)",
    )
