"""The operation registry: names unique, settings blocks real, a registration undone."""

import pytest

from icegate_dagster.errors import IcegateError
from icegate_dagster.maintenance import OPERATIONS
from icegate_dagster.maintenance.ops import OpContext, Operation, Registry
from icegate_dagster.maintenance.results import Outcome


class Noop(Operation):
    name = "noop"
    description = "does nothing"
    settings_block = "optimize"

    def run(self, ctx: OpContext) -> Outcome:
        return Outcome.done("nothing")


def test_the_registry_runs_the_contract_operations_in_pass_order() -> None:
    assert OPERATIONS.names() == (
        "wal_compaction",
        "optimize",
        "rewrite_position_delete_files",
        "rewrite_manifests",
        "compute_table_stats",
        "expire_snapshots",
        "remove_orphan_files",
        "retention",
    )
    assert {c: op.name for c, op in OPERATIONS.cli_commands().items()} == {
        "compact": "wal_compaction",
        "optimize": "optimize",
        "expire": "expire_snapshots",
        "orphans": "remove_orphan_files",
    }
    assert OPERATIONS.metadata_sums() == {
        "wal_files_ingested": "WAL files in",
        "orphans_removed": "orphans",
    }


def test_a_name_registered_twice_is_refused() -> None:
    with pytest.raises(IcegateError, match="'noop' is registered twice"):
        Registry([Noop(), Noop()])


def test_a_settings_block_that_is_not_in_table_settings_is_refused() -> None:
    class Misnamed(Noop):
        name = "misnamed"
        settings_block = "optimise"

    with pytest.raises(IcegateError, match="settings_block 'optimise' is not a block"):
        Registry([Misnamed()])


def test_a_registration_goes_where_asked_and_is_undone() -> None:
    before = OPERATIONS.names()
    with OPERATIONS.registered(Noop(), before="optimize"):
        assert OPERATIONS.names() == ("wal_compaction", "noop", *before[1:])
        assert OPERATIONS.get("noop").description == "does nothing"
    assert OPERATIONS.names() == before
    with pytest.raises(IcegateError, match="'noop' is unknown"):
        OPERATIONS.get("noop")
