"""The Spark Connect server's command (``icegate_dagster.spark.connect_server``): what the
tests' server, ``bench peers --connect`` and the deploy guide start, read as argv."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from icegate_dagster.spark.conf import ICEBERG_EXTENSIONS
from icegate_dagster.spark.connect_server import SERVER_CLASS, ServerSpec, main, server_command
from icegate_dagster.spark.jars import connect_server_jar, iceberg_runtime_jar


def _confs(argv: list[str]) -> dict[str, str]:
    values = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--conf"]
    return dict(value.split("=", 1) for value in values)


def test_the_server_gets_the_pinned_jars_and_icebergs_extensions_and_no_catalog() -> None:
    jdbc = Path("/opt/drivers/sqlite-jdbc.jar")
    argv = server_command(ServerSpec(15123, "local[4]", "3g", 8, jdbc_jars=(jdbc,)))
    assert Path(argv[0]).name == "spark-submit"
    assert argv[argv.index("--class") + 1] == SERVER_CLASS
    assert argv[argv.index("--master") + 1] == "local[4]"
    assert argv[argv.index("--driver-memory") + 1] == "3g"
    jars = argv[argv.index("--jars") + 1].split(",")
    assert jars == [str(connect_server_jar()), str(iceberg_runtime_jar()), str(jdbc)]
    conf = _confs(argv)
    assert conf["spark.sql.extensions"] == ICEBERG_EXTENSIONS
    assert conf["spark.connect.grpc.binding.port"] == "15123"
    assert conf["spark.sql.shuffle.partitions"] == "8"
    # Catalogs (and their secrets) are each run's session settings, never the server's.
    assert not [key for key in conf if key.startswith("spark.sql.catalog.")]
    assert argv[-1] == "spark-internal"


def test_a_spark_that_ships_its_connect_server_gets_no_plugin_jar(tmp_path: Path) -> None:
    """Spark 4's distribution has its Connect server (``jars/spark-connect_2.13-*``);
    Spark 3.5's plugin jar is added only to a Spark without one."""
    home = tmp_path / "spark-4.1"
    (home / "jars").mkdir(parents=True)
    (home / "jars" / "spark-connect_2.13-4.1.4.jar").write_bytes(b"")
    argv = server_command(ServerSpec(15125), home)
    assert argv[0] == str(home / "bin" / "spark-submit")
    jars = argv[argv.index("--jars") + 1].split(",")
    assert str(connect_server_jar()) not in jars
    assert jars[0] == str(iceberg_runtime_jar())
    assert "--jars" not in server_command(ServerSpec(15126, iceberg=False), home)


def test_a_bare_server_has_neither_icebergs_runtime_nor_its_extensions() -> None:
    argv = server_command(ServerSpec(15124, iceberg=False))
    assert argv[argv.index("--jars") + 1] == str(connect_server_jar())
    assert "spark.sql.extensions" not in _confs(argv)


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        (lambda: ServerSpec(0), "port 0 is not a TCP port"),
        (lambda: ServerSpec(70000), "port 70000 is not a TCP port"),
        (lambda: ServerSpec(15002, shuffle_partitions=0), "shuffle_partitions 0 must be"),
    ],
)
def test_a_spec_out_of_bounds_is_refused_naming_the_value(spec: object, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        spec()  # type: ignore[operator]


def test_the_module_prints_the_command_a_shell_can_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--port", "15555", "--master", "local[8]", "--driver-memory", "8g"]) == 0
    argv = shlex.split(capsys.readouterr().out)
    assert argv == server_command(ServerSpec(15555, "local[8]", "8g"))
