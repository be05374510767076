"""``maintain.history``: how long this project keeps what it writes with time, its bounds
and errors, and the rule that drops resolved orphan candidates (never pending ones)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from icegate_dagster.config import config_from_dict
from icegate_dagster.errors import ConfigError
from icegate_dagster.maintenance.log.upkeep import log_history_rule
from icegate_dagster.maintenance.orphans.candidates import resolved_cutoff, without_old_resolved

CATALOG = {"uri": "sqlite:///catalog.db"}


def _history(tmp_path: Path, **history: object) -> Any:
    raw = {"catalog": CATALOG, "maintain": {"history": history}}
    return config_from_dict(raw, tmp_path).history


def test_defaults_and_forever(tmp_path: Path) -> None:
    defaults = _history(tmp_path)
    assert (defaults.log, defaults.orphan_candidates, defaults.runs) == (
        timedelta(days=90),
        timedelta(days=30),
        timedelta(days=30),
    )
    kept = _history(tmp_path, log="forever", orphan_candidates="forever", runs="400d")
    assert (kept.log, kept.orphan_candidates, kept.runs) == (None, None, timedelta(days=400))
    # The log's TTL rule is in whole days on executed_at; forever is no rule.
    rule = log_history_rule(timedelta(days=30, hours=12))
    assert rule is not None and (rule.days, rule.column) == (30, "executed_at")
    assert log_history_rule(None) is None


@pytest.mark.parametrize("value", ["12h", 0, -1, "abc", "", True])
def test_a_history_under_a_day_or_not_a_duration_is_refused_naming_key_and_value(
    tmp_path: Path, value: object
) -> None:
    with pytest.raises(ConfigError) as info:
        _history(tmp_path, runs=value)
    assert str(info.value) == (
        f"invalid config: maintain.history.runs = {value!r}: must be a duration of at least "
        "1d (such as 30d) or `forever` to keep everything"
    )
    with pytest.raises(ConfigError, match=r"maintain\.history\.rows = '1d': unknown key"):
        _history(tmp_path, rows="1d")


def _candidate(path: str, status: str, resolved_days: int | None) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "path": path,
        "status": status,
        "collected_at": now - timedelta(days=3650),
        "resolved_at": None if resolved_days is None else now - timedelta(days=resolved_days),
    }


def test_pending_candidates_of_any_age_survive_the_history_rule() -> None:
    rows = [
        _candidate("file:/a", "pending", None),
        _candidate("file:/b", "deleted", 31),
        _candidate("file:/c", "changed", 29),
        _candidate("file:/d", "gone", None),  # resolved before resolved_at was recorded
        _candidate("file:/e", "referenced", 400),
    ]
    cutoff = resolved_cutoff(timedelta(days=30), datetime.now(UTC))

    kept = without_old_resolved(rows, cutoff)

    assert [r["path"] for r in kept] == ["file:/a", "file:/c", "file:/d"]
    assert without_old_resolved(rows, resolved_cutoff(None, datetime.now(UTC))) == rows
