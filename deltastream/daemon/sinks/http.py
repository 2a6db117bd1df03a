"""The ``http://URL`` / ``https://URL`` sink: one JSON POST per delivery with an
``Idempotency-Key``, retried with backoff (or ``Retry-After``); at-least-once.

Its headers hold credentials (``Authorization``): they go into requests and nowhere else,
not into its description, its repr or its errors.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import json
import re
import ssl
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

import anyio
import anyio.to_thread

from deltastream.daemon.crashpoints import crash_point
from deltastream.daemon.delivery import Delivery, Guarantee, Position, Sink, StreamRef
from deltastream.daemon.sinks.common import SPEC_FORMS, _check_retry_options, expand_env, log
from deltastream.errors import HttpStatusError, InvalidArgumentError, SinkError
from deltastream.output import batch_to_json_lines
from deltastream.storage.retry import RetryEvent, RetryPolicy, call_with_retries

if TYPE_CHECKING:
    import aiohttp


#: Seconds each request may take (``--http-timeout``, ``HttpSink(timeout=)``).
HTTP_TIMEOUT: Final = 30.0

#: An HTTP header name (RFC 9110 token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: Headers the sink sets itself on every request.
_SINK_HEADERS = ("content-type", "idempotency-key")


def check_http_header(name: str, value: str) -> None:
    """Refuse a header the sink cannot send: a name that is no HTTP token, a value with a
    line break (which would start another header), one of the headers the sink sets. The
    value is never shown."""
    if not _HEADER_NAME.fullmatch(name):
        raise InvalidArgumentError(f"{name!r} is not an HTTP header name")
    if name.lower() in _SINK_HEADERS:
        raise InvalidArgumentError(f"header {name!r} is set by the http sink itself")
    if any(c in value for c in "\r\n\0"):
        raise InvalidArgumentError(f"the value of header {name!r} holds a line break or NUL")


def resolve_http_headers(templates: Mapping[str, str]) -> dict[str, str]:
    """Header templates (the ``http_headers`` setting) as the headers to send: each
    ``${NAME}`` in a value read from the environment (:func:`expand_env`), each header
    checked (:func:`check_http_header`). Errors name the header, never a value. The stream's
    settings call it when they are read (the variables must be set then) and again when the
    sink is made."""
    headers: dict[str, str] = {}
    for name, template in templates.items():
        value = expand_env(template, f"header {name!r}")
        check_http_header(name, value)
        headers[name] = value
    return headers


def _http_body(delivery: Delivery) -> bytes:
    head = json.dumps(
        {
            "table": delivery.table,
            "table_id": delivery.table_id,
            "table_uri": delivery.table_uri,
            "from_version": delivery.from_version,
            "to_version": delivery.to_version,
            "start": delivery.start.to_json(),
            "end": delivery.end.to_json(),
            "epoch": delivery.epoch,
        },
        ensure_ascii=False,
    )
    rows = ", ".join(line for batch in delivery.batches for line in batch_to_json_lines(batch))
    return f'{head[:-1]}, "rows": [{rows}]}}'.encode()


def _retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header's delay: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


def _tls(verify: bool, ca_bundle: str | None) -> ssl.SSLContext | bool:
    """aiohttp's ``ssl`` setting: ``True`` (verify against the system's CA certificates), a
    context verifying against ``ca_bundle``'s, or ``False`` (no verification)."""
    if ca_bundle is None:
        return verify
    if not verify:
        raise InvalidArgumentError(
            f"a CA bundle ({ca_bundle}) is given to verify TLS certificates, but verification "
            "is off: give one or the other"
        )
    try:
        return ssl.create_default_context(cafile=ca_bundle)
    except OSError as e:  # ssl.SSLError too: a file that holds no certificate
        reason = e.strerror or str(e)
        raise InvalidArgumentError(f"{ca_bundle}: cannot load CA certificates: {reason}") from e


def _retryable_status(status: int) -> bool:
    return status >= 500 or status in (408, 409, 429)


class _RetryableStatus(Exception):
    """An answer with a status worth retrying (:func:`_retryable_status`): ``reason`` in one
    line, and the wait the server asked for (``Retry-After``), if any."""

    def __init__(self, reason: str, retry_after: float | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


def _transient_cause(error: BaseException) -> str | None:
    """Why a POST failed, in one line, if retrying may help: a status worth retrying, a
    connection error, a timeout. None for anything else (a rejecting status, a bad URL)."""
    import aiohttp

    if isinstance(error, _RetryableStatus):
        return error.reason
    if isinstance(error, aiohttp.ClientError | TimeoutError):
        return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return None


class HttpSink(Sink):
    """POSTs each delivery as one JSON document (``http://URL``, ``https://URL``)::

        {"table": ..., "table_id": ..., "table_uri": ..., "from_version": ..., "to_version": ...,
         "start": {"version": ..., "snapshot": ..., "offset": ...}, "end": {...},
         "epoch": ..., "rows": [{...}, ...]}

    with ``Content-Type: application/json``, ``Idempotency-Key`` and ``Deltastream-Epoch``
    (the stream's epoch in the sending process, :attr:`Delivery.epoch`: a receiver that keeps
    the highest it has seen per stream and refuses a lower one with a 4xx fences off a
    process that lost the stream). Any 2xx acknowledges.
    Connection errors, timeouts (``timeout`` seconds per attempt), 5xx, 408, 409 and 429 are
    retried with exponential backoff and full jitter (``base_delay``, capped at
    ``max_delay``), or after the ``Retry-After`` the server asked for (capped at
    ``max_retry_after``); ``max_attempts=None`` (the default) retries forever. Other
    statuses, redirects included (they are not followed), raise :class:`HttpStatusError`.
    ``headers`` are added to every request (e.g. ``Authorization``). The server's TLS
    certificate is verified against the system's CA certificates, or those in the PEM file
    ``ca_bundle``; ``verify=False`` turns verification off (test endpoints only).
    At-least-once.
    """

    guarantee: Guarantee = "at-least-once"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = HTTP_TIMEOUT,
        max_attempts: int | None = None,
        base_delay: float = 0.5,
        max_delay: float = 60.0,
        max_retry_after: float = 300.0,
        headers: Mapping[str, str] | None = None,
        verify: bool = True,
        ca_bundle: str | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise InvalidArgumentError(f"not an http(s) URL: {url!r}; accepted: {SPEC_FORMS}")
        _check_retry_options(max_attempts, base_delay, max_delay)
        if timeout <= 0:
            raise InvalidArgumentError(f"timeout must be positive, not {timeout}")
        self.url = url
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.max_retry_after = max_retry_after
        self.headers = dict(headers or {})
        for name, value in self.headers.items():
            check_http_header(name, value)
        self.verify = verify
        self.ca_bundle = ca_bundle
        self._ssl = _tls(verify, ca_bundle)
        self._session: aiohttp.ClientSession | None = None
        #: Requests that failed and were retried, for tests and metrics.
        self.retries = 0

    @property
    def description(self) -> str:
        return self.url

    def __repr__(self) -> str:
        # Header names only: their values are credentials.
        tls = "" if self.verify else ", verify=False"
        tls += "" if self.ca_bundle is None else f", ca_bundle={self.ca_bundle!r}"
        return (
            f"HttpSink({self.url!r}, timeout={self.timeout:g}{tls}, headers={sorted(self.headers)})"
        )

    async def recover(
        self, stream: StreamRef, committed: Position | None, state: Mapping[str, Any]
    ) -> None:
        """Nothing to undo: the receiver gets repeated rows (at-least-once)."""

    def _get_session(self) -> aiohttp.ClientSession:
        import aiohttp  # imported on first use: it is heavy, and most sinks never need it

        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(ssl=self._ssl),
            )
        return self._session

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        import aiohttp

        if not delivery.num_rows:
            return {}
        body = await anyio.to_thread.run_sync(_http_body, delivery)
        headers = {
            **self.headers,
            "Content-Type": "application/json",
            "Idempotency-Key": delivery.idempotency_key,
            "Deltastream-Epoch": str(delivery.epoch),
        }
        what = f"{delivery.num_rows} rows of {delivery.table} ({delivery.start} to {delivery.end})"

        async def post() -> Mapping[str, Any]:
            try:
                async with self._get_session().post(
                    self.url, data=body, headers=headers, allow_redirects=False
                ) as response:
                    status = response.status
                    if 200 <= status < 300:
                        await response.read()
                        crash_point("sink.after-write")
                        return {}
                    snippet = await self._snippet(response)
                    if not _retryable_status(status):
                        raise HttpStatusError(self.url, status, response.reason or "", snippet)
                    reason = f"HTTP {status} {response.reason or ''}".rstrip()
                    if snippet:
                        reason += f": {snippet}"
                    retry_after = _retry_after_seconds(response.headers.get("Retry-After"))
                    raise _RetryableStatus(reason, retry_after)
            except aiohttp.InvalidURL as e:
                raise SinkError(self.url, f"invalid URL: {e}") from e

        def requested_delay(error: BaseException) -> float | None:
            if isinstance(error, _RetryableStatus) and error.retry_after is not None:
                return min(error.retry_after, self.max_retry_after)
            return None

        def give_up(error: BaseException, attempts: int, cause: str) -> SinkError:
            return SinkError(
                self.url, f"POST of {what} failed after {attempts} attempt(s): {cause}"
            )

        def counted() -> None:
            self.retries += 1

        def logged(event: RetryEvent) -> None:
            log.warning(
                "%s: POST of %s failed (attempt %d): %s; retrying in %.1fs",
                self.url,
                what,
                event.attempt,
                event.cause,
                event.delay,
            )

        return await call_with_retries(
            post,
            operation="POST",
            target=self.url,
            policy=RetryPolicy(self.max_attempts or sys.maxsize, self.base_delay, self.max_delay),
            transient=_transient_cause,
            # A listener logs the retry (once, with the stream's name); without one, this sink.
            listener=self.retry_listener or logged,
            on_retry=counted,
            requested_delay=requested_delay,
            give_up=give_up,
        )

    @staticmethod
    async def _snippet(response: aiohttp.ClientResponse, limit: int = 500) -> str:
        import aiohttp

        try:
            data = await response.content.read(limit + 1)
        except (aiohttp.ClientError, TimeoutError):
            return ""
        text = " ".join(data[:limit].decode("utf-8", "replace").split())
        return text + "..." if len(data) > limit else text

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
