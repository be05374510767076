"""Issue 28 without a JVM: the opt-out (``icegate.maintenance.enabled=false``, the config's
``enabled: false`` per table or namespace), Amoro's ownership of rewrites, what the health
model, the checks, ``status`` and a partition's page say of them, and which tables share
a location unsafely. Tables are written by pyiceberg."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyiceberg.table import Table

from icegate_dagster.assets.partition_events import table_record
from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.config import config_from_dict
from icegate_dagster.errors import ConfigError
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.discovery import TableLocations, discover_tables
from icegate_dagster.maintenance.exclusion import REWRITES, exclusion_of, table_exclusion
from icegate_dagster.maintenance.health.checks import evaluate_health, health_score_check
from icegate_dagster.maintenance.health.score import assess, thresholds_for
from icegate_dagster.maintenance.results import TableResult, TableStats
from icegate_dagster.maintenance.sharing import shared_files, sharing_of
from icegate_dagster.maintenance.wal import WalStats
from tests.lakehouse import LakehouseFactory
from tests.unit.health_builders import metrics
from tests.unit.pyiceberg_tables import SCHEMA, create_table, rows, sqlite_catalog

OFF = {"icegate.maintenance.enabled": "false"}
AMORO = {"self-optimizing.enabled": "true"}


def _config(maintain: dict[str, object]) -> object:
    return config_from_dict({"maintain": maintain}, Path("/tmp"))


def test_the_property_or_the_config_excludes_a_table_from_every_operation() -> None:
    config = config_from_dict(
        {
            "maintain": {
                "tables": {
                    "lakehouse.*": {"enabled": False, "optimize": {"min_input_files": 3}},
                    "lakehouse.kept": {"enabled": True},
                }
            }
        },
        Path("/tmp"),
    )
    by_config = exclusion_of(config, "lakehouse.logs", {})
    assert by_config.excluded and by_config.by == "config"
    assert by_config.reason("expire_snapshots") == by_config.reason("wal_compaction") is not None
    assert "enabled: false" in (by_config.table or "")
    # A table's own entry is laid over its namespace's: enabled again, the rest inherited.
    assert not exclusion_of(config, "lakehouse.kept", {}).excluded
    assert config.for_table("lakehouse.kept").optimize.min_input_files == 3
    assert not exclusion_of(config, "other.logs", {}).excluded
    for value in ("false", "FALSE", " False "):
        by_property = exclusion_of(config, "other.logs", {"icegate.maintenance.enabled": value})
        assert by_property.excluded and by_property.by == "property"
        assert "icegate.maintenance.enabled=false" in (by_property.table or "")
    # The property cannot bring back a table the configuration excludes: either one is enough.
    assert exclusion_of(config, "lakehouse.logs", {"icegate.maintenance.enabled": "true"}).excluded


def test_a_bad_property_value_or_config_key_names_itself() -> None:
    settings = config_from_dict({}, Path("/tmp")).defaults
    with pytest.raises(ConfigError, match=r"icegate\.maintenance\.enabled = 'nope'"):
        table_exclusion(settings, "lakehouse.logs", {"icegate.maintenance.enabled": "nope"})
    with pytest.raises(ConfigError, match=r"maintain\.tables\.lake\*\.logs = 'lake\*\.logs'"):
        _config({"tables": {"lake*.logs": {"enabled": False}}})
    with pytest.raises(ConfigError, match=r"maintain\.tables\.lakehouse\.\*\.enabled = 'maybe'"):
        _config({"tables": {"lakehouse.*": {"enabled": "maybe"}}})
    with pytest.raises(ConfigError, match=r"maintain\.defer_to_amoro = 'sure'"):
        _config({"defer_to_amoro": "sure"})


def test_amoro_keeps_the_rewrites_unless_told_not_to() -> None:
    config = config_from_dict(
        {"maintain": {"tables": {"lakehouse.mine": {"defer_to_amoro": False}}}}, Path("/tmp")
    )
    owned = exclusion_of(config, "lakehouse.logs", AMORO)
    assert not owned.excluded and owned.by == "amoro"
    assert set(owned.operations(["optimize", "rewrite_position_delete_files", "expire_snapshots"]))
    assert set(owned.operations(["optimize", "expire_snapshots", "wal_compaction"])) == {"optimize"}
    assert "Amoro" in (owned.summary or "")
    assert not exclusion_of(config, "lakehouse.mine", AMORO).operations(REWRITES)
    assert not exclusion_of(config, "lakehouse.logs", {"self-optimizing.enabled": "false"}).by
    # The opt-out wins over Amoro's ownership: nothing runs at all.
    assert exclusion_of(config, "lakehouse.logs", {**AMORO, **OFF}).excluded


def test_excluded_operations_are_never_due_and_their_checks_are_not_judged() -> None:
    settings = config_from_dict({}, Path("/tmp")).defaults
    figures = metrics(
        "lakehouse.logs", small_files=20, worst_partition_small_files=20, snapshots=40
    )
    figures = type(figures)(**{**figures.__dict__, "expirable_snapshots": 30})
    thresholds = thresholds_for(settings, {})

    plain = assess(figures, settings, thresholds)
    assert set(plain.due_operations) == {"optimize", "expire_snapshots"}
    assert plain.state == "due" and plain.judged_score == plain.score

    amoro = assess(
        figures, settings, thresholds, table_exclusion(settings, "lakehouse.logs", AMORO)
    )
    assert amoro.due_operations == ("expire_snapshots",)
    assert [d.operation for d in amoro.withheld] == ["optimize"]
    assert amoro.state == "due" and amoro.judged_score > amoro.score  # small files not ours
    # Between the two scores: the small files Amoro owns do not fail the check, they would
    # fail it on a table this service compacts.
    min_score = (amoro.score + amoro.judged_score) / 2
    verdict = health_score_check(amoro, min_score)
    assert verdict.passed and "not run here: optimize" in verdict.description
    assert not health_score_check(plain, min_score).passed

    off = assess(figures, settings, thresholds, table_exclusion(settings, "lakehouse.logs", OFF))
    assert off.due == () and off.state == "excluded" and off.score == plain.score
    assert set(off.excluded_operations) >= {"optimize", "expire_snapshots", "remove_orphan_files"}
    verdict = health_score_check(off, 99.0)
    assert verdict.passed and verdict.description.startswith("not judged: excluded")
    assert off.as_dict()["state"] == "excluded"

    stats = TableStats(30, 1000, 30, 0, 200, 100, 1, compactable_files=30)
    result = TableResult("lakehouse.logs", stats, stats, [], 0.1)
    checks = {c.name: c for c in evaluate_health(result, settings, WalStats(0, 0))}
    assert not checks["small_files"].passed and not checks["snapshot_count"].passed
    excluded = table_exclusion(settings, "lakehouse.logs", OFF)
    checks = {c.name: c for c in evaluate_health(result, settings, WalStats(0, 0), excluded)}
    assert all(c.passed for c in checks.values()), checks
    assert checks["small_files"].description.startswith("not judged: excluded")


def test_which_tables_share_a_location_and_which_do_so_unsafely() -> None:
    locations = {
        "ns.orders": "file:///wh/ns/orders",
        "ns.twin": "file:///wh/ns/orders",
        "ns.inner": "file:///wh/ns/orders/inner",
        "ns.orders_old": "file:///wh/ns/orders_old",
    }
    twin = sharing_of("ns.twin", "file:/wh/ns/orders/", {}, locations)
    assert twin.overlapping == ("ns.inner", "ns.orders") and twin.unsafe
    assert "gc.enabled=false" in (twin.warning() or "") and "ns.orders" in (twin.warning() or "")
    safe = sharing_of("ns.twin", "file:/wh/ns/orders", {"gc.enabled": "false"}, locations)
    assert safe.shared and not safe.unsafe and safe.warning() is None
    alone = sharing_of("ns.orders_old", "file:///wh/ns/orders_old", {}, locations)
    assert not alone.shared and alone.warning() is None
    unknown = sharing_of("ns.orders_old", "/wh/ns/orders_old", {}, locations, {"ns.gone": "x"})
    assert unknown.unknown == {"ns.gone": "x"}


def test_an_excluded_table_is_skipped_by_every_operation_and_shown_as_excluded(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory(maintain={"expire_snapshots": {"retention_threshold": "1s"}})
    table = lh.add_table("lakehouse.logs", appends=8)
    table.transaction().set_properties(OFF).commit_transaction()
    orders = lh.add_table("lakehouse.orders", appends=1)
    lh.catalog.register_table(("lakehouse", "twin"), orders.metadata_location)
    before = lh.table("lakehouse.logs").metadata_location
    ref = TableRef.parse("lakehouse.logs")

    maintainer = Maintainer(lh.config, spark=_no_spark)
    result = maintainer.maintain_table(ref)

    assert result.ok and result.ops, result.as_dict()
    assert {op.status for op in result.ops} == {"skipped"}
    assert all("icegate.maintenance.enabled=false" in op.details for op in result.ops)
    assert all(op.output["excluded_by"] == "property" for op in result.ops)
    assert lh.table("lakehouse.logs").metadata_location == before  # nothing changed
    logged = [r for r in lh.log_rows() if r["table_name"] == "lakehouse.logs"]
    assert len(logged) == len(result.ops)
    assert all(r["status"] == "skipped" and "excluded" in r["details"] for r in logged)

    record = table_record(maintainer, ref, result)
    assert record.metadata["excluded"].text.startswith("excluded from maintenance")
    assert all(outcome.passed for outcome in record.outcomes)
    assert record.health is not None and record.health.state == "excluded"

    assert run_cli(["status", "--config", str(lh.config_path), "--json"]) == 0
    rows = {row["table"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["lakehouse.logs"]["health"]["state"] == "excluded"
    assert rows["lakehouse.logs"]["health"]["due_operations"] == []
    assert rows["lakehouse.twin"]["sharing"]["overlapping"] == ["lakehouse.orders"]
    assert rows["lakehouse.twin"]["sharing"]["unsafe"] is True
    assert rows["lakehouse.logs"]["sharing"]["overlapping"] == []
    assert run_cli(["status", "--config", str(lh.config_path)]) == 0
    text = capsys.readouterr().out
    [line] = [line for line in text.splitlines() if line.startswith("lakehouse.logs")]
    assert " excluded " in line and "icegate.maintenance.enabled=false" in line
    assert "warning: lakehouse.twin shares its location" in text


def _no_spark() -> object:
    raise AssertionError("an excluded table must not need Spark")


def _data_files(table: Table) -> list[str]:
    return list(table.inspect.files().column("file_path").to_pylist())


def test_dotted_names_are_told_apart_when_the_sharing_tables_are_consulted(
    tmp_path: Path,
) -> None:
    """Issue 37: tables are consulted by their identifier, never by a name split at its dots.
    Inside ``unit.orders``' folder live ``unit.x.y`` (table ``x.y`` in namespace ``unit``)
    and table ``y`` of the nested namespace ``unit.x``: both are spelled ``unit.x.y`` when
    joined. Every file either references is kept by the orders' deleting operations, each
    named by its own table."""
    catalog = sqlite_catalog(tmp_path)
    orders = create_table(catalog, "orders", appends=1)
    catalog.create_namespace(("unit", "x"))
    dotted = catalog.create_table(
        ("unit", "x.y"), schema=SCHEMA, location=f"{orders.location()}/dotted"
    )
    dotted.append(rows(1))
    nested = catalog.create_table(
        ("unit", "x", "y"), schema=SCHEMA, location=f"{orders.location()}/nested"
    )
    nested.append(rows(2))

    shared = shared_files(TableLocations(lambda: catalog), "unit.orders", orders.location())

    assert len(shared.tables) == 2, shared.tables
    owners = {shared.owner(path) for path in _data_files(dotted) + _data_files(nested)}
    assert None not in owners and len(owners) == 2, owners
    assert shared.owner(_data_files(dotted)[0]) == "unit.x.y"
    assert "unit.x" in str(shared.owner(_data_files(nested)[0]))


def test_a_dotted_table_name_alone_is_consulted_by_its_own_identifier(tmp_path: Path) -> None:
    """``unit.x.y`` (table ``x.y``) inside the orders' folder, no nested namespace: loading
    it by the joined name would ask for table ``y`` of namespace ``unit.x``, which does not
    exist, and refuse every deletion in the orders' folder for ever."""
    catalog = sqlite_catalog(tmp_path)
    orders = create_table(catalog, "orders", appends=1)
    dotted = catalog.create_table(
        ("unit", "x.y"), schema=SCHEMA, location=f"{orders.location()}/dotted"
    )
    dotted.append(rows(1))

    shared = shared_files(TableLocations(lambda: catalog), "unit.orders", orders.location())

    assert shared.tables == ("unit.x.y",)
    assert all(shared.owner(path) == "unit.x.y" for path in _data_files(dotted))


def test_a_configured_nested_namespace_yields_no_table_whose_key_names_another(
    tmp_path: Path,
) -> None:
    """Table ``t`` of the nested namespace ``unit.x`` would be keyed ``unit.x.t``, which
    parses as table ``x.t`` of namespace ``unit``: discovery leaves nested namespaces out
    (as the health trigger's listing does), and every key it gives names its own table."""
    catalog = sqlite_catalog(tmp_path)
    catalog.create_namespace(("unit", "x"))
    catalog.create_table(("unit", "x", "t"), schema=SCHEMA)
    catalog.create_table(("unit", "x.t"), schema=SCHEMA)

    found = discover_tables(catalog, ["unit", "unit.x"])

    assert found == [TableRef("unit", "x.t")]
    assert all(TableRef.parse(ref.key) == ref for ref in found)
