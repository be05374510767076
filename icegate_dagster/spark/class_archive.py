"""A class-data sharing archive of the Spark driver's classes, so that a cold process starts
its Spark session in about half the time.

Every CLI call and Dagster run is a fresh process with a cold JVM, which loads and verifies
thousands of Spark classes before the first query. The JVM can map them instead from an
archive made once (JDK class-data sharing, ``-XX:SharedArchiveFile``; see
:func:`~icegate_dagster.spark.jvm_options.class_sharing_options`). ``scripts/setup.sh``
makes it (``python -m icegate_dagster.spark.class_archive``) by running a small Iceberg workload
in a JVM started with ``-XX:ArchiveClassesAtExit``; a session started afterwards uses it
when it exists. An archive holds one Spark line's classes: its file is named by the line
(:func:`~icegate_dagster.spark.jvm_options.classes_archive`), and ``setup.sh --spark4`` makes
the 4.1 line's in ``.venv-spark4``. A JVM that cannot use it (another JDK, another class
path) starts as it would without it: ``-Xshare:auto``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from icegate_dagster.catalog import open_catalog
from icegate_dagster.config import load_config
from icegate_dagster.spark.jvm_options import QUIET_CLASS_SHARING, classes_archive
from icegate_dagster.spark.session import get_spark

_MODULE = "icegate_dagster.spark.class_archive"
#: Marks the line on which the workload names its JVM.
_PID_MARK = "spark-driver-pid:"


def _workload(folder: Path, dump_to: Path) -> None:
    """In this process: start Spark dumping its loaded classes at exit, run what a pass runs
    on a small Iceberg table, and print the JVM's pid (the archive is written as it exits)."""
    config_path = folder / "icegate.yaml"
    config_path.write_text(
        "catalog:\n"
        "  name: classes\n"
        f"  uri: sqlite:///{folder / 'catalog.db'}\n"
        f"  warehouse: file://{folder / 'warehouse'}\n"
        "spark:\n"
        "  master: local[1]\n"
        "  conf:\n"
        "    spark.driver.extraJavaOptions: "
        f"-XX:ArchiveClassesAtExit={dump_to} {QUIET_CLASS_SHARING}\n"
    )
    config = load_config(config_path)
    # The catalog's own tables are made by pyiceberg, as for every lakehouse here.
    open_catalog(config.catalog).create_namespace("warm")
    spark = get_spark(config)
    for sql in (
        "CREATE TABLE classes.warm.t (id BIGINT, s STRING, ts TIMESTAMP) USING iceberg "
        "PARTITIONED BY (s)",
        "INSERT INTO classes.warm.t VALUES (1, 'a', current_timestamp())",
        "INSERT INTO classes.warm.t VALUES (2, 'b', current_timestamp())",
        "CALL classes.system.rewrite_data_files(table => 'warm.t', "
        "options => map('min-input-files', '1'))",
        "CALL classes.system.rewrite_manifests('warm.t')",
        "CALL classes.system.expire_snapshots(table => 'warm.t', retain_last => 1)",
        "SELECT count(*) FROM classes.warm.t",
    ):
        spark.sql(sql).collect()
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    print(_PID_MARK, jvm.java.lang.ProcessHandle.current().pid(), flush=True)


def build_archive(archive: Path | None = None, timeout: float = 600) -> Path:
    """Make ``archive`` (by default the running Spark line's, :func:`classes_archive`),
    replacing an older one only once the new one is whole: the workload in a child process,
    then wait for its JVM to exit and write the classes."""
    archive = archive or classes_archive()
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="icegate-classes-") as tmp:
        folder = Path(tmp)
        dump_to = folder / "classes.jsa"
        env = {k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"}
        done = subprocess.run(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", _MODULE, "--workload", str(folder), str(dump_to)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise RuntimeError("the Spark workload failed: " + " | ".join(tail))
        [jvm_pid] = [
            int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith(_PID_MARK)
        ]
        deadline = time.monotonic() + timeout
        while _alive(jvm_pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not dump_to.is_file() or dump_to.stat().st_size == 0:
            raise RuntimeError(f"the JVM wrote no archive at {dump_to}")
        staged = archive.with_suffix(".jsa.new")
        shutil.copyfile(dump_to, staged)  # streamed: the archive is ~160 MB
        staged.replace(archive)  # atomic: a JVM starting now maps the old or the new one
    return archive


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m icegate_dagster.spark.class_archive``: make the archive (setup runs this)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--workload"]:
        _workload(Path(args[1]), Path(args[2]))
        return 0
    started = time.monotonic()
    try:
        path = build_archive()
    except Exception as exc:  # Spark then starts without it, as before
        print(f"setup: no class-data sharing archive for Spark ({exc})", file=sys.stderr)
        return 1
    size = path.stat().st_size / 1e6
    print(
        f"setup: Spark's classes archived in {path} ({size:.0f} MB, "
        f"{time.monotonic() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
