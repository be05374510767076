"""Which command runs: parse the command line, run the command, report an error without a
secret in it, stop Spark at exit (:func:`main`, the ``icegate-maintain`` entry point).

Exit codes (:data:`~icegate_dagster.cli.parser.EXIT_CODES`): 0 when every operation
succeeded, 1 when any failed (after all ran), 2 for bad usage or configuration.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from icegate_dagster.cli.demo import run_demo
from icegate_dagster.cli.migrate import migrate
from icegate_dagster.cli.orphans import deferred_orphans
from icegate_dagster.cli.parser import build_parser
from icegate_dagster.cli.passes import rollback, run_pass
from icegate_dagster.cli.serve import serve
from icegate_dagster.cli.status import discover, status
from icegate_dagster.config import load_config
from icegate_dagster.errors import IcegateError
from icegate_dagster.maintenance import Maintainer


def command(args: argparse.Namespace) -> int:
    """Run the command ``args`` names; its exit code."""
    if args.command == "serve":
        return serve(args)
    if args.command == "demo":
        return run_demo(args)
    maintainer = Maintainer(load_config(args.config))
    if args.command == "discover":
        return discover(maintainer, args.json)
    if args.command == "status":
        return status(maintainer, args.table, args.json)
    if args.command == "migrate":
        return migrate(maintainer, args.namespace, args.json)
    if args.command == "rollback":
        return rollback(maintainer, args.table, args.snapshot_id, args.json)
    if args.command == "orphans" and (args.collect or args.delete_collected):
        return deferred_orphans(maintainer, args.table, args.delete_collected, args.json)
    return run_pass(maintainer, args)


def run_cli(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code; the Spark session is left running."""
    args = build_parser().parse_args(argv)
    try:
        return command(args)
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
