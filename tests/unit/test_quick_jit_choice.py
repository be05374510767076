"""Whether a pass's rewrites are small enough for the quick JIT, from its tables' stats
(pyiceberg tables, no JVM: the choice is made before Spark starts)."""

from __future__ import annotations

import pytest

from icegate_dagster import spark_session
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance import maintainer as maintainer_module
from tests.lakehouse import LakehouseFactory, batch


def test_a_pass_over_small_tables_is_small_and_a_big_or_unbounded_one_is_not(
    lakehouse_factory: LakehouseFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    lh = lakehouse_factory(wal=True)
    refs = [TableRef.parse(f"lakehouse.t{i}") for i in range(3)]
    for ref in refs:
        lh.add_table(ref.key, appends=6)
    maintainer = Maintainer(lh.config)
    assert maintainer.rewrites_are_small(refs)
    total = sum(maintainer.stats(ref).data_bytes for ref in refs)

    # The bound is every byte of the tables with files to compact.
    monkeypatch.setattr(spark_session, "QUICK_JIT_MAX_BYTES", total - 1)
    assert not maintainer.rewrites_are_small(refs)
    monkeypatch.setattr(spark_session, "QUICK_JIT_MAX_BYTES", total)
    assert maintainer.rewrites_are_small(refs)
    # Beyond the tables a pass sums, and where WAL ingest's bytes are unknown: not small.
    monkeypatch.setattr(maintainer_module, "SMALL_PASS_TABLES", 2)
    assert not maintainer.rewrites_are_small(refs)
    monkeypatch.setattr(maintainer_module, "SMALL_PASS_TABLES", 3)
    # Waiting WAL files count: they are written into the table.
    assert maintainer.rewrites_are_small(refs, ["wal_compaction", "optimize"])
    lh.write_wal(refs[0].key, batch(90_000, ("api",)), "00001.parquet")
    assert not maintainer.rewrites_are_small(refs, ["wal_compaction", "optimize"])
    assert maintainer.rewrites_are_small(refs, ["optimize"])
    monkeypatch.undo()
    # TTL deletes may rewrite any file: not bounded, not small.
    assert not maintainer.rewrites_are_small(refs, ["retention"])
    # A table that cannot be read: the pass reports it, the JIT stays the JVM's own.
    assert not maintainer.rewrites_are_small([*refs, TableRef.parse("lakehouse.missing")])
    # A pass that compacts nothing rewrites no data file, whatever the tables hold.
    monkeypatch.setattr(spark_session, "QUICK_JIT_MAX_BYTES", 0)
    assert maintainer.rewrites_are_small(refs, ["expire_snapshots", "rewrite_manifests"])
    assert not maintainer.rewrites_are_small(refs, ["optimize"])
