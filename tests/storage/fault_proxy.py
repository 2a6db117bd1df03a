"""A fault-injecting HTTP reverse proxy for S3 retry tests.

``FaultProxy`` listens on a free 127.0.0.1 port and forwards every request, byte for byte,
to an upstream HTTP server (moto) with ``http.client``; the response goes back unchanged
except for hop-by-hop headers. Faults queued with :meth:`FaultProxy.inject` are consumed by
the next requests instead, one fault per request, in order:

* ``"slowdown"``: ``503 SlowDown`` with S3's XML error body
* ``"internal"``: ``500 InternalError``
* ``"denied"``:   ``403 AccessDenied``
* ``"drop"``:     the request is read, then the connection is closed without a response
* ``"reset"``:    the same, but the connection is aborted with a TCP RST
* ``"lost"``:     the request is forwarded upstream (it takes effect), then the connection is
  closed without relaying the response, as when a network drops a reply
* ``"pass"``:     no fault: the request is forwarded (to let earlier requests through)

Every response carries ``Connection: close`` so that each request uses a fresh connection
and a fault never leaks into the next request through a reused socket.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import urlsplit

__all__ = ["FAULTS", "FaultProxy", "Seen"]

_ERRORS: dict[str, tuple[int, str, str]] = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
    "denied": (403, "AccessDenied", "Access Denied"),
}
FAULTS = (*_ERRORS, "drop", "reset", "lost", "pass")

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
    }
)


@dataclass(frozen=True)
class Seen:
    """One request that reached the proxy and what the proxy did with it."""

    method: str
    path: str
    outcome: str  # a fault name, or "forwarded <upstream status>"


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must be http://host:port, not {upstream!r}")
        self.upstream_host: str = parts.hostname
        self.upstream_port: int = parts.port
        self._lock = threading.Lock()
        self._faults: deque[str] = deque()
        self._seen: list[Seen] = []
        handler = type("BoundHandler", (_Handler,), {"proxy": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def inject(self, *faults: str) -> None:
        """Queue faults for the next requests, one each, in order."""
        unknown = [f for f in faults if f not in FAULTS]
        if unknown:
            raise ValueError(f"unknown faults {unknown}; known: {FAULTS}")
        with self._lock:
            self._faults.extend(faults)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._faults)

    @property
    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)

    def reset(self) -> None:
        """Forget queued faults and seen requests."""
        with self._lock:
            self._faults.clear()
            self._seen.clear()

    def next_fault(self) -> str | None:
        with self._lock:
            return self._faults.popleft() if self._faults else None

    def record(self, seen: Seen) -> None:
        with self._lock:
            self._seen.append(seen)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        if self._thread.is_alive():
            raise RuntimeError("fault proxy did not shut down")


class _Handler(BaseHTTPRequestHandler):
    proxy: ClassVar[FaultProxy]
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output quiet

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()  # CRLF after each chunk
        length = int(self.headers.get("Content-Length", "0") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        self.close_connection = True
        body = self._read_body()
        fault = self.proxy.next_fault()
        if fault is None or fault == "pass":
            self._forward(body)
            return
        self.proxy.record(Seen(self.command, self.path, fault))
        if fault == "lost":
            self._forward(body, relay=False)
            return
        if fault in ("drop", "reset"):
            if fault == "reset":
                # SO_LINGER with a zero timeout: close() aborts the connection with a RST.
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()
            return  # socketserver closes the connection; no response is written
        self._send_error(*_ERRORS[fault])

    def _send_error(self, status: int, code: str, message: str) -> None:
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            "<RequestId>FAULTPROXY</RequestId><HostId>fault-proxy</HostId></Error>"
        ).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("x-amz-request-id", "FAULTPROXY")
        self.send_header("Content-Length", str(len(xml)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(xml)

    def _forward(self, body: bytes, *, relay: bool = True) -> None:
        """Send the request upstream and relay the response (unless ``relay`` is false)."""
        upstream = http.client.HTTPConnection(
            self.proxy.upstream_host, self.proxy.upstream_port, timeout=30
        )
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in _HOP_BY_HOP:
                    upstream.putheader(name, value)
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                upstream.putheader("Content-Length", str(len(body)))
            upstream.putheader("Connection", "close")
            upstream.endheaders(body or None)
            resp = upstream.getresponse()
            data = resp.read()  # empty for HEAD; de-chunked if upstream chunked it
            headers = resp.getheaders()
            status, reason = resp.status, resp.reason
        finally:
            upstream.close()
        # Recorded before the client can see the response, so tests never race the proxy.
        self.proxy.record(Seen(self.command, self.path, f"forwarded {status}"))
        if not relay:
            return
        self.send_response_only(status, reason)
        has_length = False
        for name, value in headers:
            lower = name.lower()
            if lower in _HOP_BY_HOP:
                continue
            has_length = has_length or lower == "content-length"
            self.send_header(name, value)
        if not has_length and self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle
