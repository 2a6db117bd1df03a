"""A reverse proxy that injects S3 faults, queued one by one or at random, for S3 tests.

:class:`FaultProxy` listens on a free 127.0.0.1 port (an aiohttp server on its own event loop
in its own thread) and forwards every request to an upstream HTTP server (moto) exactly as
the client sent it: the method, the raw path and query string (no re-encoding), the headers
(``Host`` included, as the client sent it, so a SigV4 signature still verifies) and the body
bytes. The upstream's answer goes back unchanged but for hop-by-hop headers.

Some requests get a fault instead. The faults:

* ``slowdown``: ``503 SlowDown`` with S3's XML error body; not forwarded;
* ``internal``: ``500 InternalError``; not forwarded;
* ``denied``: ``403 AccessDenied``; not forwarded;
* ``busy``: ``503 ServerBusy`` (Azure's throttling), ``throttled``: ``429 TooManyRequests``
  (GCS's); not forwarded;
* ``drop``: the request is read, then the connection is closed (FIN) without an answer;
* ``reset``: the connection is aborted with a TCP RST before any answer; not forwarded;
* ``lost``: the request is forwarded (it takes effect upstream), then the connection is
  closed without relaying the answer: a lost response;
* ``delay``: the request is forwarded after a pause of ``delay_range`` seconds (0.2-2 s).

Two ways to pick them, usable together (queued faults come first):

* **queued**: :meth:`FaultProxy.inject` queues faults (or ``"pass"``: no fault, to let a
  request through) that the next requests take, one each, in order: for tests that script
  exactly what each request meets;
* **at random**: a fraction of the requests (``rate``, changeable while running) gets a
  fault, drawn by a seeded :class:`random.Random`, its kind chosen by ``weights`` (by
  default: equal weights for the :data:`FAULT_KINDS`, the faults a real S3 endpoint gives
  now and then); for soaks.

``methods`` and ``path_pattern`` limit the faults to some requests (by default: all).

Connections to the proxy are kept alive as the client asks, as a real S3 endpoint does. With
``keep_alive=False`` every answer carries ``Connection: close`` instead, so that each request
uses a fresh connection and a fault never leaks into the next request through a reused
socket (what tests of queued faults want).

The proxy records what it did: :attr:`~FaultProxy.seen` (every request, in order, with its
outcome: the fault, and ``"forwarded <status>"`` once the upstream answered), recorded before
the client can see the answer, so tests never race the proxy; :meth:`~FaultProxy.counts`
(requests, forwarded requests and faults by kind, thread-safe); :meth:`~FaultProxy.events`
(the latest faults, with their time and the upstream's status), to tell what happened when a
test fails.

Use it as a context manager, or :meth:`~FaultProxy.start` and :meth:`~FaultProxy.stop`::

    with FaultProxy(moto_endpoint, rate=0.1, seed=7) as proxy:
        options = {"endpoint_url": proxy.url, ...}
        ...
        proxy.rate = 0.3

    with FaultProxy(moto_endpoint, keep_alive=False) as proxy:
        proxy.inject("slowdown", "drop", "drop")
        ...
        assert [s.outcome for s in proxy.seen] == ["slowdown", "drop", "drop", "forwarded 200"]
"""

from __future__ import annotations

import asyncio
import random
import re
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web
from multidict import CIMultiDict
from yarl import URL

__all__ = ["DEFAULT_WEIGHTS", "FAULTS", "FAULT_KINDS", "FaultEvent", "FaultProxy", "Seen"]

_ERRORS: dict[str, tuple[int, str, str]] = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
    "denied": (403, "AccessDenied", "Access Denied"),
    # Azure's and GCS's throttling answers (Azure's error bodies have S3's XML shape).
    "busy": (503, "ServerBusy", "The server is busy."),
    "throttled": (429, "TooManyRequests", "Rate limit exceeded."),
}
#: Every fault the proxy can inject.
FAULTS = (*_ERRORS, "drop", "reset", "lost", "delay")
#: The faults drawn at random by default.
FAULT_KINDS = ("slowdown", "internal", "reset", "lost", "delay")
DEFAULT_WEIGHTS: Mapping[str, float] = {kind: 1.0 for kind in FAULT_KINDS}
#: The faults after which the request is forwarded all the same.
_FORWARDED = frozenset({"lost", "delay"})

# Not forwarded either way: they describe one hop (RFC 9110 7.6.1).
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Not forwarded to the upstream either: the proxy's client library sets Content-Length from
# the body it sends; ``Expect`` is answered by the proxy (100 Continue) and not signed by
# botocore.
_REQUEST_SKIP = _HOP_BY_HOP | {"expect", "content-length"}


@dataclass(frozen=True)
class Seen:
    """One request that reached the proxy and what the proxy did with it (a request with a
    ``lost`` or ``delay`` fault is seen twice: the fault, then ``forwarded <status>``)."""

    method: str
    path: str  # raw path and query
    outcome: str  # a fault, "forwarded <upstream status>" or "upstream failed"
    #: The request's Authorization header, for forwarded requests (None: none, or a fault).
    authorization: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class FaultEvent:
    """One injected fault."""

    time: float  # time.time()
    kind: str
    method: str
    path: str  # raw path and query
    #: For ``lost`` and ``delay``: the upstream's status (the request did take effect).
    upstream_status: int | None = None


class FaultProxy:
    def __init__(
        self,
        upstream: str,
        *,
        rate: float = 0.0,
        weights: Mapping[str, float] | None = None,
        seed: int | None = 0,
        methods: Iterable[str] | None = None,
        path_pattern: str | None = None,
        delay_range: tuple[float, float] = (0.2, 2.0),
        keep_alive: bool = True,
        port: int = 0,
        keep_events: int = 10_000,
        keep_seen: int = 100_000,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream must be http://host:port, not {upstream!r}")
        self.upstream = f"http://{parts.hostname}:{parts.port}"
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._rate = 0.0
        self.rate = rate
        self._kinds: tuple[str, ...] = ()
        self._weights: tuple[float, ...] = ()
        self.set_weights(weights or DEFAULT_WEIGHTS)
        self.methods = frozenset(m.upper() for m in methods) if methods is not None else None
        self.path_pattern = re.compile(path_pattern) if path_pattern is not None else None
        self.delay_range = delay_range
        self.keep_alive = keep_alive
        self._requested_port = port
        self._queue: deque[str] = deque()
        self._requests = 0
        self._forwarded = 0
        self._faults: Counter[str] = Counter()
        self._events: deque[FaultEvent] = deque(maxlen=keep_events)
        self._seen: deque[Seen] = deque(maxlen=keep_seen)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._session: ClientSession | None = None
        self._startup_error: BaseException | None = None
        self.port = 0

    # ---------------------------------------------------------------- settings and faults

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("the proxy is not running")
        return f"http://127.0.0.1:{self.port}"

    @property
    def rate(self) -> float:
        with self._lock:
            return self._rate

    @rate.setter
    def rate(self, value: float) -> None:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"the fault rate must be within [0, 1], not {value}")
        with self._lock:
            self._rate = value

    def set_weights(self, weights: Mapping[str, float]) -> None:
        unknown = sorted(set(weights) - set(FAULTS))
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {FAULTS}")
        kinds = tuple(k for k in FAULTS if weights.get(k, 0) > 0)
        if not kinds:
            raise ValueError("at least one fault kind needs a positive weight")
        with self._lock:
            self._kinds = kinds
            self._weights = tuple(float(weights[k]) for k in kinds)

    def inject(self, *faults: str) -> None:
        """Queue faults (or ``"pass"``) for the next requests, one each, in order."""
        unknown = [f for f in faults if f not in (*FAULTS, "pass")]
        if unknown:
            raise ValueError(f"unknown faults {unknown}; known: {(*FAULTS, 'pass')}")
        with self._lock:
            self._queue.extend(faults)

    @property
    def pending(self) -> int:
        """Queued faults not taken yet."""
        with self._lock:
            return len(self._queue)

    # ---------------------------------------------------------------- what happened

    @property
    def seen(self) -> list[Seen]:
        """The requests seen (the latest ``keep_seen`` records at most), oldest first."""
        with self._lock:
            return list(self._seen)

    def counts(self) -> dict[str, int]:
        """``requests`` (every request received), ``forwarded`` (requests that reached the
        upstream, ``lost`` and ``delay`` included), ``faults`` (all kinds) and one entry per
        fault kind."""
        with self._lock:
            out = {
                "requests": self._requests,
                "forwarded": self._forwarded,
                "faults": sum(self._faults.values()),
            }
            out.update({kind: self._faults[kind] for kind in FAULTS})
            return out

    def events(self) -> list[FaultEvent]:
        """The latest faults injected (``keep_events`` of them at most), oldest first."""
        with self._lock:
            return list(self._events)

    def reset(self) -> None:
        """Forget queued faults, seen requests, counts and events."""
        with self._lock:
            self._queue.clear()
            self._seen.clear()
            self._requests = self._forwarded = 0
            self._faults.clear()
            self._events.clear()

    def _choose(self, method: str, path: str) -> str | None:
        with self._lock:
            self._requests += 1
            if self.methods is not None and method not in self.methods:
                return None
            if self.path_pattern is not None and not self.path_pattern.search(path):
                return None
            if self._queue:
                kind = self._queue.popleft()
                if kind == "pass":
                    return None
            elif self._rate <= 0 or self._rng.random() >= self._rate:
                return None
            else:
                kind = self._rng.choices(self._kinds, self._weights)[0]
            self._faults[kind] += 1
            self._seen.append(Seen(method, path, kind))
            return kind

    def _delay(self) -> float:
        with self._lock:
            return self._rng.uniform(*self.delay_range)

    def _record(
        self, seen: Seen | None = None, event: FaultEvent | None = None, forwarded: bool = False
    ) -> None:
        with self._lock:
            if seen is not None:
                self._seen.append(seen)
            if event is not None:
                self._events.append(event)
            self._forwarded += forwarded

    # ---------------------------------------------------------------- life cycle

    def start(self) -> FaultProxy:
        if self._thread is not None:
            raise RuntimeError("the proxy is already running")
        self._ready.clear()
        self._thread = threading.Thread(target=self._serve, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start within 10 s")
        if self._startup_error is not None:
            self._thread.join(5)
            self._thread = None
            raise RuntimeError("the fault proxy failed to start") from self._startup_error
        return self

    def stop(self) -> None:
        """Stop listening and close the connections (a request still waiting for the
        upstream gets 1 s to finish)."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        if thread.is_alive():
            raise RuntimeError("the fault proxy did not stop within 10 s")
        self._thread = None
        self.port = 0

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as e:
            if not self._ready.is_set():
                self._startup_error = e
                self._ready.set()
            else:
                raise
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        session = ClientSession(
            connector=TCPConnector(limit=256, force_close=False),
            timeout=ClientTimeout(total=None, sock_connect=10, sock_read=120),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )
        app = web.Application(client_max_size=1 << 30)
        self._session = session
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", self._requested_port)
            await site.start()
            server = site._server
            assert server is not None
            sockets = getattr(server, "sockets", None) or []
            self.port = int(sockets[0].getsockname()[1])
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await session.close()

    # ---------------------------------------------------------------- requests

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        method, path = request.method, request.raw_path
        kind = self._choose(method, path)
        if kind is not None and kind not in _FORWARDED:
            self._record(event=FaultEvent(time.time(), kind, method, path))
            if kind in _ERRORS:
                return self._answer(_error_response(method, *_ERRORS[kind]))
            _abort(request, rst=kind == "reset")  # drop, reset
            return web.Response(status=500)  # never written: the connection is gone
        if kind == "delay":
            await asyncio.sleep(self._delay())
        try:
            status, reason, headers, data = await self._forward(request, body)
        except Exception as e:  # the upstream failed: say so, as a gateway would
            self._record(Seen(method, path, "upstream failed"))
            return self._answer(
                web.Response(status=502, text=f"fault proxy: upstream failed: {e!r}")
            )
        self._record(
            Seen(method, path, f"forwarded {status}", request.headers.get("Authorization")),
            FaultEvent(time.time(), kind, method, path, status) if kind is not None else None,
            forwarded=True,
        )
        if kind == "lost":
            _abort(request, rst=False)
            return web.Response(status=500)  # never written
        response = web.Response(status=status, reason=reason, headers=headers)
        if method != "HEAD":
            response.body = data
        return self._answer(response)

    def _answer(self, response: web.Response) -> web.Response:
        if not self.keep_alive:
            response.force_close()  # sends Connection: close, then closes
        return response

    async def _forward(
        self, request: web.Request, body: bytes
    ) -> tuple[int, str | None, CIMultiDict[str], bytes]:
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in request.headers.items():
            if name.lower() not in _REQUEST_SKIP:
                headers.add(name, value)
        data = body if body or request.method in ("PUT", "POST") else None
        url = URL(self.upstream + request.raw_path, encoded=True)
        assert self._session is not None
        async with self._session.request(
            request.method, url, headers=headers, data=data, allow_redirects=False
        ) as upstream:
            payload = await upstream.read()
            out: CIMultiDict[str] = CIMultiDict()
            for name, value in upstream.headers.items():
                if name.lower() in _HOP_BY_HOP:
                    continue
                if name.lower() == "content-length" and request.method != "HEAD":
                    continue  # set from the relayed body
                out.add(name, value)
            return upstream.status, upstream.reason, out, payload


def _error_response(method: str, status: int, code: str, message: str) -> web.Response:
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        "<RequestId>FAULTPROXY</RequestId><HostId>fault-proxy</HostId></Error>"
    ).encode()
    headers = {"Content-Type": "application/xml", "x-amz-request-id": "FAULTPROXY"}
    if method == "HEAD":  # a HEAD answer has no body, only its length
        headers["Content-Length"] = str(len(xml))
        return web.Response(status=status, headers=headers)
    return web.Response(status=status, headers=headers, body=xml)


def _abort(request: web.Request, *, rst: bool) -> None:
    """Drop the client's connection without an answer: with a TCP RST (``rst``), or an
    orderly close (FIN) after the request was read."""
    transport: Any = request.transport
    if transport is None:
        return
    if rst:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    else:
        transport.close()
