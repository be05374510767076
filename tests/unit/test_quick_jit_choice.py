"""Whether a pass's rewrites are small enough for the quick JIT, from its tables' stats
and WAL folders (pyiceberg tables, no JVM: the choice is made before Spark starts)."""

from __future__ import annotations

from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.spark_session import QUICK_JIT_MAX_BYTES
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
