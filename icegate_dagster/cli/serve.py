"""``serve``: the Prometheus exporter, ``/health`` and ``/status/compaction`` (long-running,
no JVM; see :mod:`icegate_dagster.monitoring`)."""

from __future__ import annotations

import argparse
import os
import sys

from icegate_dagster.cli.parser import EXIT_OK
from icegate_dagster.config import format_duration, load_config
from icegate_dagster.errors import IcegateError


def serve(args: argparse.Namespace) -> int:
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
        from icegate_dagster.cli.history import open_instance

        try:
            instance = open_instance(args.dagster_home)
        except IcegateError as exc:
            if args.dagster_home:
                raise
            print(f"icegate-maintain: warning: {exc}; serving without it", file=sys.stderr)
    exporter = Exporter(
        config,
        max_age_s=max_age.total_seconds(),
        instance=instance,
        operation_detail=args.operation_detail,
    )
    try:
        server = make_server(exporter, args.host, args.port, auth=auth)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {exc}") from None
    host, port = str(server.server_address[0]), int(server.server_address[1])
    print(
        f"icegate-maintain serve: http://{host}:{port}/metrics, /health, /status/compaction "
        f"(figures refreshed every {format_duration(max_age)}; "
        f"{'every series per operation' if args.operation_detail else 'series within the budget'}; "
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
