"""Spark's jars: Maven Central's own, pinned by SHA-256 in ``jars.lock``, fetched once by
set-up (``scripts/fetch-jars.sh``, over real HTTP from a loopback repository here) and found
at run time in set-up's folder or ``ICEGATE_SPARK_JARS_DIR``; a user's own jars win."""

from __future__ import annotations

import hashlib
import http.server
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from icegate_dagster.config import config_from_dict
from icegate_dagster.errors import SparkStartError
from icegate_dagster.spark.conf import build_spark_conf
from icegate_dagster.spark.jars import (
    JARS_DIR_ENV,
    SETUP_JARS_DIR,
    connect_server_jar,
    iceberg_runtime_jar,
    pinned_jars,
    s3_jars,
    s3_jars_available,
)
from icegate_dagster.spark.line import DEFAULT_LINE, SPARK4_LINE, line_of, running_line

REPO = Path(__file__).resolve().parents[2]
FETCH = REPO / "scripts" / "fetch-jars.sh"
PYSPARK_JARS = Path(__import__("pyspark").__file__).parent / "jars"


class _Repository:
    """A Maven-layout repository served on loopback; counts the requests per path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        repository = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
                repository.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def publish(self, coordinates: str, content: bytes) -> str:
        group, artifact, version = coordinates.split(":")
        path = f"{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.jar"
        (self.root / path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / path).write_bytes(content)
        return "/" + path


@pytest.fixture
def repository(tmp_path: Path) -> Iterator[_Repository]:
    repo = _Repository(tmp_path / "maven")
    thread = threading.Thread(target=repo.server.serve_forever, daemon=True)
    thread.start()
    yield repo
    repo.server.shutdown()
    repo.server.server_close()


def _fetch(repo: _Repository, lock: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ICEGATE_MAVEN_REPOSITORY": repo.url, "ICEGATE_JARS_LOCK": str(lock)}
    return subprocess.run(
        [str(FETCH), str(dest)], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_setup_fetches_each_pinned_jar_once_and_verified(
    repository: _Repository, tmp_path: Path
) -> None:
    content = b"PK\x03\x04 a jar of this test"
    path = repository.publish("org.example:thing:1.2.3", content)
    lock = tmp_path / "jars.lock"
    lock.write_text(f"# a comment\norg.example:thing:1.2.3 {hashlib.sha256(content).hexdigest()}\n")
    dest = tmp_path / "jars"

    first = _fetch(repository, lock, dest)
    assert first.returncode == 0, first.stderr
    assert (dest / "thing-1.2.3.jar").read_bytes() == content
    assert sorted(p.name for p in dest.iterdir()) == ["thing-1.2.3.jar"]
    assert repository.requests == [path]

    # Present and verified: not fetched again.
    again = _fetch(repository, lock, dest)
    assert again.returncode == 0, again.stderr
    assert repository.requests == [path]

    # A damaged copy (a cut download, an edited file) is fetched again and replaced.
    (dest / "thing-1.2.3.jar").write_bytes(content[:5])
    repaired = _fetch(repository, lock, dest)
    assert repaired.returncode == 0, repaired.stderr
    assert (dest / "thing-1.2.3.jar").read_bytes() == content
    assert repository.requests == [path, path]


def test_a_checksum_mismatch_fails_setup_naming_the_jar_and_both_sums(
    repository: _Repository, tmp_path: Path
) -> None:
    served = b"PK\x03\x04 not the jar that was pinned"
    repository.publish("org.example:thing:1.2.3", served)
    expected = hashlib.sha256(b"the pinned jar").hexdigest()
    lock = tmp_path / "jars.lock"
    lock.write_text(f"org.example:thing:1.2.3 {expected}\n")
    dest = tmp_path / "jars"

    proc = _fetch(repository, lock, dest)

    assert proc.returncode == 1
    actual = hashlib.sha256(served).hexdigest()
    assert (
        f"setup: org.example:thing:1.2.3 (thing-1.2.3.jar) failed its checksum: "
        f"expected SHA-256 {expected}, got {actual}"
    ) in proc.stderr
    assert list(dest.iterdir()) == []  # nothing unverified left where Spark looks

    missing = tmp_path / "missing.lock"
    missing.write_text(f"org.example:absent:9 {expected}\n")
    proc = _fetch(repository, missing, dest)
    assert proc.returncode == 1
    assert "could not fetch org.example:absent:9 from " in proc.stderr
    assert list(dest.iterdir()) == []


def test_the_lock_pins_one_iceberg_version_and_pysparks_own_hadoop() -> None:
    pins = {pin.artifact: pin for pin in pinned_jars(DEFAULT_LINE)}
    assert set(pins) == {
        "iceberg-spark-runtime-3.5_2.12",
        "iceberg-aws-bundle",
        "hadoop-aws",
        "aws-java-sdk-bundle",
        "spark-connect_2.12",
    }
    # Spark Connect's server is a server's jar only; the rest a run's own Spark loads.
    assert {a for a, pin in pins.items() if pin.role == "server"} == {"spark-connect_2.12"}
    # The AWS bundle must match the runtime; S3A must match the Hadoop inside PySpark.
    assert pins["iceberg-aws-bundle"].version == pins["iceberg-spark-runtime-3.5_2.12"].version
    if running_line() == DEFAULT_LINE:  # PySpark 3.5's own Hadoop (4.1's is 3.4.2)
        hadoop = sorted(PYSPARK_JARS.glob("hadoop-client-api-*.jar"))
        assert [p.name for p in hadoop] == [f"hadoop-client-api-{pins['hadoop-aws'].version}.jar"]
    assert pins["aws-java-sdk-bundle"].coordinates == "com.amazonaws:aws-java-sdk-bundle:1.12.262"
    assert all(len(pin.sha256) == 64 for pin in pins.values())


def test_set_up_put_the_pinned_jars_where_spark_finds_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """This environment's set-up: every pinned jar in its folder with its SHA-256."""
    monkeypatch.delenv(JARS_DIR_ENV, raising=False)
    for pin in pinned_jars():
        jar = SETUP_JARS_DIR / pin.file_name
        digest = hashlib.sha256()
        with jar.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        assert digest.hexdigest() == pin.sha256, jar
    assert iceberg_runtime_jar() == SETUP_JARS_DIR / pinned_jars()[0].file_name
    assert s3_jars_available()


def _folder_of_jars(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"PK\x03\x04")
    return folder


def _conf(tmp_path: Path, catalog: dict[str, str], spark_conf: dict[str, str]) -> dict[str, str]:
    raw = {"catalog": {"name": "c", **catalog}, "spark": {"conf": spark_conf}}
    return build_spark_conf(config_from_dict(raw, tmp_path))


LOCAL = {"uri": "sqlite:///c.db", "warehouse": "wh"}
IN_S3 = {"type": "rest", "uri": "http://127.0.0.1:1", "warehouse": "s3://wh"}
S3_JARS = ("iceberg-aws-bundle-1.9.9.jar", "hadoop-aws-3.3.4.jar", "aws-java-sdk-bundle-1.2.jar")


def test_the_jar_folder_and_a_users_own_jars_take_precedence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _folder_of_jars(
        tmp_path / "air-gapped", "iceberg-spark-runtime-3.5_2.12-1.9.9.jar", *S3_JARS
    )
    monkeypatch.setenv(JARS_DIR_ENV, str(folder))
    runtime = str(folder / "iceberg-spark-runtime-3.5_2.12-1.9.9.jar")
    s3 = [str(folder / name) for name in S3_JARS]

    # The folder's runtime replaces set-up's; S3 jars only for a lakehouse in S3.
    local = _conf(tmp_path, LOCAL, {})["spark.jars"].split(",")
    assert local[0] == runtime and not set(s3) & set(local)
    assert not any(str(SETUP_JARS_DIR) in jar for jar in local)
    in_s3 = _conf(tmp_path, IN_S3, {})["spark.jars"].split(",")
    assert in_s3[:4] == [runtime, *s3]
    assert s3_jars() == [Path(jar) for jar in s3]
    raw = {"catalog": {"name": "c", **LOCAL}, "wal": {"root": "s3://bucket/wal"}}
    assert set(s3) <= set(
        build_spark_conf(config_from_dict(raw, tmp_path))["spark.jars"].split(",")
    )

    # A user's runtime jar wins, and so does their AWS bundle (it must match their runtime).
    theirs = str(
        _folder_of_jars(
            tmp_path / "mine",
            "iceberg-spark-runtime-3.5_2.12-1.8.0.jar",
            "iceberg-aws-bundle-1.8.0.jar",
        )
    )
    their_jars = [
        f"{theirs}/iceberg-spark-runtime-3.5_2.12-1.8.0.jar",
        f"{theirs}/iceberg-aws-bundle-1.8.0.jar",
    ]
    own = _conf(tmp_path, IN_S3, {"spark.jars": ",".join(their_jars)})
    jars = own["spark.jars"].split(",")
    assert jars[:2] == their_jars
    assert runtime not in jars and s3[0] not in jars
    assert s3[1:] == [j for j in jars if j in s3]  # S3A does not depend on Iceberg's version
    # Packages by coordinates win as well; their own hadoop-aws replaces ours.
    packages = (
        "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.8.0,"
        "org.apache.iceberg:iceberg-aws-bundle:1.8.0,org.apache.hadoop:hadoop-aws:3.3.4"
    )
    by_coordinates = _conf(tmp_path, IN_S3, {"spark.jars.packages": packages})
    assert by_coordinates["spark.jars.packages"] == packages
    assert [j for j in by_coordinates["spark.jars"].split(",") if j.startswith(str(folder))] == [
        s3[2]
    ]


def test_the_connect_servers_jar_never_reaches_a_runs_class_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Set-up fetches Spark Connect's server beside the run's jars; the lock marks it a
    server's jar, so a local session (in S3 too, which takes every other jar) leaves it out."""
    server = "spark-connect_2.12-3.5.7.jar"
    folder = _folder_of_jars(
        tmp_path / "jars", "iceberg-spark-runtime-3.5_2.12-1.12.0.jar", *S3_JARS, server
    )
    monkeypatch.setenv(JARS_DIR_ENV, str(folder))
    for catalog in (LOCAL, IN_S3):
        jars = _conf(tmp_path, catalog, {})["spark.jars"]
        assert "iceberg-spark-runtime" in jars and server not in jars
    assert connect_server_jar() == folder / server


def test_a_missing_or_ambiguous_runtime_is_refused_before_the_jvm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = _folder_of_jars(tmp_path / "empty")
    monkeypatch.setenv(JARS_DIR_ENV, str(empty))
    with pytest.raises(SparkStartError) as refused:
        _conf(tmp_path, LOCAL, {})
    message = str(refused.value)
    assert f"no iceberg-spark-runtime-3.5_2.12 jar in {empty}: run scripts/setup.sh" in message
    assert JARS_DIR_ENV in message and "spark.jars.packages" in message
    # A user's runtime needs no folder at all.
    package = "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.9.2"
    conf = _conf(tmp_path, LOCAL, {"spark.jars.packages": package})
    assert conf["spark.jars.packages"] == package
    assert "iceberg-spark-runtime" not in conf["spark.jars"]

    two = _folder_of_jars(
        tmp_path / "two",
        "iceberg-spark-runtime-3.5_2.12-1.9.9.jar",
        "iceberg-spark-runtime-3.5_2.12-1.10.0.jar",
    )
    monkeypatch.setenv(JARS_DIR_ENV, str(two))
    with pytest.raises(SparkStartError, match="holds several iceberg-spark-runtime-3.5_2.12 jars"):
        _conf(tmp_path, LOCAL, {})
    # The pinned version is chosen when it is among them (set-up's folder after an upgrade).
    pinned = pinned_jars()[0].file_name
    _folder_of_jars(two, pinned)
    assert _conf(tmp_path, LOCAL, {})["spark.jars"].split(",")[0] == str(two / pinned)


def test_s3_keys_beside_a_warehouse_elsewhere_give_each_path_the_file_io_of_its_scheme(
    tmp_path: Path,
) -> None:
    """A SQL catalog on local disk (or another store) whose ``s3.*`` keys serve an ``s3://``
    WAL or a table placed in S3: Spark's catalog gets Iceberg's ResolvingFileIO (Hadoop's
    file systems for ``file:`` paths, S3FileIO with the keys for ``s3://``), never S3FileIO
    alone, which would be handed file paths; the WAL's bucket gets S3A settings and the S3
    jars join the class path."""
    raw = {
        "catalog": {
            "name": "c",
            "uri": f"sqlite:///{tmp_path}/c.db",
            "warehouse": f"file://{tmp_path}/wh",
            "s3.endpoint": "http://127.0.0.1:9",
        },
        "wal": {"root": "s3://wal/root"},
    }
    conf = build_spark_conf(config_from_dict(raw, tmp_path))
    assert conf["spark.sql.catalog.c.io-impl"] == "org.apache.iceberg.io.ResolvingFileIO"
    # What S3FileIO needs for a table in S3 comes along, as for a catalog in S3.
    assert conf["spark.sql.catalog.c.client.region"] == "us-east-1"
    assert conf["spark.sql.catalog.c.s3.path-style-access"] == "true"
    assert conf["spark.hadoop.fs.s3a.bucket.wal.endpoint"] == "http://127.0.0.1:9"
    assert "iceberg-aws-bundle" in conf["spark.jars"]
    # A warehouse in another store, and a relative one (made a file: URI at load), alike.
    for warehouse in ("hdfs://namenode/wh", "wh"):
        raw["catalog"]["warehouse"] = warehouse
        other = build_spark_conf(config_from_dict(raw, tmp_path))
        assert other["spark.sql.catalog.c.io-impl"] == "org.apache.iceberg.io.ResolvingFileIO"
    # No WAL in S3: the keys may still serve a table in S3, so the S3 jars still come.
    del raw["wal"]
    assert "iceberg-aws-bundle" in build_spark_conf(config_from_dict(raw, tmp_path))["spark.jars"]
    # The same keys with the warehouse in S3: the tables are read through S3FileIO.
    raw["catalog"]["warehouse"] = "s3://tables/wh"
    in_s3 = build_spark_conf(config_from_dict(raw, tmp_path))
    assert in_s3["spark.sql.catalog.c.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    # An io-impl of the user's own wins.
    raw["catalog"].update({"warehouse": f"file://{tmp_path}/wh", "io-impl": "x.MyFileIO"})
    own = build_spark_conf(config_from_dict(raw, tmp_path))
    assert own["spark.sql.catalog.c.io-impl"] == "x.MyFileIO"


def _pysparks_own_line() -> str:
    """``4.1_2.13``: the running PySpark's major.minor and the Scala of its own jars."""
    import pyspark

    [scala] = PYSPARK_JARS.glob("scala-library-*.jar")
    scala_version = ".".join(scala.name.removeprefix("scala-library-").split(".")[:2])
    return ".".join(pyspark.__version__.split(".")[:2]) + "_" + scala_version


def test_the_session_takes_the_iceberg_runtime_of_the_running_pysparks_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Iceberg's runtime is built per Spark line and Scala version: the jar set-up put where
    Spark looks, and the one the session is given, are the running PySpark's (3.5_2.12 in
    .venv, 4.1_2.13 in .venv-spark4), as PySpark's own Scala library says."""
    monkeypatch.delenv(JARS_DIR_ENV, raising=False)
    line = _pysparks_own_line()
    assert running_line().name == line
    runtime = iceberg_runtime_jar()
    assert runtime.name.startswith(f"iceberg-spark-runtime-{line}-"), runtime
    assert runtime == SETUP_JARS_DIR / runtime.name


def test_each_spark_line_has_its_lock_with_the_same_iceberg() -> None:
    assert line_of("3.5.9") == DEFAULT_LINE and line_of("4.1.4") == SPARK4_LINE
    spark4 = {pin.artifact: pin for pin in pinned_jars(SPARK4_LINE)}
    assert spark4["iceberg-spark-runtime-4.1_2.13"].coordinates == (
        "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0"
    )
    default = {pin.artifact: pin for pin in pinned_jars(DEFAULT_LINE)}
    assert spark4["iceberg-spark-runtime-4.1_2.13"].version == (
        default["iceberg-spark-runtime-3.5_2.12"].version
    )
    assert all(len(pin.sha256) == 64 for pin in spark4.values())


def test_a_pyspark_on_no_supported_line_or_without_its_jars_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Iceberg 1.12 publishes no Spark 4.0 runtime: PySpark 4.0 is refused naming the lines
    there are; the 4.1 line's missing jar names the set-up command that fetches it."""
    with pytest.raises(SparkStartError) as refused:
        line_of("4.0.1")
    assert str(refused.value) == (
        "PySpark 4.0.1 is on no supported Spark line: install one of "
        "3.5 (scripts/setup.sh), 4.1 (scripts/setup.sh --spark4)"
    )
    empty = _folder_of_jars(tmp_path / "empty")
    monkeypatch.setenv(JARS_DIR_ENV, str(empty))
    with pytest.raises(SparkStartError) as missing:
        iceberg_runtime_jar(SPARK4_LINE)
    assert str(missing.value).startswith(
        f"no iceberg-spark-runtime-4.1_2.13 jar in {empty}: run scripts/setup.sh --spark4 "
        "(it fetches org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0 from Maven Central"
    )
    # A 3.5 runtime beside it is not taken for the 4.1 line's (another Scala, another Spark).
    _folder_of_jars(empty, "iceberg-spark-runtime-3.5_2.12-1.12.0.jar")
    with pytest.raises(SparkStartError, match="no iceberg-spark-runtime-4.1_2.13 jar"):
        iceberg_runtime_jar(SPARK4_LINE)
