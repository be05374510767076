"""Delete files judged from metadata alone (no JVM): which are dangling, which data files
``optimize`` would rewrite for their deletes, and when ``rewrite_position_delete_files``
has work.

Manifest entries are built by hand with pyiceberg's own ``DataFile``: a position delete
file names its data file by equal lower and upper bounds of its ``file_path`` column
(as Spark writes them), or spans several by unequal ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record

from icegate_dagster.config import RewritePositionDeletesSettings, config_from_dict
from icegate_dagster.errors import IcegateError
from icegate_dagster.maintenance.health.manifest_walk import (
    DELETE_FILE_PATH_ID,
    Entry,
    WalkRules,
    walk_entries,
)
from icegate_dagster.maintenance.health.stats import delete_figures, stats_of
from icegate_dagster.maintenance.ops.rewrite_position_delete_files import (
    position_delete_options,
    position_deletes_plan,
)
from icegate_dagster.maintenance.results import TableStats

WAREHOUSE = "file:///lake/orders/data"


def data(name: str, partition: str = "api", rows: int = 100, sequence: int = 1) -> Entry:
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=f"{WAREHOUSE}/service={partition}/{name}.parquet",
        file_format=FileFormat.PARQUET,
        partition=Record(partition),
        record_count=rows,
        file_size_in_bytes=1000,
    )
    data_file.spec_id = 0
    return data_file, sequence


def deletes(
    *targets: str,
    partition: str = "api",
    rows: int = 10,
    sequence: int = 2,
    content: DataFileContent = DataFileContent.POSITION_DELETES,
    file_format: FileFormat = FileFormat.PARQUET,
) -> Entry:
    """A delete file; its ``file_path`` bounds span ``targets`` (data file names)."""
    paths = sorted(f"{WAREHOUSE}/service={partition}/{t}.parquet".encode() for t in targets)
    bounds = {DELETE_FILE_PATH_ID: paths[0]} if paths else {}
    delete_file = DataFile.from_args(
        content=content,
        file_path=f"{WAREHOUSE}/service={partition}/delete-{'-'.join(targets)}.parquet",
        file_format=file_format,
        partition=Record(partition),
        record_count=rows,
        file_size_in_bytes=100,
        lower_bounds=bounds,
        upper_bounds={DELETE_FILE_PATH_ID: paths[-1]} if paths else {},
    )
    delete_file.spec_id = 0
    return delete_file, sequence


# dangling delete files ----------------------------------------------------------------------


def test_a_file_scoped_delete_whose_data_file_is_gone_is_dangling() -> None:
    figures = delete_figures([data("b")], [deletes("a"), deletes("b")])
    assert (figures.position_delete_files, figures.dangling_delete_files) == (2, 1)


def test_a_delete_spanning_several_files_is_dangling_only_when_none_is_left() -> None:
    live = [data("b"), data("m"), data("z")]
    spans_m = deletes("c", "n")  # "m" lies between its bounds: it may delete from it
    spans_none = deletes("n", "x")  # nothing live between "n" and "x"
    figures = delete_figures(live, [spans_m, spans_none])
    assert figures.dangling_delete_files == 1


def test_a_delete_older_than_every_data_file_of_its_partition_is_dangling() -> None:
    # Iceberg's own sequence rule: it applies only to data as old as itself.
    figures = delete_figures([data("m", sequence=5)], [deletes("c", "n", sequence=4)])
    assert figures.dangling_delete_files == 1
    figures = delete_figures([data("m", sequence=4)], [deletes("c", "n", sequence=4)])
    assert figures.dangling_delete_files == 0


def test_a_delete_in_a_partition_without_data_is_dangling() -> None:
    figures = delete_figures([data("a", partition="api")], [deletes("c", "n", partition="web")])
    assert figures.dangling_delete_files == 1


def test_deletion_vectors_and_equality_deletes_are_counted_apart() -> None:
    figures = delete_figures(
        [data("a")],
        [
            deletes(file_format=FileFormat.PUFFIN),
            deletes(content=DataFileContent.EQUALITY_DELETES),
            deletes("a"),
        ],
    )
    assert (
        figures.position_delete_files,
        figures.deletion_vectors,
        figures.equality_delete_files,
        figures.dangling_delete_files,
        figures.delete_rewrite_files,
    ) == (1, 1, 1, 0, 3)


def test_vectors_and_equality_deletes_with_only_newer_data_are_dangling() -> None:
    # Iceberg's rule: a vector applies to data files no newer than it, an equality delete
    # to older ones only. Dangling, they give optimize nothing to rewrite; TableStats'
    # dangling_delete_files counts position delete files alone.
    vector = deletes(file_format=FileFormat.PUFFIN, sequence=2)
    equality = deletes(content=DataFileContent.EQUALITY_DELETES, sequence=3)
    older = delete_figures([data("a", sequence=3)], [vector, equality])
    assert (older.deletion_vectors, older.equality_delete_files) == (1, 1)
    assert (older.dangling_delete_files, older.delete_rewrite_files) == (0, 0)
    walked = walk_entries([data("a", sequence=3), vector, equality], WalkRules(0))
    assert (walked.dangling_deletion_vectors, walked.dangling_equality_deletes) == (1, 1)
    live = delete_figures([data("a", sequence=2)], [vector, equality])
    assert live.delete_rewrite_files == 2


def test_an_unpartitioned_equality_delete_applies_table_wide() -> None:
    # Its spec has no partition field: older data in any partition keeps it live.
    equality, _ = deletes(content=DataFileContent.EQUALITY_DELETES, partition="web", sequence=3)
    equality.spec_id = 1
    entries = [data("a", sequence=2), data("b", partition="web", sequence=4)]
    entries.append((equality, 3))
    spread = walk_entries(entries, WalkRules(0), unpartitioned=frozenset({1}))
    assert (spread.dangling_equality_deletes, spread.delete_rewrite_files) == (0, 1)
    # ...its partition's data alone (here none) when the spec is partitioned.
    alone = walk_entries(entries, WalkRules(0))
    assert (alone.dangling_equality_deletes, alone.delete_rewrite_files) == (1, 0)


def test_the_most_position_deletes_in_one_partition() -> None:
    live = [data("a"), data("b"), data("c", partition="web")]
    figures = delete_figures(
        live, [deletes("a"), deletes("b"), deletes("a", rows=1), deletes("c", partition="web")]
    )
    assert figures.max_partition_position_deletes == 3


@pytest.mark.parametrize(("min_input_files", "compactable"), [(1, 6), (2, 5), (3, 3), (4, 0)])
def test_compactable_files_are_the_small_files_of_partitions_holding_enough(
    min_input_files: int, compactable: int
) -> None:
    live = [
        data(f"{p}{i}", partition=p) for p, n in (("a", 1), ("b", 2), ("c", 3)) for i in range(n)
    ]
    walked = walk_entries(live, WalkRules(small_file_threshold=1001))
    stats = stats_of(walked, snapshots=1, snapshot_id=7, min_input_files=min_input_files)
    assert (stats.small_files, stats.compactable_files) == (6, compactable)


# what optimize would rewrite for its deletes ------------------------------------------------


@pytest.mark.parametrize(
    ("file_threshold", "ratio", "picked"),
    [
        (1, 0.3, 2),  # any delete file: both data files
        (3, 0.3, 1),  # "a" has 3 delete files; "b" 2 (20 of 100 rows: under 30 %)
        (3, 0.2, 2),  # "b"'s 20 % reaches the ratio
        (4, 0.9, 0),
    ],
)
def test_data_files_are_picked_for_their_deletes_as_iceberg_does(
    file_threshold: int, ratio: float, picked: int
) -> None:
    live = [data("a"), data("b")]
    files = [deletes("a"), deletes("a"), deletes("a"), deletes("b"), deletes("b")]
    figures = delete_figures(
        live, files, delete_file_threshold=file_threshold, delete_ratio_threshold=ratio
    )
    assert figures.delete_rewrite_files == picked


def test_dangling_deletes_give_optimize_nothing_to_rewrite() -> None:
    figures = delete_figures([data("b")], [deletes("a"), deletes("a")])
    assert (figures.dangling_delete_files, figures.delete_rewrite_files) == (2, 0)


def test_deletes_whose_data_file_metadata_does_not_name_count_as_work() -> None:
    # A vector names its file only in a field pyiceberg does not read: assume it applies.
    figures = delete_figures(
        [data("a")], [deletes(file_format=FileFormat.PUFFIN)], delete_file_threshold=9
    )
    assert figures.delete_rewrite_files == 1


# rewrite_position_delete_files: plan and options --------------------------------------------


def stats(
    position: int = 0, dangling: int = 0, most_in_a_partition: int = 0, vectors: int = 0
) -> TableStats:
    return TableStats(
        data_files=10,
        data_bytes=10_000,
        small_files=0,
        delete_files=position + vectors,
        snapshots=3,
        rows=1000,
        manifests=2,
        position_delete_files=position,
        deletion_vectors=vectors,
        dangling_delete_files=dangling,
        max_partition_position_deletes=most_in_a_partition,
    )


RULE = RewritePositionDeletesSettings(min_input_files=3)


def test_no_position_delete_files_is_nothing_to_do_and_says_why_for_vectors() -> None:
    assert position_deletes_plan(RULE, stats(), 2) == "no position delete files"
    reason = position_deletes_plan(RULE, stats(vectors=4), 3)
    assert reason is not None and "4 deletion vectors" in reason


@pytest.mark.parametrize(
    ("before", "version", "work", "rewrite_all"),
    [
        (stats(position=4, most_in_a_partition=2), 2, False, False),
        (stats(position=4, most_in_a_partition=3), 2, True, False),
        (stats(position=1, dangling=1, most_in_a_partition=1), 2, True, True),
        (stats(position=1, most_in_a_partition=1), 3, True, True),  # into deletion vectors
    ],
    ids=["below-min", "at-min", "one-dangling", "format-v3"],
)
def test_work_and_scope_follow_min_input_files_dangling_files_and_the_format(
    before: TableStats, version: int, work: bool, rewrite_all: bool
) -> None:
    reason = position_deletes_plan(RULE, before, version)
    assert (reason is None) is work, reason
    options = position_delete_options(RULE, before, version)
    assert options["min-input-files"] == "3"
    assert ("rewrite-all" in options) is rewrite_all


def test_min_input_files_below_two_is_refused_naming_the_key(tmp_path: Path) -> None:
    # Iceberg never rewrites a group of one file.
    raw = {"maintain": {"rewrite_position_delete_files": {"min_input_files": 1}}}
    with pytest.raises(IcegateError, match="rewrite_position_delete_files.min_input_files"):
        config_from_dict(raw, tmp_path)
