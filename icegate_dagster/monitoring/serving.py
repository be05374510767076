"""The exporter's HTTP listener: no client can hold it open, and optional basic auth.

``http.server.ThreadingHTTPServer`` starts a thread per connection and waits for its
request without a limit: 300 connections that send half a request hold 300 threads for
as long as they like. :class:`BoundedHTTPServer` instead

- reads every connection's request head in one thread (``selectors``), each within
  :data:`HEAD_TIMEOUT_S` of its connection; one that has not sent it by then, or sends
  more than :data:`MAX_HEAD_BYTES`, is closed;
- answers complete requests in a pool of :data:`HANDLER_THREADS` threads (the excess
  waits its turn), each answer written within :data:`WRITE_TIMEOUT_S` (a scrape's own
  limit in the documented Prometheus job);
- keeps at most :data:`MAX_CONNECTIONS` connections open: past that, the oldest one
  still sending its head is closed for the new one; with none such, the new one is
  answered 503 at once.

So a real scrape, which sends its request at once, is answered whatever the half-sent
connections around it. One request per connection (HTTP/1.0), as before.

:class:`BasicAuth` holds the credentials that ``/metrics`` and ``/status/compaction``
require, read from the environment only (:func:`basic_auth_from_environment`): a value
given on the command line would show in ``ps``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import io
import os
import selectors
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from icegate_dagster.errors import ConfigError

#: Seconds a connection has, from its accept, to send its whole request head.
HEAD_TIMEOUT_S = 10.0
#: Seconds an answer may take to be written (Prometheus' scrape_timeout in the docs).
WRITE_TIMEOUT_S = 30.0
#: Threads answering complete requests.
HANDLER_THREADS = 8
#: Connections open at once (sending their head, waiting, or being answered).
MAX_CONNECTIONS = 512
#: The largest request head accepted (a request line and its headers).
MAX_HEAD_BYTES = 64 * 1024
#: The environment variables the credentials come from (``user:password``, or a file
#: holding it).
AUTH_VARIABLE = "ICEGATE_SERVE_BASIC_AUTH"
AUTH_FILE_VARIABLE = "ICEGATE_SERVE_BASIC_AUTH_FILE"

_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 37\r\n"
    b"Connection: close\r\n\r\ntoo many connections: try again later\n"
)


@dataclass(frozen=True)
class BasicAuth:
    """The one user and password that may read the figures."""

    user: str
    password: str

    def allows(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries these credentials (compared in
        constant time)."""
        if not header or header[:6].lower() != "basic ":
            return False
        try:
            given = base64.b64decode(header[6:].strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        expected = f"{self.user}:{self.password}".encode()
        return hmac.compare_digest(given, expected)


def parse_credentials(text: str, where: str) -> BasicAuth:
    """``user:password`` (as ``where`` holds it) -> :class:`BasicAuth`; a value without
    both parts is refused, naming ``where`` and never the value."""
    user, colon, password = text.strip("\r\n").partition(":")
    if not colon or not user or not password:
        raise ConfigError(
            f"{where} must hold user:password (a user name, a colon, a password; neither "
            "empty); the value is not shown"
        )
    return BasicAuth(user, password)


def basic_auth_from_environment(environ: dict[str, str] | None = None) -> BasicAuth | None:
    """The credentials in :data:`AUTH_VARIABLE`, or in the file :data:`AUTH_FILE_VARIABLE`
    names (its first line), or None when neither is set; both set, an unreadable file or
    a malformed value raise :class:`ConfigError`."""
    env = os.environ if environ is None else environ
    value, path = env.get(AUTH_VARIABLE), env.get(AUTH_FILE_VARIABLE)
    if value is not None and path is not None:
        raise ConfigError(f"set {AUTH_VARIABLE} or {AUTH_FILE_VARIABLE}, not both")
    if value is not None:
        return parse_credentials(value, AUTH_VARIABLE)
    if path is None:
        return None
    try:
        first = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{AUTH_FILE_VARIABLE} = {path!r} cannot be read: {type(exc).__name__}"
        ) from None
    return parse_credentials(first[0] if first else "", f"the file {AUTH_FILE_VARIABLE} names")


class _SocketWriter(io.BufferedIOBase):
    """What a handler writes, sent whole (``sendall``: the socket's timeout bounds it all)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._sock.sendall(data)
        return len(data)


class _Pending:
    """A connection still sending its request head."""

    def __init__(self, sock: socket.socket, address: tuple[str, int], deadline: float) -> None:
        self.sock = sock
        self.address = address
        self.deadline = deadline
        self.head = bytearray()


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


class BoundedHTTPServer:
    """An HTTP server that no client can hold open (see the module docstring); the
    ``serve_forever`` / ``shutdown`` / ``server_close`` / ``server_address`` of
    ``socketserver``'s servers."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        handler_threads: int = HANDLER_THREADS,
        max_connections: int = MAX_CONNECTIONS,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
    ) -> None:
        self.handler = handler
        self.max_connections = max_connections
        self.head_timeout_s = head_timeout_s
        self.write_timeout_s = write_timeout_s
        host = address[0]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(address)
            self.socket.listen(128)
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address: tuple[str, int] = self.socket.getsockname()[:2]
        self._pool = ThreadPoolExecutor(
            max_workers=handler_threads, thread_name_prefix="icegate-http"
        )
        self._pending: OrderedDict[socket.socket, _Pending] = OrderedDict()
        #: Connections handed to the pool and not closed yet.
        self._answering = 0
        self._count_lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()

    # -- the loop ------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Accept, read request heads and hand complete requests to the pool until
        :meth:`shutdown`."""
        self._stopped.clear()
        self._selector.register(self.socket, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        try:
            while not self._stop.is_set():
                wait = 0.5
                if self._pending:
                    oldest = next(iter(self._pending.values()))
                    wait = min(wait, max(0.0, oldest.deadline - time.monotonic()))
                for key, _ in self._selector.select(wait):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._read(key.data)
                self._expire(time.monotonic())
        finally:
            for name in (self.socket, self._wake_read):
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(name)
            self._stopped.set()

    def _open_connections(self) -> int:
        with self._count_lock:
            return len(self._pending) + self._answering

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors: the oldest waiting one makes room
                if self._pending:
                    self._drop(next(iter(self._pending)))
                return
            if self._open_connections() >= self.max_connections:
                if self._pending:  # the oldest still sending its head makes room
                    self._drop(next(iter(self._pending)))
                else:  # every slot is a request being answered: refused at once
                    sock.setblocking(False)
                    with contextlib.suppress(OSError):
                        sock.send(_BUSY)
                    _close(sock)
                    continue
            sock.setblocking(False)
            pending = _Pending(sock, address, time.monotonic() + self.head_timeout_s)
            with self._count_lock:
                self._pending[sock] = pending
            self._selector.register(sock, selectors.EVENT_READ, pending)

    def _drop(self, sock: socket.socket) -> None:
        """Close a connection still sending its head."""
        with self._count_lock:
            self._pending.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)
        _close(sock)

    def _read(self, pending: _Pending) -> None:
        try:
            chunk = pending.sock.recv(8192)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(pending.sock)
            return
        if not chunk:
            self._drop(pending.sock)
            return
        pending.head += chunk
        if b"\r\n\r\n" not in pending.head and b"\n\n" not in pending.head:
            if len(pending.head) > MAX_HEAD_BYTES:
                self._drop(pending.sock)
            return
        # Complete: from here the pool answers it.
        with self._count_lock:
            self._pending.pop(pending.sock, None)
            self._answering += 1
        self._selector.unregister(pending.sock)
        pending.sock.setblocking(True)
        pending.sock.settimeout(self.write_timeout_s)
        try:
            self._pool.submit(self._answer, pending.sock, pending.address, bytes(pending.head))
        except RuntimeError:  # the pool is shut down: the server is stopping
            self._done(pending.sock)

    def _expire(self, now: float) -> None:
        """Close the connections whose head is overdue (the oldest come first)."""
        while self._pending:
            sock, pending = next(iter(self._pending.items()))
            if pending.deadline > now:
                return
            self._drop(sock)

    def _answer(self, sock: socket.socket, address: tuple[str, int], head: bytes) -> None:
        try:
            self.handler(Request(sock, head), address, self)  # type: ignore[arg-type]
        except Exception:  # a client gone or too slow to read its answer: closed
            pass
        finally:
            self._done(sock)

    def _done(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        _close(sock)
        with self._count_lock:
            self._answering -= 1

    def _drain_wake(self) -> None:
        try:
            while self._wake_read.recv(64):
                pass
        except (BlockingIOError, InterruptedError):
            return

    # -- socketserver's interface --------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` and wait for it to return (from another thread)."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")
        self._stopped.wait()

    def server_close(self) -> None:
        """Close the listening socket and every connection still sending its head; the
        answers in progress end on their own."""
        for sock in list(self._pending):
            self._drop(sock)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for sock in (self.socket, self._wake_read, self._wake_write):
            _close(sock)
        self._selector.close()


@dataclass(frozen=True)
class Request:
    """A connection and the request head read from it."""

    sock: socket.socket
    head: bytes


class PrereadHandler(BaseHTTPRequestHandler):
    """A request handler whose request head was read by :class:`BoundedHTTPServer`."""

    request: Request

    def setup(self) -> None:
        # The head is all a GET or HEAD sends; the answer goes straight to the socket.
        self.connection = self.request.sock
        self.rfile = io.BytesIO(self.request.head)
        self.wfile = _SocketWriter(self.connection)

    def finish(self) -> None:
        self.rfile.close()
