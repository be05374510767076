"""Measuring one cold process: wall clock, peak memory of its tree, whether a JVM ran.

The parent spawns the process and times it from spawn to exit. A sampler thread walks
the process tree (the Python process, ``spark-submit``'s shell and its ``java``) in
``/proc`` five times a second, summing the resident memory of every process in it and
noting any ``java`` among them. After the process exits, the JVMs seen in its tree are
given time to go away (untimed), so that the next process never shares the machine with
a lingering JVM.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: A line naming an exception: ``pkg.SomeError: message``.
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b:? ")
#: How often the tree is sampled, in seconds.
SAMPLE_S = 0.2
#: How long a JVM left behind by a finished process may take to exit (untimed).
SETTLE_S = 30.0


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc)."""
    children = _children()
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def rss_kb(pid: int) -> int:
    """Resident memory of one process, 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def is_java(pid: int) -> bool:
    """Whether ``pid`` is a JVM (its command is ``java``)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "java"
    except OSError:
        return False


class PeakMemory:
    """Peak resident memory of a process tree (Python driver + its JVM), sampled 5x a
    second; also records the JVMs that appeared in the tree.

    ``server``: a long-lived process the tree works through (a Spark Connect server's
    JVM). Its tree is sampled at the same instants and counted in ``peak_kb`` (the peak
    of the sum, ours plus the server's, at one instant); its own peak and its RSS at the
    first sample are kept apart (``server_peak_kb``, ``server_start_kb``), and its JVM is
    not ours (``jvm_pids`` is the client tree's only)."""

    def __init__(self, pid: int | None = None, server: int | None = None) -> None:
        self.pid = pid or os.getpid()
        self.server = server
        self.peak_kb = 0
        self.server_peak_kb = 0
        self.server_start_kb: int | None = None
        self.jvm_pids: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        """One look at the tree (and the server's)."""
        pids = tree(self.pid)
        server_kb = sum(rss_kb(p) for p in tree(self.server)) if self.server else 0
        if self.server_start_kb is None:
            self.server_start_kb = server_kb
        self.server_peak_kb = max(self.server_peak_kb, server_kb)
        self.peak_kb = max(self.peak_kb, sum(rss_kb(p) for p in pids) + server_kb)
        self.jvm_pids.update(p for p in pids if p != self.pid and is_java(p))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mb(self) -> float:
        return self.peak_kb / 1024

    @property
    def jvm(self) -> bool:
        return bool(self.jvm_pids)


@dataclass
class ProcessRun:
    """One cold process, as the parent saw it."""

    argv: list[str]
    seconds: float
    peak_mb: float
    jvm: bool
    exit_code: int
    stdout: str
    stderr: str
    #: With a server (see :class:`PeakMemory`): its peak RSS during the run, and its
    #: growth (that peak less its RSS at the run's start), in MB.
    server_peak_mb: float = 0.0
    server_growth_mb: float = 0.0

    def tail(self, lines: int = 15) -> str:
        """The errors it named and the end of its stderr (then stdout), for a failure
        message."""
        text = self.stderr.strip() or self.stdout.strip()
        named = dict.fromkeys(
            line.strip() for line in text.splitlines() if _ERROR_LINE.match(line.strip())
        )
        errors = [f"  error: {line}" for line in list(named)[-3:]]
        return "\n".join(errors + text.splitlines()[-lines:])


class SideFailed(RuntimeError):
    """A measured process did not do its work: the benchmark crashed."""

    def __init__(self, what: str, run: ProcessRun | None = None, reason: str = "") -> None:
        detail = reason or (f"exit {run.exit_code}" if run else "")
        tail = f"\n{run.tail()}" if run is not None and run.tail() else ""
        super().__init__(f"{what}: {detail}{tail}")
        self.run = run


def settle(pids: set[int], timeout: float = SETTLE_S) -> None:
    """Wait until the JVMs a finished process left behind have exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.1)


def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    server: int | None = None,
) -> ProcessRun:
    """Spawn ``argv`` in a new session, time it from spawn to exit, sample its tree.

    stdout and stderr go to files (no pipe for the child to block on). A process that
    runs past ``timeout`` has its process group killed and gets exit code -9.
    ``server``: a process whose memory counts with the tree's (:class:`PeakMemory`).
    """
    cwd.mkdir(parents=True, exist_ok=True)
    out_path, err_path = cwd / ".bench-stdout", cwd / ".bench-stderr"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(  # noqa: S603
            list(argv),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        with PeakMemory(proc.pid, server) as memory:
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
                code = -9
            seconds = time.perf_counter() - started
    settle(memory.jvm_pids)
    run = ProcessRun(
        list(argv),
        seconds,
        memory.mb,
        memory.jvm,
        code,
        out_path.read_text(errors="replace"),
        err_path.read_text(errors="replace"),
        memory.server_peak_kb / 1024,
        (memory.server_peak_kb - (memory.server_start_kb or 0)) / 1024,
    )
    out_path.unlink(missing_ok=True)
    err_path.unlink(missing_ok=True)
    return run
