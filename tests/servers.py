"""Servers the tests start on loopback: free ports, waiting until ready, a stoppable process.

What is the same for every server lives here; what each one needs (its command line, its
ready check, its clean-up) stays in its own module: ``tests/webserver.py`` and
``tests/surfaces/{postgres_server,seaweedfs_server,spark_cluster}.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

T = TypeVar("T")

#: What a probe may raise while its server is still coming up (refused connection, a
#: half-written answer): it counts as "not yet".
NOT_YET: tuple[type[Exception], ...] = (OSError, ValueError)


def _bind(port: int = 0) -> socket.socket | None:
    """A socket bound to ``port`` (0: any free one) on 127.0.0.1, or None if it is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    return sock


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that nothing listens on right now."""
    held = [_bind() for _ in range(count)]
    try:
        if any(sock is None for sock in held):
            raise RuntimeError("no free loopback ports")
        return [int(sock.getsockname()[1]) for sock in held if sock is not None]
    finally:
        for sock in held:
            if sock is not None:
                sock.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_ports(1)[0]


def port_is_free(port: int) -> bool:
    """Whether ``port`` on 127.0.0.1 can be bound right now."""
    sock = _bind(port)
    if sock is None:
        return False
    sock.close()
    return True


def child_processes() -> dict[int, list[int]]:
    """Every process's children, by parent pid (read from /proc)."""
    found: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            found.setdefault(ppid, []).append(int(entry.name))
    return found


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    children = child_processes()
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def http_answers(url: str) -> bool:
    """Whether an HTTP server answers at ``url`` (any status counts)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def log_text(path: Path, secrets: Sequence[str] = ()) -> str:
    """A log file's text ("" if there is none), ``secrets`` masked."""
    text = path.read_text(errors="replace") if path.exists() else ""
    for value in secrets:
        text = text.replace(value, "***")
    return text


def log_tail(path: Path, lines: int = 40, secrets: Sequence[str] = ()) -> str:
    """The last ``lines`` lines of a log file ("" if there is none), ``secrets`` masked."""
    return "\n".join(log_text(path, secrets).splitlines()[-lines:])


class NotReady(RuntimeError):
    """What was waited for did not happen; ``reason`` says why (``"timeout"`` or the
    reason the wait was given up for)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def wait_until(
    probe: Callable[[], T | None],
    timeout: float,
    what: str,
    *,
    interval: float = 0.5,
    ignore: tuple[type[Exception], ...] = NOT_YET,
    abort: Callable[[], str | None] | None = None,
    details: Callable[[], str] | None = None,
) -> T:
    """Call ``probe`` every ``interval`` seconds until it returns something truthy; that.

    An exception of a type in ``ignore`` means "not yet" (only its type is reported, never
    its text: it may hold a secret). ``abort`` returns why waiting is pointless (say, the
    server exited) or None. On timeout or abort raises :class:`NotReady`, naming ``what``
    and followed by ``details()`` (a log tail).
    """
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            result = probe()
            if result:
                return result
        except ignore as exc:
            last = type(exc).__name__
        reason = abort() if abort else None
        if reason is not None:
            message = f"gave up waiting for {what}: {reason}"
        elif time.monotonic() > deadline:
            reason = "timeout"
            message = f"waited {timeout:g}s for {what}" + (f" (last: {last})" if last else "")
        else:
            time.sleep(interval)
            continue
        extra = details() if details else ""
        raise NotReady(f"{message}\n{extra}" if extra else message, reason)


class ServerProcess:
    """One server as a child process: output to ``log_path``, a ready check, a clean stop.

    ``with ServerProcess(...) as server:`` starts it and always stops it: SIGTERM, then
    SIGKILL if it is still there after ``stop_timeout`` seconds. With ``own_group`` it runs
    in a session of its own and the signals go to the whole group (so children it started,
    such as a Spark worker's executors, stop with it). ``secrets`` are masked in log text.
    """

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        log_path: Path,
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        own_group: bool = False,
        stop_timeout: float = 30.0,
        secrets: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.args = list(args)
        self.log_path = log_path
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self.own_group = own_group
        self.stop_timeout = stop_timeout
        self.secrets = tuple(secrets)
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(  # noqa: S603
                self.args,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=self.own_group,
            )
        return self

    @property
    def process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError(f"{self.name} was not started")
        return self._process

    def exit_reason(self) -> str | None:
        """``exited with code N`` once the process has ended, else None."""
        code = self.process.poll()
        return None if code is None else f"exited with code {code}"

    def log_text(self) -> str:
        """Everything the server wrote so far, secrets masked."""
        return log_text(self.log_path, self.secrets)

    def log_tail(self, lines: int = 40) -> str:
        return f"last lines of {self.log_path}:\n" + log_tail(self.log_path, lines, self.secrets)

    def wait_ready(
        self,
        probe: Callable[[], T | None],
        timeout: float,
        *,
        what: str | None = None,
        interval: float = 0.5,
        ignore: tuple[type[Exception], ...] = NOT_YET,
        abort: Callable[[], str | None] | None = None,
    ) -> T:
        """:func:`wait_until` ``probe`` answers; given up at once if the process exits (or
        ``abort`` says so), with the log's tail in the error."""

        def why_not() -> str | None:  # the server's own reason first, then its exit
            return (abort() if abort else None) or self.exit_reason()

        return wait_until(
            probe,
            timeout,
            what or self.name,
            interval=interval,
            ignore=ignore,
            abort=why_not,
            details=self.log_tail,
        )

    def stop(self) -> None:
        """SIGTERM, SIGKILL after ``stop_timeout`` s; nothing if it has already ended."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, self.stop_timeout), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                if self.own_group:
                    os.killpg(process.pid, sig)
                else:
                    process.send_signal(sig)
            try:
                process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
