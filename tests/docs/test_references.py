"""The generated references name everything the code defines, so they cannot drift from it:
every configuration field, every CLI command and option, every Dagster object."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, Field, create_model

from docs.gen import cli_reference, config_reference, dagster_reference, hooks
from icegate_dagster.assets.partition_events import PARTITION_METADATA
from icegate_dagster.cli.parser import build_parser
from icegate_dagster.config import IcegateConfig, config_from_dict
from icegate_dagster.config import models as config_models


def _settings_models() -> list[type[BaseModel]]:
    """Every settings model the config package defines, found independently of the walk."""
    return [
        model
        for model in vars(config_models).values()
        if isinstance(model, type)
        and issubclass(model, BaseModel)
        and model.__module__ == config_models.__name__
        and model.__name__ != "_Settings"
    ]


def test_the_config_reference_names_every_config_field() -> None:
    keys = config_reference.config_keys()
    documented = {key.field for key in keys}
    page = config_reference.markdown()
    for model in _settings_models():
        for name, field in model.model_fields.items():
            derived = config_reference._derived(field)
            nested = config_reference._settings_model(field.annotation) is not None
            if derived or (nested and (name,) not in config_reference.LEAVES):
                continue  # filled in by the loader, or a block whose keys are listed
            assert f"{model.__name__}.{name}" in documented, f"{model.__name__}.{name}"
    for key in keys:
        assert f"`{key.key}`" in page
        assert key.description, f"{key.key} has no Field(description=...)"
    assert len({key.key for key in keys}) == len(keys), "a key listed twice"


def test_the_reference_shows_the_codes_defaults_and_bounds() -> None:
    by_key = {key.key: key for key in config_reference.config_keys()}
    assert by_key["maintain.trigger.max_bytes"].default == "`100GB`"
    assert by_key["maintain.trigger.max_bytes"].type == "size"
    assert by_key["maintain.trigger.tables_per_run"].bounds == "≥ 1, ≤ 1000"
    # Bounds a validator enforces, named from its own constants.
    assert by_key["maintain.trigger.tick_deadline"].bounds == "≥ 5s, ≤ 50s"
    assert by_key["maintain.parallel_tables"].bounds == "≥ 1, ≤ 64"
    assert by_key["maintain.remove_orphan_files.retention_threshold"].bounds == "≥ 1d"
    assert by_key["maintain.optimize.strategy"].type == "one of `binpack`, `sort`"
    assert by_key["maintain.retention.<ns.table>.days"].default == "required"
    assert by_key["maintain.tables.<ns.table>"].type == "block"


def test_every_key_of_the_reference_is_a_key_the_loader_accepts(tmp_path: Path) -> None:
    """Each key, set to its documented default where the file writes it, loads (an unknown
    key would be refused), and loads to that default."""
    base = {"catalog": {"uri": "sqlite:///catalog.db"}}
    for key in config_reference.config_keys():
        if "<" in key.key or key.default in ("required", "none"):
            continue
        value = None if key.default == "unset" else yaml.safe_load(key.default.strip("`"))
        raw: dict[str, object] = yaml.safe_load(yaml.safe_dump(base))
        *parents, last = key.key.split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
        loaded = config_from_dict(raw, tmp_path)
        assert loaded == config_from_dict(base, tmp_path), key.key


def test_a_field_added_in_code_appears_without_writing_it_twice() -> None:
    grown = create_model(
        "Grown",
        __base__=IcegateConfig,
        brand_new=(int, Field(default=3, ge=2, description="a key added in code")),
    )
    [row] = [key for key in config_reference.config_keys(grown) if key.key == "brand_new"]
    assert (row.type, row.default, row.bounds, row.description) == (
        "integer",
        "`3`",
        "≥ 2",
        "a key added in code",
    )


def test_the_cli_reference_names_every_command_and_option() -> None:
    page = cli_reference.markdown()
    subcommands = list(cli_reference.subcommands(build_parser()))
    assert {name for name, _, _ in subcommands} >= {"demo", "status", "run", "orphans", "serve"}
    for name, summary, parser in subcommands:
        assert f"### `{name}`" in page and summary, name
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in page, f"{name} {flag}"
                    assert action.help, f"{name} {flag} has no help"
    assert "Exit codes: 0" in page


@pytest.fixture(scope="module")
def dagster_page() -> str:
    return dagster_reference.markdown()


def test_the_dagster_reference_names_every_object_of_the_code_location(dagster_page: str) -> None:
    from icegate_dagster.definitions import defs

    names = [
        *(spec.key.to_user_string() for spec in defs.resolve_all_asset_specs()),
        *(job.name for job in defs.resolve_all_job_defs() if job.name != "__ASSET_JOB"),
        *(sensor.name for sensor in defs.sensors or []),
        *(schedule.name for schedule in defs.schedules or []),
        *(spec.name for checks in defs.asset_checks or [] for spec in checks.check_specs),
        *PARTITION_METADATA,
    ]
    assert len(names) > 20
    for name in names:
        assert f"`{name}`" in dagster_page, name


def test_every_run_tag_in_the_code_is_described(dagster_page: str) -> None:
    tags = dagster_reference.tag_constants()
    assert {t.tag for t in tags} >= {"icegate/source", "icegate/trigger", "icegate/maintenance"}
    for tag in tags:
        assert tag.description, f"{tag.module}.{tag.name}: no #: comment above it"
        assert f"`{tag.tag}`" in dagster_page


def test_the_hook_fills_each_placeholder_and_refuses_an_unknown_one() -> None:
    page = "# CLI\n\n<!-- generated: cli-reference -->\n\nAfter.\n"
    expanded = hooks.expand(page)
    assert "<!-- generated" not in expanded and "### `run`" in expanded
    assert expanded.endswith("After.\n")
    with pytest.raises(ValueError, match="no generated reference 'nope'"):
        hooks.expand("<!-- generated: nope -->\n")
    block = hooks.expand("<!-- generated: config-block maintain.health -->\n")
    assert "`maintain.health.min_score`" in block and "`maintain.trigger" not in block
    with pytest.raises(ValueError, match="no configuration block 'maintain.nope'"):
        hooks.expand("<!-- generated: config-block maintain.nope -->\n")
