"""Which tables the health trigger looks at when its look budget cannot cover them all (issue
37, finding 8): every table out of date gets its look within ``ceil(N / k)`` ticks (``N``
tables, ``k`` looks a tick), whatever keeps changing around it. On a real SQLite catalog and
WAL folder with the test's clock (pyiceberg only, no JVM), then the same order over a
REST-like listing of 1,000 tables, as :func:`look_at_lakehouse` takes it, without a catalog."""

from __future__ import annotations

import math
import time
from pathlib import Path

from icegate_dagster.maintenance import Maintainer
from icegate_dagster.maintenance.trigger.look import (
    ERROR_RETRY_S,
    Listing,
    LookCache,
    _out_of_date,
    look_at_lakehouse,
    look_order,
)
from icegate_dagster.maintenance.trigger.store import StoredLook
from tests.lakehouse import Lakehouse, LakehouseFactory, batch

TICK = 30.0
BUSY = tuple(f"lakehouse.busy{i}" for i in range(4))
AGING, FLAKY = "lakehouse.aging", "lakehouse.flaky"


def _lakehouse(factory: LakehouseFactory) -> Lakehouse:
    lh = factory(maintain={"expire_snapshots": {"retention_threshold": "1h"}}, wal=True)
    for key in (*BUSY, AGING, FLAKY):
        lh.add_table(key, appends=2, services=("api",))
    return lh


def test_a_due_re_check_and_an_errored_table_are_looked_at_while_others_change_every_tick(
    lakehouse_factory: LakehouseFactory,
) -> None:
    """Four tables get WAL at every tick and a tick has time for one look: AGING's snapshots
    cross their retention (a re-check falls due), FLAKY's last look failed (its metadata was
    unreadable, then repaired). Both are looked at within ``ceil(6 / 1)`` ticks of falling
    due, and so is every change of the busy tables."""
    lh = _lakehouse(lakehouse_factory)
    maintainer, cache = Maintainer(lh.config), LookCache()
    rows = batch(0, ("api",), rows_per_service=1)
    metadata = Path(lh.table(FLAKY).metadata_location.removeprefix("file://"))
    good = metadata.read_bytes()
    metadata.write_bytes(b"{ not json")
    # The test's clock: 50 minutes on, AGING's first snapshot is 10 minutes from its
    # retention, so its re-check falls due during the run.
    now = time.time() + 50 * 60

    def tick(until: float) -> list[str]:
        return look_at_lakehouse(maintainer, None, now, until=until, cache=cache).fresh

    # The first tick has time for every table: FLAKY's look fails.
    assert sorted(tick(time.monotonic() + 600)) == sorted((*BUSY, AGING, FLAKY))
    looks = cache.get(f"-|{lh.config.catalog.name}", None)
    assert looks[FLAKY].error is not None and looks[AGING].recheck_at is not None
    metadata.write_bytes(good)  # repaired: the next look succeeds
    due_at = {FLAKY: looks[FLAKY].looked_at + ERROR_RETRY_S, AGING: looks[AGING].recheck_at}
    assert all(at <= now + 40 * TICK for at in due_at.values())

    bound = math.ceil((len(BUSY) + 2) / 1) * TICK  # N = 6 tables, k = 1 look a tick
    changed_at: dict[str, float] = {}
    waits: dict[str, list[float]] = {key: [] for key in (*BUSY, AGING, FLAKY)}
    for step in range(60):
        now += TICK
        for key in BUSY:
            lh.write_wal(key, rows, f"w{step:03d}.parquet")
            changed_at.setdefault(key, now)
        # A tick whose budget is spent at once takes exactly one look (the first always).
        [looked] = tick(time.monotonic() - 1)
        since = changed_at.pop(looked, None) if looked in BUSY else due_at.pop(looked, None)
        if since is not None:
            waits[looked].append(now - since)

    assert waits[AGING] and waits[FLAKY], (waits[AGING], waits[FLAKY], due_at)
    assert looks[FLAKY].error is None and looks[FLAKY].health is not None
    assert max(w for ws in waits.values() for w in ws) <= bound, waits
    assert all(len(waits[key]) >= 5 for key in BUSY)  # a changed table is looked at again
    # With time for every table, a change is looked at in the very tick it is seen.
    now += TICK
    lh.write_wal(BUSY[0], rows, "last.parquet")
    assert BUSY[0] in tick(time.monotonic() + 600)


def _look(table: str, at: float, wal: str, error: str | None = None) -> StoredLook:
    """A look as a REST-like listing keeps it (no metadata file compared)."""
    return StoredLook(table, None, wal, at, None, None, error=error)


def test_on_a_rest_listing_of_1000_tables_no_look_waits_longer_than_the_stated_bound() -> None:
    """A REST-like listing (the catalog cannot say what changed): 100 tables get WAL at every
    tick, every table falls due for a re-check each ``recheck`` (10 min), one saw an HTTP 503
    at its last look. With 50 looks a tick, each table out of date is looked at within
    ``ceil(1000 / 50)`` ticks, the retried one included; the busy tables' changes too."""
    tables = [f"lakehouse.t{i:04d}" for i in range(1000)]
    busy, failing = set(tables[::10]), "lakehouse.t0505"
    listing = Listing(dict.fromkeys(tables), cheap=False)
    recheck_s, k = 600.0, 50
    now = 1_800_000_000.0
    looks = {t: _look(t, now - 1_000 + i, "0") for i, t in enumerate(tables)}
    looks[failing] = _look(failing, now - 900, "0", error="HTTP 503 Service Unavailable")
    wal = dict.fromkeys(tables, "0")
    out_since: dict[str, float] = {}
    waits: list[float] = []
    failing_looked = 0
    resume_at: str | None = None
    for step in range(200):  # 100 minutes of 30 s ticks
        now += TICK
        for table in busy:
            wal[table] = str(step)
        stale = [
            t for t in tables if _out_of_date(looks[t], None, wal[t], now, listing, recheck_s, None)
        ]
        for table in stale:
            out_since.setdefault(table, now)
        order = look_order(stale, looks, resume_at)
        resume_at = order[k] if len(order) > k else None
        for table in order[:k]:
            waits.append(now - out_since.pop(table))
            failing_looked += table == failing
            looks[table] = _look(table, now, wal[table])
    bound = math.ceil(len(tables) / k) * TICK
    assert failing_looked >= 5  # retried, then looked at with every recheck
    assert max(waits) <= bound
    # Still out of date at the end: none since longer than the bound.
    assert all(now - since < bound for since in out_since.values())
