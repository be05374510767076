"""Whether a pass's rewrites are small enough for the quick JIT, from its tables' stats
and WAL folders (pyiceberg tables, no JVM: the choice is made before Spark starts)."""

from __future__ import annotations

from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.spark.jvm_options import QUICK_JIT_MAX_BYTES
from tests.lakehouse import LakehouseFactory, batch


def test_a_pass_over_small_tables_is_small_and_a_big_or_unbounded_one_is_not(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory(wal=True)
    refs = [TableRef.parse(f"lakehouse.t{i}") for i in range(3)]
    for ref in refs:
        lh.add_table(ref.key, appends=6)
    maintainer = Maintainer(lh.config)
    assert maintainer.rewrites_are_small(refs)
    total = sum(maintainer.stats(ref).data_bytes for ref in refs)
    assert 0 < total <= QUICK_JIT_MAX_BYTES

    # The bound is every byte of the tables with files to compact.
    assert not maintainer.rewrites_are_small(refs, max_bytes=total - 1)
    assert maintainer.rewrites_are_small(refs, max_bytes=total)
    # Beyond the tables a pass sums: not small.
    assert not maintainer.rewrites_are_small(refs, max_bytes=total, max_tables=2)
    # Waiting WAL files count: they are written into the table.
    both = ["wal_compaction", "optimize"]
    assert maintainer.rewrites_are_small(refs, both, max_bytes=total)
    lh.write_wal(refs[0].key, batch(90_000, ("api",)), "00001.parquet")
    assert not maintainer.rewrites_are_small(refs, both, max_bytes=total)
    assert maintainer.rewrites_are_small(refs, ["optimize"], max_bytes=total)
    # TTL deletes may rewrite any file: not bounded, not small.
    assert not maintainer.rewrites_are_small(refs, ["retention"])
    # A table that cannot be read: the pass reports it, the JIT stays the JVM's own.
    assert not maintainer.rewrites_are_small([*refs, TableRef.parse("lakehouse.missing")])
    # A pass that compacts nothing rewrites no data file, whatever the tables hold.
    assert maintainer.rewrites_are_small(refs, ["expire_snapshots"], max_bytes=0)
    assert not maintainer.rewrites_are_small(refs, ["optimize"], max_bytes=0)


def test_the_outlook_says_spark_is_needed_only_for_work_that_will_run(
    lakehouse_factory: LakehouseFactory,
) -> None:
    """A pass starts its JVM beside the planning only when some table certainly has Spark
    work; a pass over healthy or excluded tables starts none."""
    lh = lakehouse_factory(wal=True)
    healthy, small, wal_fed = (
        TableRef.parse(f"lakehouse.{n}") for n in ("healthy", "small", "fed")
    )
    lh.add_table(healthy.key, appends=1, services=("api",))
    lh.add_table(small.key, appends=6)
    lh.add_table(wal_fed.key, appends=1, services=("api",))
    maintainer = Maintainer(lh.config)
    assert maintainer.stats(healthy).compactable_files == 0
    assert maintainer.stats(small).compactable_files > 0

    assert not maintainer.outlook([healthy]).needs_spark
    assert not maintainer.outlook([healthy, wal_fed]).needs_spark  # no WAL waiting yet
    outlook = maintainer.outlook([healthy, small])
    assert outlook.needs_spark
    assert outlook.rewrite_bytes == maintainer.stats(small).data_bytes
    # Only what the pass runs counts: expiry alone rewrites nothing on Spark's side here.
    assert not maintainer.outlook([small], ["expire_snapshots"]).needs_spark

    # A WAL below its thresholds waits (no Spark); at them, it is ingested (Spark).
    lh.write_wal(wal_fed.key, batch(70_000, ("api",)), "00001.parquet")
    min_files = maintainer.settings(wal_fed).compaction.min_files
    assert min_files > 1
    assert not maintainer.outlook([wal_fed], ["wal_compaction"]).needs_spark
    for i in range(2, min_files + 1):
        lh.write_wal(wal_fed.key, batch(70_000 + i, ("api",)), f"{i:05d}.parquet")
    assert maintainer.outlook([wal_fed], ["wal_compaction"]).needs_spark

    # A table excluded from maintenance has no Spark work, whatever its files.
    with lh.table(small.key).transaction() as tx:
        tx.set_properties({"icegate.maintenance.enabled": "false"})
    assert not Maintainer(lh.config).outlook([healthy, small]).needs_spark
    # Beyond the tables a pass looks at, nothing is known: the JVM starts on first need.
    assert Maintainer(lh.config).outlook([healthy, wal_fed], max_tables=1).rewrite_bytes is None


def test_a_pass_over_healthy_tables_asks_for_no_spark(lakehouse_factory: LakehouseFactory) -> None:
    """The outlook never starts a JVM on its own: over healthy tables the pass runs with
    no Spark session asked for, and its log rows are still written."""
    lh = lakehouse_factory()
    refs = [TableRef.parse(f"lakehouse.h{i}") for i in range(2)]
    for ref in refs:
        lh.add_table(ref.key, appends=1, services=("api",))
    maintainer = Maintainer(lh.config)
    results = maintainer.maintain(refs)
    assert all(r.ok for r in results)
    assert not maintainer.spark_started
    assert {r["table_name"] for r in lh.log_rows()} >= {ref.key for ref in refs}
