"""rewrite_options: optimize settings mapped onto Iceberg's rewrite_data_files options.

``file_size_threshold`` -> ``min-file-size-bytes``, ``min_input_files`` -> ``min-input-files``,
``delete_file_threshold``/``delete_ratio_threshold`` -> ``delete-file-threshold``/
``delete-ratio-threshold`` (``remove-dangling-deletes`` where the table has delete files);
``target-file-size-bytes`` is set (to twice the threshold) only when the threshold reaches
the table's own target (``write.target-file-size-bytes``, Iceberg's default 512 MB when unset).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from icegate_dagster.config import OptimizeSettings, config_from_dict
from icegate_dagster.errors import IcegateError
from icegate_dagster.maintenance.ops.optimize import rewrite_options
from tests.unit.pyiceberg_tables import create_table, sqlite_catalog

MB = 1024**2
ICEBERG_DEFAULT_TARGET = 512 * MB
TABLE_TARGET = 64 * MB


def optimize_settings(tmp_path: Path, **block: object) -> OptimizeSettings:
    return config_from_dict({"maintain": {"optimize": block}}, tmp_path).defaults.optimize


@pytest.fixture
def catalog_dir(tmp_path: Path) -> Path:
    return tmp_path / "lake"


def test_threshold_and_min_input_files_map_onto_procedure_options(
    tmp_path: Path, catalog_dir: Path
) -> None:
    table = create_table(sqlite_catalog(catalog_dir), "plain")
    settings = optimize_settings(tmp_path, file_size_threshold="10MB", min_input_files=7)
    assert rewrite_options(settings, table) == {
        "min-input-files": "7",
        "min-file-size-bytes": str(10 * MB),
        "delete-file-threshold": "1",
        "delete-ratio-threshold": "0.3",
    }


def test_the_defaults_map_to_ten_megabytes_and_five_files(
    tmp_path: Path, catalog_dir: Path
) -> None:
    table = create_table(sqlite_catalog(catalog_dir), "plain")
    assert rewrite_options(optimize_settings(tmp_path), table) == {
        "min-input-files": "5",
        "min-file-size-bytes": str(10 * MB),
        "delete-file-threshold": "1",
        "delete-ratio-threshold": "0.3",
    }


def test_delete_thresholds_map_onto_iceberg_options(tmp_path: Path, catalog_dir: Path) -> None:
    table = create_table(sqlite_catalog(catalog_dir), "deletes")
    settings = optimize_settings(tmp_path, delete_file_threshold=4, delete_ratio_threshold=0.5)
    options = rewrite_options(settings, table)
    assert (options["delete-file-threshold"], options["delete-ratio-threshold"]) == ("4", "0.5")
    # Dangling deletes are looked for only where the table has delete files.
    assert "remove-dangling-deletes" not in options
    assert rewrite_options(settings, table, delete_files=3)["remove-dangling-deletes"] == "true"


@pytest.mark.parametrize(
    ("block", "key"),
    [
        ({"delete_file_threshold": 0}, "delete_file_threshold"),
        ({"delete_ratio_threshold": 0}, "delete_ratio_threshold"),
        ({"delete_ratio_threshold": 1.5}, "delete_ratio_threshold"),
    ],
)
def test_delete_thresholds_out_of_range_are_refused_naming_the_key(
    tmp_path: Path, block: dict[str, object], key: str
) -> None:
    with pytest.raises(IcegateError, match=key):
        optimize_settings(tmp_path, **block)


@pytest.mark.parametrize(
    ("threshold", "target"),
    [
        (ICEBERG_DEFAULT_TARGET - 1, None),
        (ICEBERG_DEFAULT_TARGET, 2 * ICEBERG_DEFAULT_TARGET),
        (ICEBERG_DEFAULT_TARGET + 1, 2 * ICEBERG_DEFAULT_TARGET + 2),
    ],
    ids=["just-under", "equal", "just-over"],
)
def test_without_a_table_target_the_iceberg_default_is_the_limit(
    tmp_path: Path, catalog_dir: Path, threshold: int, target: int | None
) -> None:
    table = create_table(sqlite_catalog(catalog_dir), "plain")
    assert "write.target-file-size-bytes" not in table.properties
    options = rewrite_options(optimize_settings(tmp_path, file_size_threshold=threshold), table)
    assert options.get("target-file-size-bytes") == (None if target is None else str(target))
    assert options["min-file-size-bytes"] == str(threshold)


@pytest.mark.parametrize(
    ("threshold", "target"),
    [
        (10 * MB, None),
        (TABLE_TARGET - 1, None),
        (TABLE_TARGET, 2 * TABLE_TARGET),
        (100 * MB, 200 * MB),
    ],
    ids=["well-under", "just-under", "equal", "above"],
)
def test_the_table_target_property_sets_the_limit(
    tmp_path: Path, catalog_dir: Path, threshold: int, target: int | None
) -> None:
    table = create_table(
        sqlite_catalog(catalog_dir),
        "sized",
        properties={"write.target-file-size-bytes": str(TABLE_TARGET)},
    )
    options = rewrite_options(optimize_settings(tmp_path, file_size_threshold=threshold), table)
    assert options.get("target-file-size-bytes") == (None if target is None else str(target))


def test_a_raised_target_stays_above_the_threshold(tmp_path: Path, catalog_dir: Path) -> None:
    # Iceberg refuses min-file-size-bytes >= target-file-size-bytes.
    table = create_table(
        sqlite_catalog(catalog_dir),
        "sized",
        properties={"write.target-file-size-bytes": str(TABLE_TARGET)},
    )
    options = rewrite_options(optimize_settings(tmp_path, file_size_threshold="1GB"), table)
    assert int(options["min-file-size-bytes"]) < int(options["target-file-size-bytes"])


def test_the_property_is_read_from_the_table_as_it_is_now(
    tmp_path: Path, catalog_dir: Path
) -> None:
    table = create_table(sqlite_catalog(catalog_dir), "altered")
    settings = optimize_settings(tmp_path, file_size_threshold=TABLE_TARGET)
    assert "target-file-size-bytes" not in rewrite_options(settings, table)
    with table.transaction() as tx:
        tx.set_properties({"write.target-file-size-bytes": str(TABLE_TARGET)})
    assert rewrite_options(settings, table)["target-file-size-bytes"] == str(2 * TABLE_TARGET)


def test_max_file_group_size_maps_onto_the_group_size_option(
    tmp_path: Path, catalog_dir: Path
) -> None:
    table = create_table(sqlite_catalog(catalog_dir), "grouped")
    settings = optimize_settings(tmp_path, max_file_group_size="128MB")
    assert rewrite_options(settings, table)["max-file-group-size-bytes"] == str(128 * MB)
    assert "max-file-group-size-bytes" not in rewrite_options(optimize_settings(tmp_path), table)


def test_a_codec_is_set_only_on_tables_that_set_none(tmp_path: Path, catalog_dir: Path) -> None:
    from icegate_dagster.maintenance.ops.optimize import CODEC_PROPERTY, codec_to_set

    catalog = sqlite_catalog(catalog_dir)
    bare = create_table(catalog, "bare")  # pyiceberg stores no codec: Java would use gzip
    assert CODEC_PROPERTY not in bare.properties
    assert codec_to_set(optimize_settings(tmp_path), bare) == "zstd"
    assert codec_to_set(optimize_settings(tmp_path, compression_codec="lz4"), bare) == "lz4"
    assert codec_to_set(optimize_settings(tmp_path, compression_codec=None), bare) is None
    with bare.transaction() as transaction:
        transaction.set_properties({CODEC_PROPERTY: "snappy"})
    assert codec_to_set(optimize_settings(tmp_path), bare.refresh()) is None  # its own choice
