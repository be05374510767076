"""The bench's harness: every side a cold process, sides alternated, medians, the figures.

A benchmark (``bench.passes``, ``bench.compaction``, ``bench.triggers``, ``bench.at_scale``,
``bench.peers``) builds its fixtures untimed, describes each side of its comparison as a
:class:`Side` whose ``run`` restores a fixture and measures one new process (:func:`cold`),
lets :func:`alternate` run the sides repetition after repetition in flipping order, and
returns :class:`Figure` lines: the medians, their ratio (ours / baseline) and the target.
``bench.run`` (the command line) prints them and :func:`summary_table` at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.measure import ProcessRun, SideFailed, run_process

REPO = Path(__file__).resolve().parent.parent

# -- settings ---------------------------------------------------------------------------------


@dataclass
class Settings:
    """What the command line asked for."""

    reps: int = 3
    big_reps: int = 1
    scale_max: int = 100
    quick: bool = False
    timeout: float = 7200.0
    gigabytes: float = 1.0
    #: ``daemon``'s lakehouse sizes, and the instance settings its daemon runs with.
    daemon_tables: tuple[int, ...] = (20, 100)
    dagster_yaml: Path = REPO / "dagster.yaml"
    #: ``maintain.trigger.tables_per_run`` for ``daemon`` (None: the default).
    tables_per_run: int | None = None
    #: ``scale``'s lakehouse size.
    scale_tables: int = 10_000
    #: ``monitoring``'s lakehouse size.
    monitoring_tables: int = 1000
    #: ``peers``' repetitions of W1 and of W2.
    peer_reps: tuple[int, int] = (6, 4)
    #: ``peers`` and ``daemon``: our side a thin client of a warm Spark Connect server
    #: (``bench.connect``) instead of a driver of its own.
    connect: bool = False

    def pick(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full


# -- figures ----------------------------------------------------------------------------------


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"


@dataclass
class Figure:
    """One measure: medians of both sides, their ratio (ours / baseline) and the target."""

    name: str
    ours: float
    baseline: float | None
    unit: str
    target: str
    met: bool | None  # None: shown for reference, no target
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.ours / self.baseline if self.baseline else None

    @property
    def verdict(self) -> str:
        return "-" if self.met is None else ("MET" if self.met else "NOT MET")

    def line(self) -> str:
        ratio = "-" if self.ratio is None else f"{self.ratio:.2f}"
        return (
            f"{self.name:<24} ours {_num(self.ours):>9} {self.unit:<4} "
            f"baseline {_num(self.baseline):>9} {self.unit if self.baseline else '':<4} "
            f"ratio {ratio:>6}  "
            f"target {self.target:<26} {self.verdict:<7}  {self.note}"
        )

    def row(self) -> list[str]:
        ratio = "-" if self.ratio is None else f"{self.ratio:.2f}"
        return [
            self.name,
            f"{_num(self.ours)} {self.unit}",
            "-" if self.baseline is None else f"{_num(self.baseline)} {self.unit}",
            ratio,
            self.target,
            self.verdict,
        ]


def summary_table(figures: list[Figure]) -> str:
    head = ["measure", "ours (median)", "baseline (median)", "ratio", "target", "verdict"]
    rows = [head] + [f.row() for f in figures]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- running sides ----------------------------------------------------------------------------


@dataclass
class Sample:
    """One process (or one side's processes) as measured by this parent."""

    seconds: float
    peak_mb: float
    jvm: bool
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Side:
    """One side of a comparison: ``run`` restores its fixture and measures one repetition."""

    label: str
    run: Callable[[], Sample]


@dataclass
class Summary:
    """A side's samples: median time, highest peak, whether any run had a JVM."""

    label: str
    samples: list[Sample]

    @property
    def seconds(self) -> float:
        return statistics.median(s.seconds for s in self.samples)

    @property
    def peak_mb(self) -> float:
        return max(s.peak_mb for s in self.samples)

    @property
    def jvm(self) -> bool:
        return any(s.jvm for s in self.samples)

    def median(self, key: str) -> float:
        return statistics.median(float(s.data[key]) for s in self.samples)

    def max(self, key: str) -> float:
        return max(float(s.data[key]) for s in self.samples)

    def describe(self) -> str:
        return f"{self.label} peak {self.peak_mb:.0f} MB, JVM {'yes' if self.jvm else 'no'}"


def child_env() -> dict[str, str]:
    """A side's environment: ours, without ``ICEGATE_CONFIG``, with this repo importable."""
    env = dict(os.environ)
    env.pop("ICEGATE_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def icegate(*args: str | Path) -> list[str]:
    """``icegate-maintain ARGS``, the venv's console script."""
    script = Path(sys.executable).parent / "icegate-maintain"
    found = str(script) if script.exists() else shutil.which("icegate-maintain")
    if found is None:
        raise SideFailed("icegate-maintain", reason="not installed (run ./scripts/setup.sh)")
    return [found, *map(str, args)]


def bench_side(name: str, *args: str | Path) -> list[str]:
    """``python -m bench.sides NAME ARGS``."""
    return [sys.executable, "-m", "bench.sides", name, *map(str, args)]


def cold(
    settings: Settings,
    what: str,
    argv: list[str],
    cwd: Path,
    check: Callable[[ProcessRun], dict[str, Any]] | None = None,
    env: dict[str, str] | None = None,
    server: int | None = None,
) -> Sample:
    """Run ``argv`` as a new process (in ``env``, else ours); a non-zero exit or a failed
    ``check`` is a crash. ``server``: a Spark Connect server's pid, its memory counted with
    the process's (``peak_mb`` the peak of both at one instant; its own peak and growth in
    the sample's data as ``server_peak_mb`` and ``server_growth_mb``)."""
    run = run_process(
        argv, cwd=cwd, env=env or child_env(), timeout=settings.timeout, server=server
    )
    if run.exit_code != 0:
        raise SideFailed(what, run)
    try:
        data = check(run) if check is not None else {}
    except SideFailed:
        raise
    except Exception as exc:
        raise SideFailed(what, run, f"{type(exc).__name__}: {exc}") from exc
    if server is not None:
        data |= {"server_peak_mb": run.server_peak_mb, "server_growth_mb": run.server_growth_mb}
    return Sample(run.seconds, run.peak_mb, run.jvm, data)


def alternate(sides: list[Side], reps: int) -> list[Summary]:
    """``reps`` repetitions of every side, each a fresh process on a fresh fixture; the
    order flips every repetition, so no side always goes first."""
    samples: list[list[Sample]] = [[] for _ in sides]
    for rep in range(reps):
        order = list(range(len(sides)))
        if rep % 2:
            order.reverse()
        shown = []
        for index in order:
            sample = sides[index].run()
            samples[index].append(sample)
            shown.append(
                f"{sides[index].label} {sample.seconds:.2f}s {sample.peak_mb:.0f}MB"
                f"{' JVM' if sample.jvm else ''}"
            )
        print(f"    rep {rep + 1}/{reps}: " + " | ".join(shown), flush=True)
    return [Summary(side.label, found) for side, found in zip(sides, samples, strict=True)]


def note(reps: int, *summaries: Summary, extra: str = "") -> str:
    parts = [f"{reps} rep{'s' if reps != 1 else ''}"] + [s.describe() for s in summaries]
    return "; ".join(parts + ([extra] if extra else []))


def side_json(run: ProcessRun) -> dict[str, Any]:
    """The JSON object on a side's last stdout line."""
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("the side printed nothing")
    return dict(json.loads(lines[-1]))


def cli_json(run: ProcessRun) -> dict[str, Any]:
    """``icegate-maintain --json``'s output (anything before the object skipped)."""
    match = re.search(r"^\{", run.stdout, re.MULTILINE)
    if match is None:
        raise ValueError(f"no JSON in the output: {run.stdout[-500:]!r}")
    return dict(json.loads(run.stdout[match.start() :]))


def all_ok(doc: dict[str, Any], tables: int) -> list[dict[str, Any]]:
    """The tables of a ``--json`` result, checked: as many as expected, every one ok."""
    found = list(doc.get("tables", []))
    if len(found) != tables:
        raise ValueError(f"{len(found)} tables in the output, {tables} expected")
    bad = [t for t in found if not t.get("ok")]
    if bad:
        first = bad[0]
        errors = [op.get("error") for op in first.get("ops", []) if op.get("error")]
        raise ValueError(
            f"{len(bad)} table(s) not ok, first {first.get('table')}: "
            f"{first.get('error') or errors}"
        )
    return found


def ops_named(tables: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [op for t in tables for op in t.get("ops", []) if op.get("operation") == name]


def all_optimized(size: int) -> Callable[[ProcessRun], dict[str, Any]]:
    """A check of a ``run --json``: ``size`` tables, all ok, each one compacted."""

    def check(run: ProcessRun) -> dict[str, Any]:
        found = all_ok(cli_json(run), size)
        done = [op for op in ops_named(found, "optimize") if op["status"] == "completed"]
        if len(done) != size:
            raise ValueError(f"optimize completed on {len(done)} of {size} tables")
        return {}

    return check


def built(what: str, action: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    value = action()
    print(f"    {what} built in {time.perf_counter() - started:.1f}s (untimed)", flush=True)
    return value


def growth(small: tuple[int, Summary], big: tuple[int, Summary]) -> str:
    (n, a), (m, b) = small, big
    return (
        f"{n}->{m} tables: time x{b.seconds / a.seconds:.2f}, peak MB x{b.peak_mb / a.peak_mb:.2f}"
    )
