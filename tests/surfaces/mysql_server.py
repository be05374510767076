"""A throw-away MariaDB (MySQL) server on loopback, for the lease store and the trigger's
memory on a MySQL database.

Debian's ``mariadb-server`` provides ``mariadb-install-db`` and ``mariadbd``; the server runs
as the ``mysql`` OS user in a temporary folder that user owns, listens on 127.0.0.1 on a free
port, and keeps its socket in that folder (root logs in over it to make the test database
and its password user).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.servers import free_port, log_tail

SERVER_USER = "mysql"


@dataclass(frozen=True)
class MySQLServer:
    """A running server and the database and login made for the tests."""

    root: Path
    port: int
    database: str
    user: str
    password: str

    @property
    def socket(self) -> Path:
        return self.root / "mysqld.sock"

    def uri(self) -> str:
        """A SQLAlchemy URL over TCP with the user's password."""
        return f"mysql+pymysql://{self.user}:{self.password}@127.0.0.1:{self.port}/{self.database}"

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """Rows of one statement, as root over the socket."""
        import pymysql

        conn = pymysql.connect(unix_socket=str(self.socket), user="root", database=self.database)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                rows = list(cur.fetchall())
            conn.commit()
            return rows
        finally:
            conn.close()


def available() -> bool:
    """Whether Debian's MariaDB server is installed (``scripts/setup.sh --test`` does)."""
    return shutil.which("mariadbd", path="/usr/sbin:/usr/bin") is not None


@contextlib.contextmanager
def mysql_server(database: str = "leases", user: str = "icegate") -> Iterator[MySQLServer]:
    """Start a fresh server with ``database`` and a password ``user`` on it; always stopped
    and deleted on exit, also when the block fails."""
    import pymysql

    root = Path(tempfile.mkdtemp(prefix="icegate-mysql-"))
    process: subprocess.Popen[bytes] | None = None
    try:
        if os.geteuid() == 0:
            owner = pwd.getpwnam(SERVER_USER)
            os.chown(root, owner.pw_uid, owner.pw_gid)
        server = MySQLServer(root, free_port(), database, user, f"my-{secrets.token_hex(12)}")
        data = root / "data"
        done = subprocess.run(
            [
                "mariadb-install-db",
                f"--user={SERVER_USER}",
                f"--datadir={data}",
                "--skip-test-db",
                "--auth-root-authentication-method=socket",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {done.stdout}\n{done.stderr}")
        log = root / "server.log"
        process = subprocess.Popen(
            [
                "/usr/sbin/mariadbd",
                "--no-defaults",
                f"--user={SERVER_USER}",
                f"--datadir={data}",
                f"--socket={server.socket}",
                f"--port={server.port}",
                "--bind-address=127.0.0.1",
                f"--log-error={log}",
                f"--pid-file={root / 'mysqld.pid'}",
                # A disposable test database: durability only costs time here.
                "--innodb-flush-log-at-trx-commit=0",
                "--skip-log-bin",
            ]
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                admin = pymysql.connect(unix_socket=str(server.socket), user="root")
                break
            except pymysql.err.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"mariadbd did not start:\n{log_tail(log, lines=40)}"
                    ) from None
                time.sleep(0.2)
        try:
            with admin.cursor() as cur:
                cur.execute(f"CREATE DATABASE {database}")
                cur.execute(
                    f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY %s", (server.password,)
                )
                cur.execute(f"GRANT ALL ON {database}.* TO '{user}'@'127.0.0.1'")
            admin.commit()
        finally:
            admin.close()
        yield server
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(root, ignore_errors=True)
