"""The health trigger's look at the lakehouse: which tables exist, and each one's health,
re-read only where it may have changed (pyiceberg, no JVM).

A tick costs next to nothing for a table that did not change:

1. **The listing.** On a SQL catalog every table's current metadata file comes from one
   query (``iceberg_tables``); elsewhere (REST, Glue, Hive) from listing each namespace,
   without the metadata files.
2. **The WAL**, when ``wal.root`` is set: one recursive listing of the root for every table
   (:func:`~icegate_dagster.maintenance.wal.wal_backlogs`).
3. **The looks.** Each table's last look (its metadata file, WAL, health summary, and when
   time alone may change it) is kept in the trigger's memory and in this process. A table
   is looked at again, loaded and assessed, only when it was never looked at, its metadata
   file or WAL changed, a snapshot crossed the expiry's retention since (see
   :func:`~icegate_dagster.maintenance.health.score.next_look_at`), it could not be read a
   minute ago, its settings in the configuration changed, or, where the catalog cannot say
   what changed, its look is older than ``maintain.trigger.recheck``. They are looked at
   **by the age of their last look**, oldest first (tables never looked at before all,
   equals in name order from where the last tick stopped: :func:`look_order`), until the
   tick's look budget is spent; what is left waits for the next tick, and the lakehouse's
   totals use its last look meanwhile. A table looked at goes behind every table still
   waiting, so no kind of change can starve another: a table out of date is looked at
   within ``ceil(N / k)`` ticks, ``N`` the tables listed and ``k`` the looks a tick has
   time for (at least one), tables created meanwhile going first.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from icegate_dagster.config.secrets import scrub
from icegate_dagster.errors import IcegateError, describe_error
from icegate_dagster.maintenance.discovery import (
    LOCATIONS,
    all_overlaps,
    sql_metadata_locations,
)
from icegate_dagster.maintenance.health.after_pass import TableSource
from icegate_dagster.maintenance.health.score import assess_table, next_look_at, thresholds_for
from icegate_dagster.maintenance.health.summary import SUMMARY_FORMAT, HealthSummary
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.ops.base import gc_disabled
from icegate_dagster.maintenance.sharing import Sharing, sharing_of
from icegate_dagster.maintenance.trigger.selection import rotation
from icegate_dagster.maintenance.trigger.store import StoredLook, TriggerMemory
from icegate_dagster.maintenance.wal import WalStats, configured_wal_root, wal_backlogs

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

#: A table that could not be read is tried again after this long.
ERROR_RETRY_S = 60.0
#: A table whose health changes with time is looked at no more often than this.
MIN_RECHECK_S = 60.0


class LakehouseReader(TableSource, Protocol):
    """What the look reads the lakehouse through (a
    :class:`~icegate_dagster.maintenance.Maintainer` does): the catalog, the tables to
    maintain, each table and its settings."""

    @property
    def catalog(self) -> Catalog:
        """The pyiceberg catalog."""
        ...

    def discover(self) -> list[TableRef]:
        """Every table to maintain, listed namespace by namespace."""
        ...

    def own_tables(self) -> tuple[str, ...]:
        """The project's own tables (the log and the orphan candidates)."""
        ...


@dataclass(frozen=True)
class Listing:
    """The catalog's tables to maintain, each with its current metadata file when the
    catalog tells it in the listing (``cheap``), else None."""

    tables: dict[str, str | None]
    cheap: bool


def list_tables(maintainer: LakehouseReader) -> Listing:
    """Every table to maintain (the configured namespaces, ``_`` tables and the project's
    own left out), as discovery lists them; with its metadata file on a SQL catalog, from
    one query. A catalog that cannot be listed raises
    :class:`~icegate_dagster.errors.CatalogUnavailableError`."""
    locations = sql_metadata_locations(maintainer.catalog)
    if locations is None:
        return Listing({ref.key: None for ref in maintainer.discover()}, cheap=False)
    wanted = maintainer.config.namespaces
    own = set(maintainer.own_tables())
    tables: dict[str, str | None] = {}
    for (namespace, name), location in locations.items():
        if wanted is not None and namespace not in wanted:
            continue
        if "." in namespace:  # nested namespaces are not maintained (as discovery)
            continue
        try:
            ref = TableRef.parse(f"{namespace}.{name}")
        except IcegateError:  # a name discovery skips too (control characters)
            continue
        if not ref.is_internal and ref.key not in own:
            tables[ref.key] = location
    return Listing(dict(sorted(tables.items())), cheap=True)


def wal_text(wal: WalStats | None) -> str | None:
    """A WAL as a look records it: files, bytes and the oldest file."""
    return None if wal is None else f"{wal.files}/{wal.bytes}/{wal.oldest or ''}"


@dataclass
class LakehouseLook:
    """One tick's picture of the lakehouse."""

    #: Every table to maintain, in name order.
    tables: list[str]
    #: The latest look at each of them (this tick's or an earlier one's).
    looks: dict[str, StoredLook]
    #: Tables looked at in this tick.
    fresh: list[str] = field(default_factory=list)
    #: Each table's WAL (empty when ``wal.root`` is not set).
    wal: dict[str, WalStats] = field(default_factory=dict)
    #: Tables out of date that this tick had no time for, and where the next one resumes.
    waiting: int = 0
    resume_at: str | None = None
    #: The instant of this look (epoch seconds).
    now: float = 0.0

    @property
    def healths(self) -> dict[str, HealthSummary]:
        """Each assessed table's health."""
        return {t: look.health for t, look in self.looks.items() if look.health is not None}

    @property
    def errors(self) -> dict[str, str]:
        """Each table whose last look failed, with the error."""
        return {t: look.error for t, look in self.looks.items() if look.error is not None}


class LookCache:
    """The looks this process holds, loaded from the trigger's memory on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._looks: dict[str, dict[str, StoredLook]] = {}

    def get(self, key: str, memory: TriggerMemory | None) -> dict[str, StoredLook]:
        """The looks of one deployment (``key``: its store and catalog)."""
        with self._lock:
            looks = self._looks.get(key)
            if looks is None:
                looks = memory.stored_looks() if memory is not None else {}
                self._looks[key] = looks
            return looks


#: This process's looks (the sensor's code server keeps them between ticks).
LOOKS = LookCache()


class SettingsDigests:
    """Each table's settings digest (see :attr:`StoredLook.settings`), computed once per
    settings block: tables without their own block share the defaults'."""

    def __init__(self, maintainer: LakehouseReader) -> None:
        self._maintainer = maintainer
        # By the block's identity; the block is kept, so that no other takes its id.
        self._by_block: dict[int, tuple[object, str]] = {}

    def __call__(self, key: str) -> str | None:
        try:
            settings = self._maintainer.settings(TableRef.parse(key))
        except IcegateError:
            return None
        known = self._by_block.get(id(settings))
        if known is not None:
            return known[1]
        text = f"{SUMMARY_FORMAT}:{settings.model_dump_json()}"
        digest = hashlib.sha256(text.encode()).hexdigest()[:32]
        self._by_block[id(settings)] = (settings, digest)
        return digest


def _out_of_date(
    look: StoredLook | None,
    location: str | None,
    wal: str | None,
    now: float,
    listing: Listing,
    recheck_s: float,
    settings: str | None,
) -> bool:
    """Whether a table needs a new look (see the module docstring)."""
    if look is None:
        return True
    if listing.cheap and look.metadata_location != location:
        return True
    if look.settings != settings:
        return True
    if look.error is not None:
        return now - look.looked_at >= ERROR_RETRY_S
    if wal != look.wal:
        return True
    if look.recheck_at is not None and look.recheck_at <= now:
        return True
    return not listing.cheap and now - look.looked_at >= recheck_s


def look_order(
    out_of_date: Collection[str], looks: Mapping[str, StoredLook], resume_at: str | None
) -> list[str]:
    """The order a tick looks at the tables ``out_of_date`` in: by the age of their last
    look (``looks``), oldest first, tables never looked at before all; equals in name order
    from ``resume_at`` (where the last tick stopped). Not changed tables first: where they
    alone could fill every tick's budget, a table due for a re-check or a retry after an
    error would never get its turn. A table looked at goes behind every one still waiting,
    so each waits ``ceil(N / k)`` ticks at most (``N`` tables, ``k`` looks a tick). Pure."""

    def last_look(key: str) -> float:
        look = looks.get(key)
        return float("-inf") if look is None else look.looked_at

    return sorted(rotation(out_of_date, resume_at), key=last_look)  # stable: equals rotate


def due_since(previous: StoredLook | None, look: StoredLook) -> float | None:
    """Since when ``look``'s table has been due without a break: its previous look's time
    if that found it due too, else this look's (None when nothing is due now)."""
    if look.health is None or not look.health.due:
        return previous.due_since if look.health is None and previous is not None else None
    if previous is not None and previous.due_since is not None:
        return previous.due_since
    return look.looked_at


class TableCache:
    """The tables this process loaded lately, by metadata file: a table whose WAL changed,
    or whose snapshots aged, is assessed again without reading its metadata again (a
    metadata file never changes; a bounded number of the busiest tables is kept)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._tables: OrderedDict[tuple[str, str], Table] = OrderedDict()

    def get(self, key: str, location: str | None) -> Table | None:
        """The table loaded from ``location``, if kept."""
        if location is None:
            return None
        with self._lock:
            table = self._tables.get((key, location))
            if table is not None:
                self._tables.move_to_end((key, location))
            return table

    def put(self, key: str, table: Table) -> None:
        """Keep ``table`` (the least recently used one goes when full)."""
        with self._lock:
            self._tables[(key, table.metadata_location)] = table
            self._tables.move_to_end((key, table.metadata_location))
            while len(self._tables) > self.size:
                self._tables.popitem(last=False)


#: This process's recently loaded tables.
TABLES = TableCache()


def look_at(
    maintainer: LakehouseReader,
    key: str,
    wal: WalStats | None,
    now: float,
    *,
    location: str | None = None,
    tables: TableCache | None = None,
    digest: str | None = None,
) -> StoredLook:
    """Load and assess one table now (pyiceberg, no JVM); a table that cannot be read
    gives a look with its error. With ``location`` (its current metadata file, as a SQL
    catalog lists it) a table kept in ``tables`` is not read again; ``digest`` is its
    settings' (:class:`SettingsDigests`), kept with the look."""
    config = maintainer.config
    try:
        ref = TableRef.parse(key)
        table = tables.get(key, location) if tables is not None else None
        if table is None:
            table = maintainer.load(ref)
            if tables is not None:
                tables.put(key, table)
        settings = maintainer.settings(ref)
        moment = datetime.fromtimestamp(now, UTC)
        health = assess_table(table, key, settings, moment, wal)
        thresholds = thresholds_for(settings, table.properties)
        summary = HealthSummary.of(
            health, thresholds.min_score, thresholds.min_interval.total_seconds()
        )
        later = next_look_at(table, settings, moment)
    except Exception as exc:  # a table that cannot be read is reported; the others go on
        error = describe_error(exc, lambda text: scrub(text, config))
        return StoredLook(key, None, wal_text(wal), now, None, None, error, settings=digest)
    recheck = max(later.timestamp(), now + MIN_RECHECK_S) if later is not None else None
    location = table.location()
    LOCATIONS.put(table.metadata_location, location)
    return StoredLook(
        key,
        table.metadata_location,
        wal_text(wal),
        now,
        recheck,
        summary,
        location=location,
        gc_disabled=gc_disabled(table) is not None,
        settings=digest,
    )


def look_at_lakehouse(
    maintainer: LakehouseReader,
    memory: TriggerMemory | None,
    now: float,
    *,
    until: float | None,
    resume_at: str | None = None,
    listing: Listing | None = None,
    wal: Mapping[str, WalStats] | None = None,
    cache: LookCache = LOOKS,
) -> LakehouseLook:
    """The lakehouse's tables and their latest looks, re-reading only the tables out of date
    (see the module docstring) until ``until`` (``time.monotonic()``; None: all of them).
    New looks are stored in the trigger's memory."""
    config = maintainer.config
    listing = listing if listing is not None else list_tables(maintainer)
    tables = list(listing.tables)
    wal_root = configured_wal_root(config)
    if wal is None and wal_root is not None:
        wal, _ = wal_backlogs(wal_root, [TableRef.parse(t) for t in tables])
    wal = wal or {}
    # One deployment: its store and catalog (an engine is made anew with each catalog).
    store_key = f"{memory.engine.url if memory is not None else '-'}|{config.catalog.name}"
    looks = cache.get(store_key, memory) if until is not None else {}
    for gone in set(looks) - set(tables):
        del looks[gone]
    digest = SettingsDigests(maintainer)
    digests = {key: digest(key) for key in tables}
    recheck_s = config.trigger.recheck.total_seconds()
    out_of_date = [
        key
        for key in tables
        if _out_of_date(
            looks.get(key),
            listing.tables[key],
            wal_text(wal.get(key)),
            now,
            listing,
            recheck_s,
            digests[key],
        )
    ]
    order = look_order(out_of_date, looks, resume_at)
    fresh: list[StoredLook] = []
    next_start = None
    for index, key in enumerate(order):
        if until is not None and fresh and time.monotonic() > until:
            next_start = key
            waiting = len(order) - index
            break
        look = look_at(
            maintainer,
            key,
            wal.get(key),
            now,
            location=listing.tables[key] if listing.cheap else None,
            tables=TABLES,
            digest=digests[key],
        )
        look = replace(look, due_since=due_since(looks.get(key), look))
        looks[key] = look
        fresh.append(look)
    else:
        waiting = 0
    if memory is not None and fresh:
        memory.save_looks(fresh)
    return LakehouseLook(
        tables=tables,
        looks={t: looks[t] for t in tables if t in looks},
        fresh=[look.table for look in fresh],
        wal=dict(wal),
        waiting=waiting,
        resume_at=next_start,
        now=now,
    )


def unsafe_sharing(look: LakehouseLook) -> dict[str, Sharing]:
    """The tables that share their location with another without ``gc.enabled=false``
    (``maintenance.sharing``), from every table's last look: a sweep over the locations, no
    table loaded."""
    located = {t: seen.location for t, seen in look.looks.items() if seen.location}
    found = {}
    for table, others in all_overlaps(located).items():
        properties = {"gc.enabled": "false"} if look.looks[table].gc_disabled else {}
        sharing = sharing_of(table, located[table], properties, {t: located[t] for t in others})
        if sharing.unsafe:
            found[table] = sharing
    return found
