"""A throw-away PostgreSQL server on loopback, and a lakehouse whose catalog lives in it.

Debian's ``postgresql`` package provides ``initdb`` and ``pg_ctl`` under
``/usr/lib/postgresql/<version>/bin``. ``initdb`` refuses to run as root, so when
the tests run as root the server is set up and run as the ``postgres`` OS user,
in a temporary folder that user owns. The server listens on 127.0.0.1 on a free
port (password login, scram-sha-256) and keeps its unix socket in that folder
(trusted, used only to create the test role and database).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import pwd
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from icegate_dagster.catalog import open_catalog
from icegate_dagster.config import load_config
from tests.lakehouse import Lakehouse
from tests.servers import free_port, log_tail

POSTGRES_ROOT = Path("/usr/lib/postgresql")
SERVER_USER = "postgres"


def postgres_bin_dir() -> Path:
    """``bin`` of the newest installed PostgreSQL that has ``initdb`` and ``pg_ctl``."""

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", path.parent.name))

    found = [
        d
        for d in POSTGRES_ROOT.glob("*/bin")
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file()
    ]
    if not found:
        raise RuntimeError(
            f"no PostgreSQL server under {POSTGRES_ROOT}/*/bin: install Debian's postgresql "
            "(scripts/setup.sh --test does)"
        )
    return max(found, key=version)


@dataclass(frozen=True)
class PostgresServer:
    """A running server and the database and login role made for the tests."""

    root: Path
    port: int
    database: str
    user: str
    password: str
    host: str = "127.0.0.1"
    #: How the server was started (``pg_ctl ... start``): :func:`restart` starts it so again.
    start_command: tuple[str, ...] = ()

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "socket"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    def uri(self, password: str) -> str:
        """The pyiceberg (SQLAlchemy) catalog URI, with ``password`` as given."""
        return (
            f"postgresql+psycopg2://{self.user}:{password}@{self.host}:{self.port}/{self.database}"
        )

    def connect(self) -> Any:
        """A psycopg2 connection over TCP with the role's password (autocommit)."""
        import psycopg2  # type: ignore[import-untyped]

        conn = psycopg2.connect(
            host=self.host,
            port=self.port,
            dbname=self.database,
            user=self.user,
            password=self.password,
            connect_timeout=10,
        )
        conn.autocommit = True
        return conn

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows of one query, on a fresh connection."""
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall())
        finally:
            conn.close()


def _as_server_user(command: list[str]) -> list[str]:
    """Run as ``postgres`` when we are root (initdb refuses root), else as ourselves."""
    if os.geteuid() == 0:
        return ["runuser", "-u", SERVER_USER, "--", *command]
    return command


def _run(command: list[str], cwd: Path, what: str, timeout: float = 120) -> None:
    done = subprocess.run(
        _as_server_user(command),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): {done.stdout}\n{done.stderr}")


def _stop(bin_dir: Path, root: Path) -> None:
    """Stop the server of ``root`` if it runs: fast shutdown, immediate if that hangs."""
    data = root / "data"
    if not (data / "postmaster.pid").exists():
        return
    for mode in ("fast", "immediate"):
        stop = [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", mode, "-w", "-t", "30", "stop"]
        with contextlib.suppress(subprocess.TimeoutExpired):
            done = subprocess.run(
                _as_server_user(stop), cwd=root, capture_output=True, timeout=40, check=False
            )
            if done.returncode == 0 or not (data / "postmaster.pid").exists():
                return


@contextlib.contextmanager
def postgres_server(database: str = "lakehouse", user: str = "icegate") -> Iterator[PostgresServer]:
    """Start a fresh server with ``database`` owned by ``user`` (random password); always
    stopped and deleted on exit, also when the block fails."""
    import psycopg2

    bin_dir = postgres_bin_dir()
    # Not under pytest's tmp_path: that is root-only (0700), the postgres user cannot enter it.
    root = Path(tempfile.mkdtemp(prefix="icegate-pg-"))
    try:
        (root / "socket").mkdir()
        if os.geteuid() == 0:
            owner = pwd.getpwnam(SERVER_USER)
            for path in (root, root / "socket"):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        server = PostgresServer(
            root=root,
            port=free_port(),
            database=database,
            user=user,
            password=f"pg-{secrets.token_hex(12)}",
        )
        _run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(server.data_dir),
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            cwd=root,
            what="initdb",
        )
        options = " ".join(
            [
                "-c listen_addresses=127.0.0.1",
                f"-p {server.port}",
                f"-k {shlex.quote(str(server.socket_dir))}",
                # A disposable test database: durability only costs time here.
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off",
            ]
        )
        start = [
            str(bin_dir / "pg_ctl"),
            "-D",
            str(server.data_dir),
            "-l",
            str(server.log_file),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        ]
        server = dataclasses.replace(server, start_command=tuple(start))
        try:
            _run(start, cwd=root, what="pg_ctl start", timeout=90)
        except RuntimeError as exc:
            tail = log_tail(server.log_file, lines=60)
            raise RuntimeError(f"{exc}\nlast lines of {server.log_file}:\n{tail}") from None
        admin = psycopg2.connect(
            host=str(server.socket_dir), port=server.port, user="postgres", dbname="postgres"
        )
        try:
            admin.autocommit = True
            with admin.cursor() as cur:
                cur.execute(f"CREATE ROLE {user} LOGIN PASSWORD %s", (server.password,))
                cur.execute(f"CREATE DATABASE {database} OWNER {user}")
        finally:
            admin.close()
        yield server
    finally:
        _stop(bin_dir, root)
        shutil.rmtree(root, ignore_errors=True)


def stop(server: PostgresServer) -> None:
    """Stop the server (a fast shutdown: clients get errors, as in a failover)."""
    _stop(postgres_bin_dir(), server.root)


def start(server: PostgresServer) -> None:
    """Start a stopped server again, as it was started."""
    _run(list(server.start_command), cwd=server.root, what="pg_ctl start", timeout=90)


def make_postgres_lakehouse(
    root: Path, server: PostgresServer, password_env: str, maintain: dict[str, Any] | None = None
) -> Lakehouse:
    """A lakehouse whose catalog is in ``server`` and whose warehouse is a folder under ``root``.

    The config file names the password only as ``${password_env}``; the variable must be
    set while the config is loaded. The catalog name is unique in the process (the suite
    shares one Spark session, which keeps one catalog per name).
    """
    root.mkdir(parents=True, exist_ok=True)
    raw = {
        "catalog": {
            "name": f"test_pg_{uuid.uuid4().hex[:8]}",
            "uri": server.uri("${" + password_env + "}"),
            "warehouse": (root / "warehouse").as_uri(),
        },
        "spark": {"master": "local[2]"},
        "maintain": maintain or {},
    }
    config_path = root / "icegate.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    config = load_config(config_path)
    return Lakehouse(root, config_path, config, open_catalog(config.catalog))


@contextlib.contextmanager
def captured_output() -> Iterator[list[str]]:
    """Capture everything printed while the block runs: Python's streams, Python logging and
    file descriptors 1 and 2 (a JVM started inside the block writes there). The text is in
    the yielded list after the block."""
    texts = io.StringIO()
    handler = logging.StreamHandler(texts)
    handler.setLevel(logging.DEBUG)
    root_logger = logging.getLogger()
    lines: list[str] = []
    with tempfile.TemporaryFile() as sink:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            root_logger.addHandler(handler)
            with contextlib.redirect_stdout(texts), contextlib.redirect_stderr(texts):
                yield lines
        finally:
            root_logger.removeHandler(handler)
            sys.stdout.flush()
            sys.stderr.flush()
            time.sleep(0.2)  # let the JVM's last lines land
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            lines += [sink.read().decode(errors="replace"), texts.getvalue()]
