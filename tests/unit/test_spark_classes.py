"""The driver JVM's options: the class-data sharing archive setup makes (used when
present, never in the way), the serial collector of a small local driver and the quick JIT
of a pass whose rewrites are small."""

from __future__ import annotations

from pathlib import Path

from icegate_dagster.config import load_config
from icegate_dagster.spark.conf import build_spark_conf
from icegate_dagster.spark.jvm_options import (
    QUICK_JIT,
    SERIAL_GC,
    class_sharing_options,
    classes_archive,
    jvm_bytes,
    local_gc_options,
    local_jit_options,
)


def test_the_archive_is_mapped_only_when_it_exists(tmp_path: Path) -> None:
    archive = tmp_path / "classes.jsa"
    assert class_sharing_options("", archive) == ""
    archive.write_bytes(b"made by setup")
    options = class_sharing_options("-Dsome=thing", archive).split()
    assert f"-XX:SharedArchiveFile={archive}" in options
    # A JVM that cannot map it (another JDK, another class path) starts without it.
    assert "-Xshare:auto" in options


def test_a_users_own_class_data_sharing_wins(tmp_path: Path) -> None:
    archive = tmp_path / "classes.jsa"
    archive.write_bytes(b"made by setup")
    for theirs in ("-XX:SharedArchiveFile=/elsewhere.jsa", "-Xshare:off"):
        assert class_sharing_options(theirs, archive) == ""


def test_the_session_maps_setups_archive_beside_the_users_options(tmp_path: Path) -> None:
    config_path = tmp_path / "icegate.yaml"
    config_path.write_text(
        "catalog: {name: c, uri: 'sqlite:///" + str(tmp_path / "c.db") + "', "
        "warehouse: 'file://" + str(tmp_path / "w") + "'}\n"
        "spark: {conf: {spark.driver.extraJavaOptions: -Dmine=1}}\n"
    )
    options = build_spark_conf(load_config(config_path))["spark.driver.extraJavaOptions"]
    assert options.startswith("-Dmine=1 ")  # the user's first
    assert "-Dlog4j2.configurationFile=" in options
    archive = classes_archive()
    assert (f"-XX:SharedArchiveFile={archive}" in options) == archive.is_file()


def test_a_local_driver_with_a_small_heap_collects_serially() -> None:
    assert local_gc_options("local[*]", {}) == SERIAL_GC  # Spark's default heap, 1 GB
    assert local_gc_options("local[2]", {"spark.driver.memory": "2g"}) == SERIAL_GC
    assert local_gc_options("local[2]", {"spark.driver.memory": "1536"}) == SERIAL_GC  # MiB


def test_a_cluster_a_big_heap_or_the_users_collector_keeps_theirs() -> None:
    assert local_gc_options("spark://master:7077", {}) == ""
    assert local_gc_options("local[*]", {"spark.driver.memory": "8g"}) == ""
    assert local_gc_options("local[*]", {"spark.driver.memory": "a lot"}) == ""
    for key in ("spark.driver.extraJavaOptions", "spark.driver.defaultJavaOptions"):
        assert local_gc_options("local[*]", {key: "-Xss4m -XX:+UseG1GC"}) == ""
        assert local_gc_options("local[*]", {key: "-XX:+UseParallelGC"}) == ""


def test_jvm_sizes_read_as_spark_reads_them() -> None:
    assert jvm_bytes("512m") == 512 * 1024**2
    assert jvm_bytes("2G") == 2 * 1024**3
    assert jvm_bytes("2048") == 2 * 1024**3  # a bare number is MiB
    assert jvm_bytes("2gb") == 2 * 1024**3
    assert jvm_bytes("two") is None


def test_a_small_pass_on_a_local_driver_compiles_with_c1_only() -> None:
    assert local_jit_options("local[*]", {}, small_work=True) == QUICK_JIT
    assert local_jit_options("local[*]", {}, small_work=False) == ""
    assert local_jit_options("spark://master:7077", {}, small_work=True) == ""
    for theirs in ("-XX:TieredStopAtLevel=4", "-XX:-TieredCompilation", "-Xint", "-Xcomp"):
        for key in ("spark.driver.extraJavaOptions", "spark.driver.defaultJavaOptions"):
            assert local_jit_options("local[2]", {key: f"-Xss4m {theirs}"}, small_work=True) == ""


def test_the_session_of_a_small_pass_asks_for_the_quick_jit(tmp_path: Path) -> None:
    config_path = tmp_path / "icegate.yaml"
    config_path.write_text(
        "catalog: {name: c, uri: 'sqlite:///" + str(tmp_path / "c.db") + "', "
        "warehouse: 'file://" + str(tmp_path / "w") + "'}\n"
    )
    config = load_config(config_path)
    small = build_spark_conf(config, small_work=True)["spark.driver.extraJavaOptions"]
    big = build_spark_conf(config)["spark.driver.extraJavaOptions"]
    assert QUICK_JIT in small.split() and QUICK_JIT not in big


def test_each_spark_line_maps_only_its_own_archive() -> None:
    """An archive holds one line's classes: 4.1's has its own file beside the default
    line's, which keeps the name images were built with."""
    from icegate_dagster.spark.line import DEFAULT_LINE, SPARK4_LINE, running_line

    default, spark4 = classes_archive(DEFAULT_LINE), classes_archive(SPARK4_LINE)
    assert default.name == "spark-driver-classes.jsa"
    assert spark4.name == "spark-driver-classes-4.1_2.13.jsa"
    assert default.parent == spark4.parent
    assert classes_archive() == classes_archive(running_line())
