"""The bad-input catalogue: every bad input fails clearly, alone, and loses nothing.

Each case asserts a clear message naming the offending input, the exit code
(2 for bad usage or configuration, 1 for a failed table or operation), that the
rows of the healthy tables are unchanged and that they were still maintained.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from icegate_dagster.cli.dispatch import run_cli
from tests.lakehouse import SCHEMA, SPEC, Lakehouse, LakehouseFactory, batch, make_lakehouse

HEALTHY = "lakehouse.healthy"
#: With two appends per table, two small files per partition are enough to rewrite.
RULES: dict[str, Any] = {"optimize": {"min_input_files": 2}}
#: The full pass of a lakehouse without ``wal.root`` or TTL rules.
PASS = [
    "optimize",
    "rewrite_position_delete_files",
    "rewrite_manifests",
    "expire_snapshots",
    "remove_orphan_files",
]


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = run_cli(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text, text


def metadata_rows(lh: Lakehouse, key: str) -> Counter[tuple[Any, ...]]:
    """A table's rows as a multiset, read through pyiceberg (no JVM)."""
    return Counter(tuple(r.values()) for r in lh.table(key).scan().to_arrow().to_pylist())


def log_statuses(lh: Lakehouse, key: str) -> list[tuple[str, str]]:
    """``(operation, status)`` of every log row of ``key``, in pass order."""
    rows = [r for r in lh.log_rows() if r["table_name"] == key]
    order = {name: i for i, name in enumerate(["wal_compaction", *PASS])}
    return sorted(((r["operation"], r["status"]) for r in rows), key=lambda p: order[p[0]])


#: A healthy operation either did its work or found, from metadata, nothing to do.
RAN = ("completed", "skipped")


def assert_maintained(lh: Lakehouse, key: str, ops: list[str] | None = None) -> None:
    statuses = log_statuses(lh, key)
    assert [op for op, _ in statuses] == list(ops or PASS), statuses
    assert all(status in RAN for _, status in statuses), statuses


def by_table(out: str) -> dict[str, dict[str, Any]]:
    return {t["table"]: t for t in json.loads(out)["tables"]}


def messages(table: dict[str, Any]) -> str:
    """Everything the report says went wrong with one table."""
    parts = [table["error"] or ""]
    parts += [op["error"] or "" for op in table["ops"]]
    return "\n".join(parts)


def ops_of(table: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {op["operation"]: op for op in table["ops"]}


# -- 1-9 and more: an invalid configuration stops the command, exit 2 --------------------


@dataclass(frozen=True)
class ConfigCase:
    """``edit`` changes the lakehouse's valid config dict; ``text`` replaces the file."""

    needles: tuple[str, ...]
    edit: Callable[[dict[str, Any]], None] | None = None
    text: str | None = None
    missing_file: bool = False


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(raw: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node = raw
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return edit


CONFIG_CASES = {
    "invalid-yaml": ConfigCase(
        ("is not valid YAML", "line 3"), text="maintain:\n  optimize: [unclosed\n  x: 1\n"
    ),
    "unknown-key": ConfigCase(
        ("maintain.optimize.min_input_file = 3", "unknown key"),
        _set("maintain/optimize/min_input_file", 3),
    ),
    "unknown-top-level-key": ConfigCase(("mantain = ", "unknown key"), _set("mantain", {})),
    "wrong-type": ConfigCase(
        ("maintain.optimize.min_input_files = 'many'", "integer"),
        _set("maintain/optimize/min_input_files", "many"),
    ),
    "wrong-enum": ConfigCase(
        ("maintain.optimize.strategy = 'zorder'", "binpack"),
        _set("maintain/optimize/strategy", "zorder"),
    ),
    "negative-duration": ConfigCase(
        ("maintain.expire_snapshots.retention_threshold = '-1d'", "positive"),
        _set("maintain/expire_snapshots/retention_threshold", "-1d"),
    ),
    "zero-duration": ConfigCase(
        ("maintain.expire_snapshots.retention_threshold = '0s'", "positive"),
        _set("maintain/expire_snapshots/retention_threshold", "0s"),
    ),
    "duration-without-unit": ConfigCase(
        ("maintain.expire_snapshots.retention_threshold = 7", "duration such as"),
        _set("maintain/expire_snapshots/retention_threshold", 7),
    ),
    "orphans-under-24h": ConfigCase(
        ("maintain.remove_orphan_files.retention_threshold = '12h'", "at least 24h"),
        _set("maintain/remove_orphan_files/retention_threshold", "12h"),
    ),
    "retain-last-0": ConfigCase(
        ("maintain.expire_snapshots.retain_last = 0", "greater than or equal to 1"),
        _set("maintain/expire_snapshots/retain_last", 0),
    ),
    "retain-last-0-per-table": ConfigCase(
        ("maintain.tables.lakehouse.healthy.expire_snapshots.retain_last = 0",),
        _set("maintain/tables", {HEALTHY: {"expire_snapshots": {"retain_last": 0}}}),
    ),
    "negative-size": ConfigCase(
        ("maintain.optimize.file_size_threshold = '-5MB'", "negative"),
        _set("maintain/optimize/file_size_threshold", "-5MB"),
    ),
    "negative-size-in-bytes": ConfigCase(
        ("maintain.checks.max_wal_bytes = -1", "negative"),
        _set("maintain/checks/max_wal_bytes", -1),
    ),
    "sql-in-sort-order": ConfigCase(
        ("maintain.optimize.sort_order = 'id; DROP TABLE x'", "zorder"),
        _set("maintain/optimize/sort_order", "id; DROP TABLE x"),
    ),
    "unset-env-var": ConfigCase(
        ("catalog.warehouse", "${ICEGATE_TEST_UNSET}", "not set"),
        _set("catalog/warehouse", "${ICEGATE_TEST_UNSET}"),
    ),
    "config-path-missing": ConfigCase(
        ("--config = ", "nope.yaml", "file not found"), None, None, True
    ),
}


@pytest.mark.parametrize("case", CONFIG_CASES.values(), ids=CONFIG_CASES.keys())
def test_invalid_config_exits_2_naming_key_and_value(
    case: ConfigCase,
    lakehouse_factory: LakehouseFactory,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ICEGATE_TEST_UNSET", raising=False)
    lh = lakehouse_factory(maintain=RULES)
    lh.add_table(HEALTHY, appends=2)
    before = (lh.table(HEALTHY).metadata_location, metadata_rows(lh, HEALTHY))
    path = lh.root / "bad.yaml"
    if case.text is not None:
        path.write_text(case.text)
    elif case.edit is not None:
        raw = yaml.safe_load(lh.config_path.read_text())
        case.edit(raw)
        path.write_text(yaml.safe_dump(raw))
    if case.missing_file:
        path = lh.root / "nope.yaml"

    code, out, err = cli(["run", "--config", str(path)], capsys)

    assert code == 2, (out, err)
    assert err.startswith("icegate-maintain: error: invalid config"), err
    for needle in case.needles:
        assert needle in err, (needle, err)
    if case.text is not None or case.missing_file:
        assert str(path) in err
    no_traceback(out, err)
    # Nothing ran: the table is untouched and no log was written.
    assert (lh.table(HEALTHY).metadata_location, metadata_rows(lh, HEALTHY)) == before
    assert not lh.catalog.table_exists(("lakehouse", "_maintenance_log"))


# -- 11-12: an unreachable catalog, exit 1 -------------------------------------------------

PG_PASSWORD = "s3cr3t-Pa55word"


@pytest.mark.parametrize(
    ("uri", "needles"),
    [
        pytest.param(
            "sqlite:///{root}/no/such/folder/catalog.db",
            ("'bad_catalog'", "{root}/no/such/folder", "does not exist"),
            id="sqlite-folder-missing",
        ),
        pytest.param(
            # /proc refuses new files even to root: a folder nobody can write in.
            "sqlite:////proc/icegate-catalog.db",
            ("'bad_catalog'", "/proc/icegate-catalog.db", "cannot be opened"),
            id="sqlite-folder-not-writable",
        ),
        pytest.param(
            "postgresql+psycopg2://u:${PGPASS}@127.0.0.1:1/db",
            ("'bad_catalog'", "127.0.0.1:1", "cannot be opened"),
            id="postgresql-down",
        ),
    ],
)
def test_unreachable_catalog_fails_clearly_without_secrets(
    uri: str,
    needles: tuple[str, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGPASS", PG_PASSWORD)
    config = tmp_path / "icegate.yaml"
    raw = {
        "catalog": {
            "name": "bad_catalog",
            "uri": uri.replace("{root}", str(tmp_path)),
            "warehouse": (tmp_path / "warehouse").as_uri(),
        }
    }
    config.write_text(yaml.safe_dump(raw))

    for command in (["run"], ["status"], ["discover"]):
        code, out, err = cli([*command, "--config", str(config)], capsys)

        assert code == 1, (command, out, err)
        for needle in needles:
            assert needle.replace("{root}", str(tmp_path)) in err, (needle, err)
        assert PG_PASSWORD not in out + err
        no_traceback(out, err)
    assert not (tmp_path / "no").exists()  # nothing was created on the way
    assert not (tmp_path / "warehouse").exists()


# -- 10, 13-15, 18, 19, 25: one bad table fails alone, the others are maintained ---------


@dataclass
class TableCase:
    """A lakehouse with HEALTHY plus a broken or odd table, run through ``run --json``."""

    setup: Callable[[Lakehouse], None]
    #: ``--table`` arguments; none: every discovered table.
    tables: tuple[str, ...] = ()
    code: int = 1
    #: The table the report blames and what its messages must say.
    culprit: str = ""
    needles: tuple[str, ...] = ()
    #: Operation statuses of the culprit, when it ran at all.
    statuses: dict[str, str] = field(default_factory=dict)
    check: Callable[[Lakehouse, dict[str, Any]], None] | None = None


def _no_setup(lh: Lakehouse) -> None:
    pass


def _missing_warehouse(lh: Lakehouse) -> None:
    elsewhere = lh.root / "other-warehouse"
    lh.catalog.create_table(
        ("lakehouse", "broken"),
        schema=SCHEMA,
        partition_spec=SPEC,
        location=(elsewhere / "broken").as_uri(),
    ).append(batch(0, ("api", "web")))
    shutil.rmtree(elsewhere)


def _corrupt_metadata(lh: Lakehouse) -> None:
    table = lh.add_table("lakehouse.broken", appends=2)
    Path(table.metadata_location.removeprefix("file://")).write_text("{ this is not json")


def _missing_data_file(lh: Lakehouse) -> None:
    lh.add_table("lakehouse.broken", appends=2)
    lost = [p for p in lh.data_file_paths("lakehouse.broken") if "service=api" in str(p)][0]
    lost.unlink()
    (lh.root / "lost.txt").write_text(lost.name)


def _lost_file_named(lh: Lakehouse, report: dict[str, Any]) -> None:
    lost = (lh.root / "lost.txt").read_text()
    assert lost in ops_of(report["lakehouse.broken"])["optimize"]["error"]
    failed = [r for r in lh.log_rows() if r["status"] == "failed"]
    assert [(r["table_name"], r["operation"]) for r in failed] == [("lakehouse.broken", "optimize")]
    assert lost in failed[0]["details"]


def _empty_table(lh: Lakehouse) -> None:
    lh.add_table("lakehouse.empty", appends=0)


def _empty_skipped(lh: Lakehouse, report: dict[str, Any]) -> None:
    assert log_statuses(lh, "lakehouse.empty") == [(op, "skipped") for op in PASS]
    assert lh.table("lakehouse.empty").current_snapshot() is None


def _one_file(lh: Lakehouse) -> None:
    lh.add_table("lakehouse.single", appends=1, services=("api",))


def _one_file_intact(lh: Lakehouse, report: dict[str, Any]) -> None:
    single = report["lakehouse.single"]
    assert single["before"]["data_files"] == single["after"]["data_files"] == 1
    assert ops_of(single)["optimize"]["status"] == "skipped"  # nothing to compact, no Spark job
    assert sum(lh.rows("lakehouse.single").values()) == 5
    assert_maintained(lh, "lakehouse.single")


#: A table that cannot be read: each operation of its pass fails, and is logged so (rule 1).
ALL_FAILED = dict.fromkeys(PASS, "failed")


def _failures_logged(lh: Lakehouse, report: dict[str, Any]) -> None:
    rows = [r for r in lh.log_rows() if r["table_name"] == "lakehouse.broken"]
    assert len(rows) == len(PASS) and {r["status"] for r in rows} == {"failed"}
    assert all("cannot read its metadata" in r["details"] for r in rows)


TABLE_CASES = [
    pytest.param(
        TableCase(
            _no_setup,
            tables=("lakehouse.nope", HEALTHY),
            culprit="lakehouse.nope",
            needles=("'lakehouse.nope' does not exist",),
            # Every operation it would have run fails, and is logged as failed.
            statuses=ALL_FAILED,
        ),
        id="table-does-not-exist",
    ),
    pytest.param(
        TableCase(
            _no_setup,
            tables=("a.b.c", HEALTHY),
            culprit="a.b.c",
            needles=("'a.b.c'",),
            statuses=ALL_FAILED,
        ),
        id="dotted-name-a.b.c",
    ),
    pytest.param(
        TableCase(
            _missing_warehouse,
            culprit="lakehouse.broken",
            needles=("other-warehouse/broken/metadata",),
            statuses=ALL_FAILED,
            check=_failures_logged,
        ),
        id="warehouse-folder-missing",
    ),
    pytest.param(
        TableCase(
            _corrupt_metadata,
            culprit="lakehouse.broken",
            needles=("'lakehouse.broken': cannot read its metadata",),
            statuses=ALL_FAILED,
            check=_failures_logged,
        ),
        id="corrupt-metadata-json",
    ),
    pytest.param(
        TableCase(
            _missing_data_file,
            culprit="lakehouse.broken",
            statuses={
                "optimize": "failed",
                "rewrite_position_delete_files": "skipped",  # it has no delete files
                "rewrite_manifests": "completed",
                "expire_snapshots": "skipped",  # nothing is 7 days old
                "remove_orphan_files": "skipped",
            },
            check=_lost_file_named,
        ),
        id="missing-data-file",
    ),
    pytest.param(TableCase(_empty_table, code=0, check=_empty_skipped), id="empty-table"),
    pytest.param(TableCase(_one_file, code=0, check=_one_file_intact), id="table-with-one-file"),
]


@pytest.mark.parametrize("case", TABLE_CASES)
def test_a_bad_table_fails_alone(
    case: TableCase, lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory(maintain=RULES)
    lh.add_table(HEALTHY, appends=2)
    case.setup(lh)
    healthy_rows = lh.rows(HEALTHY)
    table_args = [arg for name in case.tables for arg in ("--table", name)]

    code, out, err = cli(["run", *table_args, "--config", str(lh.config_path), "--json"], capsys)

    assert code == case.code, (out, err)
    no_traceback(out, err)
    report = by_table(out)
    if case.culprit:
        culprit = report[case.culprit]
        assert culprit["ok"] is False
        said = messages(culprit)
        for needle in case.needles:
            assert needle in said, (needle, said)
        assert {op["operation"]: op["status"] for op in culprit["ops"]} == case.statuses
    else:
        assert all(t["ok"] for t in report.values()), report
    if case.check is not None:
        case.check(lh, report)
    # Nothing lost, and the healthy table was maintained all the same.
    # An unreadable table whose metadata file lies in a folder apart does not hold back
    # HEALTHY's orphan removal (issue 37: it fails alone, no alert on every other table).
    assert report[HEALTHY]["ok"] is True, report[HEALTHY]["ops"]
    assert report[HEALTHY]["after"]["data_files"] == 2  # one per partition
    assert lh.rows(HEALTHY) == healthy_rows
    assert_maintained(lh, HEALTHY)


def test_a_table_with_corrupt_metadata_is_named_in_the_human_report(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory(maintain=RULES)
    lh.add_table(HEALTHY, appends=2)
    _corrupt_metadata(lh)

    code, out, err = cli(["status", "--config", str(lh.config_path)], capsys)

    assert code == 1
    no_traceback(out, err)
    [line] = [line for line in out.splitlines() if "error:" in line]
    assert line.startswith("lakehouse.broken ")
    [healthy] = [line for line in out.splitlines() if line.startswith(HEALTHY)]
    assert "error" not in healthy


def test_a_table_in_a_nested_namespace_is_not_called_missing(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    lh.catalog.create_namespace_if_not_exists(("a", "b"))
    lh.catalog.create_table(("a", "b", "c"), schema=SCHEMA).append(batch(0, ("api",)))

    code, out, err = cli(["status", "--table", "a.b.c", "--config", str(lh.config_path)], capsys)

    no_traceback(out, err)
    # Either its stats, or a refusal that says why: never "does not exist".
    assert "does not exist" not in out + err, out
    if code == 0:
        assert "a.b.c" in out and " 5 " in out
    else:
        assert "a.b.c" in out + err and "nested" in out + err


@dataclass
class SharedRun:
    """One ``run --json`` over a lakehouse built once for a whole group of cases."""

    lh: Lakehouse
    before: dict[str, Counter[tuple[Any, ...]]]
    code: int
    out: str
    err: str

    @property
    def report(self) -> dict[str, dict[str, Any]]:
        return by_table(self.out)


def shared_run(lh: Lakehouse, tables: list[str]) -> SharedRun:
    """Record every table's rows, then run the pass (capsys is function-scoped, hence this)."""
    before = {key: lh.rows(key) for key in tables}
    out, err = io.StringIO(), io.StringIO()
    table_args = [arg for key in tables for arg in ("--table", key)]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_cli(["run", *table_args, "--config", str(lh.config_path), "--json"])
    return SharedRun(lh, before, code, out.getvalue(), err.getvalue())


# -- 16-17: bad WAL files are quarantined, the rest lands ---------------------------------

GOOD_WAL = [batch(50_000 + 100 * i, ("api",)) for i in range(2)]


def _corrupt_wal(lh: Lakehouse, key: str) -> str:
    (lh.wal_dir(key) / "wal-corrupt.parquet").write_bytes(b"PAR1 this is not parquet")
    return "wal-corrupt.parquet"


def _mismatched_wal(lh: Lakehouse, key: str) -> str:
    rows = pa.Table.from_pydict({"id": ["not a number"], "service": ["api"]})
    pq.write_table(rows, lh.wal_dir(key) / "wal-mismatched.parquet")
    return "wal-mismatched.parquet"


#: table -> (how its bad file is planted, what the quarantine reason must say)
WAL_CASES: dict[str, tuple[Callable[[Lakehouse, str], str], str]] = {
    "lakehouse.corrupt_wal": (_corrupt_wal, "unreadable Parquet"),
    "lakehouse.mismatched_wal": (_mismatched_wal, "'id'"),
}


@pytest.fixture(scope="module")
def wal_run(tmp_path_factory: pytest.TempPathFactory) -> SharedRun:
    rules = {**RULES, "compaction": {"min_files": 2}}
    lh = make_lakehouse(tmp_path_factory.mktemp("wal"), rules, wal=True)
    lh.add_table(HEALTHY, appends=2)
    for key, (plant, _reason) in WAL_CASES.items():
        lh.add_table(key, appends=2)
        for i, rows in enumerate(GOOD_WAL):
            lh.write_wal(key, rows, f"wal-{i}.parquet")
        plant(lh, key)
    return shared_run(lh, [HEALTHY, *WAL_CASES])


@pytest.mark.parametrize(
    "key",
    [
        pytest.param("lakehouse.corrupt_wal", id="corrupt-wal-file"),
        pytest.param("lakehouse.mismatched_wal", id="wal-schema-mismatch"),
    ],
)
def test_a_bad_wal_file_is_quarantined_and_the_rest_lands(wal_run: SharedRun, key: str) -> None:
    lh, (plant, reason) = wal_run.lh, WAL_CASES[key]
    bad = "wal-corrupt.parquet" if plant is _corrupt_wal else "wal-mismatched.parquet"

    assert wal_run.code == 0, (wal_run.out, wal_run.err)
    no_traceback(wal_run.out, wal_run.err)
    wal = ops_of(wal_run.report[key])["wal_compaction"]
    assert wal["status"] == "completed", wal
    assert bad in wal["details"]
    [quarantined] = wal["output"]["quarantined"]
    assert quarantined["file"] == bad and reason in quarantined["reason"], quarantined
    assert (lh.wal_dir(key) / "_quarantine" / bad).is_file()
    assert lh.wal_files(key) == []
    before, after = wal_run.before[key], lh.rows(key)
    assert after & before == before  # nothing lost
    landed = Counter(row[0] for row in (after - before).elements())
    assert landed == Counter(i for rows in GOOD_WAL for i in rows.column("id").to_pylist())
    assert_maintained(lh, key, ["wal_compaction", *PASS])
    # The table without a WAL was maintained all the same.
    assert lh.rows(HEALTHY) == wal_run.before[HEALTHY]
    assert log_statuses(lh, HEALTHY)[0] == ("wal_compaction", "skipped")
    assert_maintained(lh, HEALTHY, ["wal_compaction", *PASS])


# -- 20-24: odd table names are data, never SQL --------------------------------------------

SENTINEL = "lakehouse.x"
ODD_NAMES = {
    "double-quote-and-space": '"odd name"',
    "single-quote": "it's",
    "backtick": "`tick`",
    "semicolon-drop-table": "a;DROP TABLE x",
    "space": "with space",
    "unicode": "séries_日本",
    "backslash": "back\\slash",
    # Spark SQL's variable syntax: expanded, it would read an environment variable into
    # the SQL, and "x${nope}" would become the sentinel "x".
    "spark-env-variable": "t${env:ICEGATE_TEST_SUBST}",
    "spark-variable": "x${nope}",
}
SUBST_SECRET = "subst-SECRET-41d2"


@pytest.fixture(scope="module")
def odd_run(tmp_path_factory: pytest.TempPathFactory) -> SharedRun:
    lh = make_lakehouse(tmp_path_factory.mktemp("odd"), RULES)
    lh.add_table(SENTINEL, appends=2)
    for name in ODD_NAMES.values():
        lh.add_table(f"lakehouse.{name}", appends=2)
    os.environ["ICEGATE_TEST_SUBST"] = SUBST_SECRET
    try:
        return shared_run(lh, [f"lakehouse.{name}" for name in ODD_NAMES.values()] + [SENTINEL])
    finally:
        del os.environ["ICEGATE_TEST_SUBST"]


@pytest.mark.parametrize("name", ODD_NAMES.values(), ids=ODD_NAMES.keys())
def test_odd_table_names_are_maintained_as_data(odd_run: SharedRun, name: str) -> None:
    key, lh = f"lakehouse.{name}", odd_run.lh

    no_traceback(odd_run.out, odd_run.err)
    table = odd_run.report[key]
    assert table["ok"] is True, table
    assert table["before"]["data_files"] == 4 and table["after"]["data_files"] == 2
    assert lh.rows(key) == odd_run.before[key]
    assert_maintained(lh, key)  # the log holds the exact name


def test_odd_table_names_leave_the_sentinel_alone(
    odd_run: SharedRun, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = odd_run.lh
    assert odd_run.code == 0, (odd_run.out, odd_run.err)
    # No statement ran beyond the quoted names: the sentinel is there, rows and all.
    assert lh.catalog.table_exists(("lakehouse", "x"))
    assert lh.rows(SENTINEL) == odd_run.before[SENTINEL]
    assert_maintained(lh, SENTINEL)
    # No name was expanded by Spark: nothing read the environment variable.
    assert SUBST_SECRET not in odd_run.out + odd_run.err
    assert SUBST_SECRET not in json.dumps(lh.log_rows(), default=str)
    # Discovery hands the names back exactly.
    code, out, _err = cli(["discover", "--config", str(lh.config_path), "--json"], capsys)
    assert code == 0
    assert json.loads(out) == sorted([SENTINEL, *(f"lakehouse.{n}" for n in ODD_NAMES.values())])


# -- 26: Spark cannot start ---------------------------------------------------------------


def _with_missing_jar(lh: Lakehouse) -> Path:
    raw = yaml.safe_load(lh.config_path.read_text())
    raw["spark"]["conf"] = {"spark.jars": "/nonexistent/x.jar"}
    path = lh.root / "jar.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_missing_spark_jar_fails_clearly_in_process(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """The jar is checked before the JVM is touched, so the shared session survives."""
    lh = lakehouse_factory(maintain=RULES)
    lh.add_table(HEALTHY, appends=2)
    location, rows = lh.table(HEALTHY).metadata_location, lh.rows(HEALTHY)

    code, out, err = cli(["run", "--config", str(_with_missing_jar(lh))], capsys)

    assert code >= 1
    no_traceback(out, err)
    assert "'/nonexistent/x.jar' does not exist" in out + err
    assert lh.table(HEALTHY).metadata_location == location
    assert lh.rows(HEALTHY) == rows  # and the shared session still works


def test_missing_spark_jar_fails_clearly_from_the_shell(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory(maintain=RULES)
    lh.add_table(HEALTHY, appends=2)
    rows = metadata_rows(lh, HEALTHY)

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "icegate_dagster.cli",
            "run",
            "--config",
            str(_with_missing_jar(lh)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )

    assert proc.returncode >= 1, proc
    no_traceback(proc.stdout, proc.stderr)
    assert "'/nonexistent/x.jar' does not exist" in proc.stdout + proc.stderr
    assert metadata_rows(lh, HEALTHY) == rows
