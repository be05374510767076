"""One listing of ``wal.root`` at a time, in a thread of its own, waited for up to a
deadline (issue 37).

A recursive listing is one blocking call: on object storage with many objects, or a store
that hangs, it can outlast a sensor tick, which Dagster then cancels, keeping nothing;
every tick would start the same listing again and no WAL would ever be requested. Here the
caller waits only until its deadline; a listing still running is left to run, and the
first call after it ends takes its result instead of starting another. So at most one
listing of a root runs at a time, and a slow one still serves a tick.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from icegate_dagster.errors import OperationError
from icegate_dagster.maintenance.wal.files import RootFolders, WalRoot, list_root_folders


@dataclass(frozen=True)
class RootListing:
    """A finished listing of ``wal.root``."""

    folders: RootFolders
    #: When it started (epoch seconds) and how long it took.
    started_at: float
    took_s: float


@dataclass(frozen=True)
class ListingUnderWay:
    """A listing of ``wal.root`` that had not ended by the caller's deadline."""

    started_at: float
    running_s: float

    def describe(self) -> str:
        """What a tick says about it."""
        started = datetime.fromtimestamp(self.started_at, UTC).isoformat(timespec="seconds")
        return (
            f"the listing of wal.root started at {started} is still running after "
            f"{self.running_s:.0f} s; its result serves the first tick after it ends (no "
            "second listing is started meanwhile)"
        )


@dataclass
class _Job:
    wal_root: WalRoot
    started_at: float = field(default_factory=time.time)
    started: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    #: The listing, or what it raised (handed to the caller that collects the job).
    outcome: RootListing | Exception | None = None

    def run(self) -> None:
        try:
            folders = list_root_folders(self.wal_root)
            self.outcome = RootListing(folders, self.started_at, time.monotonic() - self.started)
        except Exception as exc:
            self.outcome = exc
        finally:
            self.done.set()


class RootListings:
    """The listings of ``wal.root`` under way in this process, one per root."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[WalRoot, _Job] = {}

    def wait(self, wal_root: WalRoot, until: float) -> RootListing | ListingUnderWay:
        """The listing of ``wal_root`` (the one under way, else a new one), waited for until
        ``until`` (``time.monotonic()``). Raises what the listing raised."""
        with self._lock:
            job = self._jobs.get(wal_root)
            if job is None:
                job = _Job(wal_root)
                self._jobs[wal_root] = job
                threading.Thread(target=job.run, name="icegate-wal-listing", daemon=True).start()
        if not job.done.wait(max(0.0, until - time.monotonic())):
            return ListingUnderWay(job.started_at, time.monotonic() - job.started)
        with self._lock:
            if self._jobs.get(wal_root) is job:
                del self._jobs[wal_root]
        if isinstance(job.outcome, RootListing):
            return job.outcome
        raise job.outcome or OperationError("the listing of wal.root ended without a result")
