"""The Dagster reference: the code location's assets, checks, jobs, sensors, schedules,
resources, run tags and partition metadata keys, read from its definitions.

The objects come from ``icegate_dagster.definitions.defs`` through Dagster's public API
(their names, descriptions, tags, intervals); the run tags our sensors and CLI set are the
package's ``*_TAG = "icegate/..."`` constants, each described by the ``#:`` comment above
it; the partition metadata keys are ``PARTITION_METADATA``.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

import icegate_dagster
from docs.gen.markdown import table
from icegate_dagster.assets.partition_events import PARTITION_METADATA

#: The prefix of this code location's own tags.
TAG_PREFIX = "icegate/"
#: Dagster's job for assets materialized outside any job of ours: not one of ours.
IMPLICIT_JOB = "__ASSET_JOB"


@dataclass(frozen=True)
class TagConstant:
    """A tag the code sets, as a module constant: ``TABLE_TAG = "icegate/table"``."""

    tag: str
    name: str
    module: str
    description: str


def tag_constants(package: Path | None = None) -> list[TagConstant]:
    """Every module-level ``NAME = "icegate/..."`` of the package, with its ``#:`` comment."""
    root = package or Path(icegate_dagster.__file__).parent
    found: list[TagConstant] = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for node in ast.parse(source).body:
            if not (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                and node.value.value.startswith(TAG_PREFIX)
            ):
                continue
            comment: list[str] = []
            line = node.lineno - 2  # the line above, 0-based
            while line >= 0 and lines[line].lstrip().startswith("#:"):
                comment.insert(0, lines[line].lstrip()[2:].strip())
                line -= 1
            module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
            found.append(
                TagConstant(node.value.value, node.targets[0].id, module, _plain(" ".join(comment)))
            )
    return found


def _plain(text: str) -> str:
    return text.replace("``", "`")


def _first_paragraph(text: str | None) -> str:
    paragraph = inspect.cleandoc(text or "").split("\n\n")[0]
    return _plain(" ".join(paragraph.split()))


def _jobs(defs: dg.Definitions) -> list[dg.JobDefinition]:
    return [job for job in defs.resolve_all_job_defs() if job.name != IMPLICIT_JOB]


def _assets(defs: dg.Definitions) -> list[str]:
    rows = []
    for spec in defs.resolve_all_asset_specs():
        upstream = ", ".join(f"`{dep.asset_key.to_user_string()}`" for dep in spec.deps)
        partitions = getattr(spec.partitions_def, "name", None)
        rows.append(
            [
                f"`{spec.key.to_user_string()}`",
                f"`{spec.group_name}`",
                f"one per table (`{partitions}`)" if partitions else "",
                upstream,
                spec.description or "",
            ]
        )
    return table(["asset", "group", "partitions", "downstream of", "what it is"], rows)


def _checks(defs: dg.Definitions) -> list[str]:
    rows = [
        [f"`{spec.name}`", f"`{spec.asset_key.to_user_string()}`", spec.description or ""]
        for checks in defs.asset_checks or []
        if isinstance(checks, dg.AssetChecksDefinition)
        for spec in checks.check_specs
    ]
    return table(["check", "on", "what it judges"], rows)


def _tags(tags: Mapping[str, str]) -> str:
    return ", ".join(f"`{key}={value}`" for key, value in sorted(tags.items()))


def _job_rows(defs: dg.Definitions) -> list[str]:
    rows = []
    for job in _jobs(defs):
        steps = ", ".join(f"`{op.name}`" for op in job.graph.iterate_op_defs())
        rows.append([f"`{job.name}`", job.description or "", steps, _tags(job.tags)])
    return table(["job", "what it does", "steps", "run tags"], rows)


def _sensors(defs: dg.Definitions) -> list[str]:
    rows = [
        [
            f"`{sensor.name}`",
            f"{sensor.minimum_interval_seconds} s",
            sensor.default_status.value.lower(),
            sensor.description or "",
        ]
        for sensor in defs.sensors or []
        if isinstance(sensor, dg.SensorDefinition)
    ]
    return table(["sensor", "every", "by default", "what it does"], rows)


def _schedules(defs: dg.Definitions) -> list[str]:
    rows = [
        [
            f"`{schedule.name}`",
            f"`{schedule.cron_schedule}` {schedule.execution_timezone or 'UTC'}",
            f"`{schedule.job_name}`",
            schedule.default_status.value.lower(),
            schedule.description or "",
        ]
        for schedule in defs.schedules or []
        if isinstance(schedule, dg.ScheduleDefinition)
    ]
    return table(["schedule", "when", "job", "by default", "what it does"], rows)


def _resources(defs: dg.Definitions) -> list[str]:
    rows = [
        [f"`{key}`", f"`{type(resource).__name__}`", _first_paragraph(type(resource).__doc__)]
        for key, resource in sorted((defs.resources or {}).items())
    ]
    return table(["resource key", "class", "what it is"], rows)


def _tag_rows(defs: dg.Definitions) -> Iterator[list[str]]:
    constants = {constant.tag: constant for constant in tag_constants()}
    on_jobs: dict[str, list[str]] = {}
    for job in _jobs(defs):
        for key, value in job.tags.items():
            on_jobs.setdefault(key, []).append(f"`{job.name}` (`{value}`)")
    for tag in sorted({*constants, *(t for t in on_jobs if t.startswith(TAG_PREFIX))}):
        constant = constants.get(tag)
        where = f"every run of {', '.join(on_jobs[tag])}" if tag in on_jobs else ""
        source = f"`{constant.module}.{constant.name}`" if constant else ""
        yield [f"`{tag}`", constant.description if constant else where, where, source]


def _step_tags(defs: dg.Definitions) -> list[str]:
    steps: dict[str, set[str]] = {}
    for job in _jobs(defs):
        for op in job.graph.iterate_op_defs():
            for key, value in (op.tags or {}).items():
                if key.startswith(TAG_PREFIX):
                    steps.setdefault(key, set()).add(f"`{value}`")
    rows = [[f"`{key}`", ", ".join(sorted(values))] for key, values in sorted(steps.items())]
    return table(["step tag", "values"], rows)


def _metadata_keys() -> list[str]:
    rows = [[f"`{key}`", meaning] for key, meaning in PARTITION_METADATA.items()]
    return table(["key", "what it says"], rows)


def markdown(defs: dg.Definitions | None = None) -> str:
    """The reference, one section per kind of object."""
    if defs is None:
        from icegate_dagster.definitions import defs as code_location

        defs = code_location
    sections = [
        ("Assets", _assets(defs)),
        ("Asset checks", _checks(defs)),
        ("Jobs", _job_rows(defs)),
        ("Sensors", _sensors(defs)),
        ("Schedules", _schedules(defs)),
        ("Resources", _resources(defs)),
        ("Run tags", table(["tag", "what it says", "set on", "in code"], list(_tag_rows(defs)))),
        ("Step tags", _step_tags(defs)),
        ("Partition metadata", _metadata_keys()),
    ]
    lines: list[str] = []
    for title, body in sections:
        lines += [f"### {title}", "", *body]
    return "\n".join(lines)
