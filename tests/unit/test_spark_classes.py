"""The class-data sharing archive setup makes: used when present, never in the way."""

from __future__ import annotations

from pathlib import Path

from icegate_dagster.config import load_config
from icegate_dagster.spark_session import (
    CLASSES_ARCHIVE,
    build_spark_conf,
    class_sharing_options,
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
    assert (f"-XX:SharedArchiveFile={CLASSES_ARCHIVE}" in options) == CLASSES_ARCHIVE.is_file()
