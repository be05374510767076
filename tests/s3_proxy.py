"""A counting proxy for S3 on loopback: every request passes through unchanged and is
counted by kind, so a test or ``bench requests`` can say what a pass costs in requests.

Clients point ``s3.endpoint`` at the proxy and use path-style addressing. SigV4 signs the
``Host`` header, so the proxy forwards the request line, every header (``Host`` as the
client sent it, naming the proxy) and the body byte for byte: SeaweedFS checks the
signature against the ``Host`` it receives, which is the one the client signed. Bodies are
streamed in both directions; only a multi-object delete's body (a small XML list) is read
whole, to count the objects it names.

Kinds, as S3 bills them: ``LIST`` (ListObjects/ListObjectsV2, ListBuckets, ListParts and
ListMultipartUploads), ``HEAD``, ``GET`` (an object's bytes), ``PUT`` (PutObject, CopyObject,
UploadPart, CreateMultipartUpload, CompleteMultipartUpload), ``DELETE`` (DeleteObject,
AbortMultipartUpload and each multi-object delete request; ``deleted objects`` counts the
keys those named) and ``OTHER`` (bucket settings, location, anything else).
"""

from __future__ import annotations

import http.client
import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

KINDS = ("LIST", "HEAD", "GET", "PUT", "DELETE", "OTHER")
#: The count of keys named by multi-object deletes (not a request kind).
DELETED_OBJECTS = "deleted objects"
_CHUNK = 1 << 16
#: Headers that describe one hop, not the request (RFC 9110 §7.6.1).
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade"}
)
#: Bucket sub-resources read with GET that are settings, not listings.
_BUCKET_LISTINGS = frozenset({"list-type", "prefix", "delimiter", "marker", "uploads", "max-keys"})


def classify(method: str, target: str) -> str:
    """The kind of one path-style S3 request: ``method`` and its request target."""
    parts = urlsplit(target)
    query = parse_qs(parts.query, keep_blank_values=True)
    path = parts.path.strip("/")
    is_object = "/" in path  # "bucket/key": path-style addressing
    if method == "HEAD":
        return "HEAD"
    if method == "GET":
        if not path:
            return "LIST"  # ListBuckets
        if is_object:
            return "LIST" if "uploadId" in query else "GET"
        if not query or _BUCKET_LISTINGS & query.keys():
            return "LIST"
        return "OTHER"
    if method == "PUT":
        return "PUT" if is_object else "OTHER"  # a bucket PUT creates it or sets a setting
    if method == "POST":
        if "delete" in query:
            return "DELETE"
        if is_object and ("uploads" in query or "uploadId" in query):
            return "PUT"
        return "OTHER"
    if method == "DELETE":
        return "DELETE" if is_object else "OTHER"
    return "OTHER"


class RequestCounts:
    """Requests seen by kind, safe to update from the proxy's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, kind: str, deleted: int = 0) -> None:
        with self._lock:
            self._counts[kind] += 1
            if deleted:
                self._counts[DELETED_OBJECTS] += deleted

    def take(self) -> dict[str, int]:
        """The counts since the last take (every kind, zeros included), then start again."""
        with self._lock:
            taken = {kind: self._counts[kind] for kind in (*KINDS, DELETED_OBJECTS)}
            self._counts.clear()
        return taken


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # request lines name objects; the caller reads counts, not a log

    def _relay(self) -> None:
        method, target = self.command, self.path
        kind = classify(method, target)
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP]
        length = int(self.headers.get("Content-Length") or 0)
        deleted = 0
        upstream = http.client.HTTPConnection(self.server.upstream, timeout=300)
        try:
            upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                upstream.putheader(name, value)
            upstream.endheaders()
            if kind == "DELETE" and method == "POST":
                body = self.rfile.read(length)
                deleted = len(re.findall(rb"<Object>", body))
                upstream.send(body)
            elif "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                self._relay_chunks(upstream)
            else:
                left = length
                while left > 0:
                    chunk = self.rfile.read(min(_CHUNK, left))
                    if not chunk:
                        break
                    upstream.send(chunk)
                    left -= len(chunk)
            response = upstream.getresponse()
            # Counted before the client hears back: once it has, its next step must see it.
            self.server.counts.add(kind, deleted)
            self._answer(method, response)
        finally:
            upstream.close()

    def _relay_chunks(self, upstream: http.client.HTTPConnection) -> None:
        """A chunked body, frame by frame as it came (its framing is not signed, but its
        bytes are: never re-chunked)."""
        while True:
            size_line = self.rfile.readline()
            upstream.send(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (trailer := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                    upstream.send(trailer)
                upstream.send(b"\r\n")
                return
            upstream.send(self.rfile.read(size + 2))  # the data and its CRLF

    def _answer(self, method: str, response: http.client.HTTPResponse) -> None:
        self.send_response_only(response.status, response.reason)
        chunked = response.getheader("Content-Length") is None and method != "HEAD"
        for name, value in response.getheaders():
            if name.lower() in _HOP_BY_HOP or name.lower() == "transfer-encoding":
                continue
            self.send_header(name, value)
        if chunked and response.status not in (204, 304):
            self.send_header("Transfer-Encoding", "chunked")
        else:
            chunked = False
        self.end_headers()
        while chunk := response.read(_CHUNK):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _relay


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = upstream
        self.counts = RequestCounts()


class CountingProxy:
    """A running proxy: ``endpoint`` to give clients, ``counts`` of what passed."""

    def __init__(self, server: _ProxyServer) -> None:
        self._server = server
        host, port = server.server_address[:2]
        self.endpoint = f"http://{host!s}:{port}"
        self.counts = server.counts

    def forward_to(self, upstream_endpoint: str) -> None:
        """Forward from now on to ``upstream_endpoint``: a server that must advertise the
        proxy (SeaweedFS's ``S3_EXTERNAL_URL``) starts after the proxy has its port."""
        self._server.upstream = _host_port(upstream_endpoint)


def _host_port(endpoint: str) -> str:
    return endpoint.removeprefix("http://").rstrip("/")


@contextmanager
def counting_proxy(upstream_endpoint: str) -> Iterator[CountingProxy]:
    """A proxy to ``upstream_endpoint`` (``http://host:port``; may be changed later with
    :meth:`CountingProxy.forward_to`) on a free loopback port, serving until the block ends."""
    server = _ProxyServer(_host_port(upstream_endpoint))
    thread = threading.Thread(target=server.serve_forever, name="s3-proxy", daemon=True)
    thread.start()
    try:
        yield CountingProxy(server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
