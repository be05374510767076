"""``wal_size_sensor`` ends within ``maintain.trigger.tick_deadline`` when listing
``wal.root`` does not (issue 37): the store is a real S3 client (pyarrow's) talking to a
real HTTP socket on loopback that holds its answer, trickling bytes so that no client
timeout ends the wait, until the test releases it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest
import yaml

from icegate_dagster.config import load_config
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.wal_sensor import wal_size_sensor
from tests.dagster.with_spark.test_wal import _skip, _tables
from tests.lakehouse import Lakehouse, LakehouseFactory

LOGS = "lakehouse.logs"
DEADLINE_S = 5
#: Liveness limit of a tick: its deadline and a generous margin.
LIVENESS_S = DEADLINE_S + 10
#: The WAL the store lists once released: five files of lakehouse.logs (over min_files).
WAL_KEYS = [f"wal/lakehouse/logs/wal-{i}.parquet" for i in range(5)]


class HeldS3:
    """Answers S3 ``ListObjectsV2`` requests, but holds each answer (its headers sent, then
    one padding byte at a time) until :meth:`release`, then completes it with ``WAL_KEYS``."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.requests: list[bytes] = []
        self._released = threading.Event()
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self._released.set()
        self._stop.set()
        self._server.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        body = (
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            "<Name>bucket</Name><Prefix>wal/</Prefix><MaxKeys>1000</MaxKeys>"
            f"<KeyCount>{len(WAL_KEYS)}</KeyCount><IsTruncated>false</IsTruncated>"
            + "".join(
                f"<Contents><Key>{key}</Key><LastModified>2026-11-27T00:00:0{i}.000Z"
                '</LastModified><ETag>"e"</ETag><Size>100</Size>'
                "<StorageClass>STANDARD</StorageClass></Contents>"
                for i, key in enumerate(WAL_KEYS)
            )
            + "</ListBucketResult>"
        ).encode()
        length = len(body) + 100_000  # room for the padding (XML allows leading blanks)
        with conn:
            try:
                self.requests.append(conn.recv(65536).split(b"\r\n")[0])
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\n"
                    + f"Content-Length: {length}\r\n\r\n".encode()
                )
                sent = 0
                while not self._released.wait(0.2) and sent < 100_000:
                    conn.sendall(b" ")  # keeps the client's low-speed timeout from firing
                    sent += 1
                conn.sendall(b" " * (100_000 - sent) + body)
            except OSError:
                return


@pytest.fixture
def held_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldS3]:
    server = HeldS3()
    # Throwaway keys, so that the S3 client signs its requests and asks no metadata service.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "icegate-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "icegate-test")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def lh(lakehouse_factory: LakehouseFactory, held_s3: HeldS3) -> Lakehouse:
    lakehouse = lakehouse_factory(
        maintain={
            "compaction": {"min_files": 4, "min_size_bytes": "1GB"},
            "trigger": {"tick_deadline": f"{DEADLINE_S}s"},
        }
    )
    lakehouse.add_table(LOGS, appends=1)
    raw = yaml.safe_load(lakehouse.config_path.read_text())
    raw["wal"] = {
        "root": f"s3://bucket/wal?endpoint_override=127.0.0.1:{held_s3.port}"
        "&scheme=http&region=us-east-1"
    }
    lakehouse.config_path.write_text(yaml.safe_dump(raw))
    lakehouse.config = load_config(lakehouse.config_path)
    return lakehouse


def _timed_tick(lh: Lakehouse, instance: dg.DagsterInstance) -> Any:
    """One tick in a thread of its own: its result, or a failure once it outlives its
    deadline by the liveness margin (the store is released then, so the thread ends)."""
    context = dg.build_sensor_context(
        instance=instance,
        resources={"lakehouse": LakehouseResource(config_path=str(lh.config_path))},
    )
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(wal_size_sensor(context)))
    started = time.monotonic()
    thread.start()
    thread.join(LIVENESS_S)
    assert not thread.is_alive(), (
        f"the tick was still running {time.monotonic() - started:.0f} s after it started "
        f"(tick_deadline {DEADLINE_S} s): the listing of wal.root is not under its deadline"
    )
    return outcome[0]


def test_a_listing_that_outlasts_the_tick_ends_the_tick_and_serves_the_next(
    lh: Lakehouse, instance: dg.DagsterInstance, held_s3: HeldS3
) -> None:
    first = _skip(_timed_tick(lh, instance))
    assert "the listing of wal.root started at" in first and "is still running" in first
    # The next tick waits for the same listing: no second one piles up on the store.
    second = _skip(_timed_tick(lh, instance))
    assert "is still running" in second
    assert first.split("started at ")[1].split()[0] == second.split("started at ")[1].split()[0]
    assert len(held_s3.requests) == 1 and b"list-type=2" in held_s3.requests[0]

    held_s3.release()  # the store answers: five WAL files of lakehouse.logs

    assert _tables(_timed_tick(lh, instance)) == [LOGS]
    assert len(held_s3.requests) == 1  # the held listing served that tick
