"""Which process a heartbeat comes from, and whether that process still runs.

A heartbeat that stops may mean a dead worker, or only a lease store the worker could not
reach for a while. Before a run is failed for silence, the healer asks the one witness
that cannot be wrong: on the same host (same kernel boot, same PID namespace), is the
process with that PID, started at that moment, still there? Elsewhere it cannot ask, and
waits for several leases of silence instead (``icegate_dagster.sensors.healing``).

The identity is ``host|boot id|pid namespace|pid|start time``: the boot id tells a
restarted host apart, the PID namespace two containers that share a hostname, and the
start time (in clock ticks since boot, from ``/proc/<pid>/stat``) a reused PID. A zombie
(state ``Z``: exited, not yet reaped by its parent) or a dying process (``X``) keeps its
PID and start time in ``/proc`` but runs nothing: it is gone.
"""

from __future__ import annotations

import os
import socket

SEPARATOR = "|"
#: Process states (``/proc/<pid>/stat`` field 3) of a process that has ended: a zombie
#: waiting for its parent to reap it, and one being torn down.
ENDED_STATES = frozenset({"Z", "X"})


def _read(path: str) -> str:
    try:
        with open(path) as file:
            return file.read().strip()
    except OSError:
        return ""


def _namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, str] | None:
    """The process's state letter and start time (clock ticks since boot); None when no
    process has that PID."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat.rsplit(")", 1)[-1].split()
    state = fields[0] if fields else ""
    return state, fields[19] if len(fields) > 19 else ""


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot; None when it does not exist."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def _host() -> tuple[str, str, str]:
    return socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"), _namespace()


def process_identity(pid: int | None = None) -> str:
    """This process (or ``pid`` on this host), as a heartbeat records it."""
    pid = os.getpid() if pid is None else pid
    host, boot, namespace = _host()
    start = _start_ticks(pid) or ""
    return SEPARATOR.join((host, boot, namespace, str(pid), start))


def describe_process(identity: str | None) -> str:
    """``host pid N`` for messages."""
    if not identity:
        return "an unknown process"
    parts = identity.split(SEPARATOR)
    return f"process {parts[3]} on {parts[0]}" if len(parts) == 5 else identity


def process_gone(identity: str | None) -> bool | None:
    """Whether the process ``identity`` names has ended: True when it ran on this very host
    (host, boot and PID namespace alike) and no process with its PID and start time exists
    any more, or only as a zombie; False when it still runs; None when this host cannot
    tell (another host or container, a rebooted host, no ``/proc``, an identity from an
    older heartbeat)."""
    if not identity:
        return None
    parts = identity.split(SEPARATOR)
    if len(parts) != 5:
        return None
    host, boot, namespace, pid_text, start = parts
    if not (boot and namespace and start and pid_text.isdigit()):
        return None
    if (host, boot, namespace) != _host():
        return None
    now = _stat(int(pid_text))
    if now is None:
        return True
    state, started = now
    return started != start or state in ENDED_STATES
