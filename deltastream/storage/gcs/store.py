"""The GCS store (:class:`GcsStore`): GCS's JSON API on aiohttp.

Every request goes through :func:`~deltastream.storage.retry.call_with_retries`: 408, 429,
5xx answers and connection errors are retried with the shared policy; anything else fails at
once with one line naming the object and GCS's own message. Version tags are generations:
``put(if_match="")`` sends ``ifGenerationMatch=0`` (create only), ``put(if_match=g)``
``ifGenerationMatch=g``. Listings pass ``startOffset`` and also drop keys up to
``start_after`` themselves (``startOffset`` is inclusive, and emulators ignore it).

The HTTP session and the credentials (``gcloud-aio-auth``'s :class:`Token`, which speaks
OAuth for service account keys, user credentials and the metadata server) are created on the
first request and closed by :meth:`GcsStore.aclose`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, TypeGuard, TypeVar
from urllib.parse import quote

import aiohttp
import anyio
import pyarrow as pa

from deltastream.errors import (
    AccessDeniedError,
    InvalidArgumentError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
)
from deltastream.storage.base import ObjectMeta, ObjectStore, check_byte_range
from deltastream.storage.gcs.options import GcsOptions
from deltastream.storage.paths import GCS_SCHEMES, split_uri
from deltastream.storage.ranged import open_remote_file

__all__ = ["CredentialsError", "GcsStore"]

T = TypeVar("T")
log = logging.getLogger("deltastream.storage.gcs")

_SCOPES = ["https://www.googleapis.com/auth/devstorage.read_write"]
_RETRY_STATUSES = frozenset({408, 429})
#: Objects per listing page (GCS's maximum).
PAGE_SIZE = 1000


def _status_error(resp: aiohttp.ClientResponse, body: bytes) -> aiohttp.ClientResponseError:
    """GCS answered with an error status: aiohttp's own error for it (not a class of ours:
    :class:`deltastream.errors.HttpStatusError` is the HTTP sink's), its message the reason
    and GCS's own message from the body."""
    message = ": ".join(part for part in (resp.reason or "", _message(body)) if part)
    return aiohttp.ClientResponseError(
        resp.request_info, resp.history, status=resp.status, message=message, headers=resp.headers
    )


def _is_status_error(error: BaseException | None) -> TypeGuard[aiohttp.ClientResponseError]:
    """Whether ``error`` is one :func:`_status_error` made. The exact class: aiohttp raises
    subclasses of its own (too many redirects, say), which count as connection trouble."""
    return type(error) is aiohttp.ClientResponseError


def _status_text(error: aiohttp.ClientResponseError) -> str:
    """``403 Forbidden: <GCS's message>``."""
    return f"{error.status} {error.message}".strip()


class CredentialsError(Exception):
    """The OAuth token for a request could not be had (its cause says why)."""

    def __init__(self, cause: BaseException) -> None:
        detail = str(cause).splitlines()[0] if str(cause) else ""
        super().__init__(f"cannot get Google credentials: {type(cause).__name__}: {detail}")
        self.cause = cause


def _transient(error: BaseException) -> str | None:
    if isinstance(error, CredentialsError):
        # A token endpoint out of reach or failing may come back; a refusal will not.
        cause = error.cause
        if isinstance(cause, aiohttp.ClientResponseError):
            return str(error) if cause.status in _RETRY_STATUSES or cause.status >= 500 else None
        return str(error) if isinstance(cause, aiohttp.ClientError | asyncio.TimeoutError) else None
    if _is_status_error(error):  # before ClientError, which it is
        if error.status in _RETRY_STATUSES or error.status >= 500:
            return _status_text(error)
        return None
    if isinstance(error, aiohttp.ClientError | asyncio.TimeoutError):
        return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return None


def _one_attempt_token(key: io.StringIO | None) -> Any:
    """``gcloud-aio-auth``'s :class:`Token` for ``key`` (None: the default credentials),
    asking the token endpoint once per request. Its own ``acquire_access_token`` retries five
    times, waiting up to a minute between tries, beneath :func:`call_with_retries`: a refused
    or unreachable endpoint took about 9 s per attempt of the shared policy to report (18 s
    with ``max_attempts=2``), and the retry policy is the shared one's alone to set."""
    from gcloud.aio.auth import Token

    class OneAttemptToken(Token):
        # The undecorated method (tenacity's decorator keeps it as ``__wrapped__``).
        acquire_access_token = getattr(
            Token.acquire_access_token, "__wrapped__", Token.acquire_access_token
        )

    return OneAttemptToken(service_file=key, scopes=_SCOPES)


def _millis(timestamp: str) -> int:
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)


class GcsStore(ObjectStore):
    """Objects under ``gs://bucket/prefix``. Polling is the only watch mechanism (Pub/Sub
    notifications can be relayed by the user: docs/object-stores.md, "Watching")."""

    def __init__(self, bucket: str, prefix: str = "", options: GcsOptions | None = None) -> None:
        super().__init__()
        if not bucket:
            raise InvalidArgumentError("a GCS URI needs a bucket: gs://bucket/path")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.options = options or GcsOptions()
        self.max_concurrency = self.options.max_concurrency
        self._session: aiohttp.ClientSession | None = None
        self._token: Any = None
        self._lock = anyio.Lock()
        self._closed = False
        #: Downloads carry no ``x-goog-generation`` (an emulator): get_tagged reads the
        #: metadata beside the bytes from then on.
        self._no_generation_header = False
        base = self.options.endpoint_url
        self._objects_url = f"{base}/storage/v1/b/{quote(bucket, safe='')}/o"
        self._upload_url = f"{base}/upload/storage/v1/b/{quote(bucket, safe='')}/o"

    def __repr__(self) -> str:
        return f"GcsStore({self.root_uri!r})"

    @property
    def root_uri(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}" if self.prefix else f"gs://{self.bucket}"

    def _name(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _object_url(self, key: str) -> str:
        return f"{self._objects_url}/{quote(self._name(key), safe='')}"

    # --- the client ---------------------------------------------------------------------

    async def _get_session(self) -> aiohttp.ClientSession:
        if self._session is not None:
            return self._session
        async with self._lock:
            if self._closed:
                raise StorageError(self.root_uri, "store is closed")
            if self._session is None:
                opts = self.options
                timeout = aiohttp.ClientTimeout(
                    sock_connect=opts.connect_timeout, sock_read=opts.read_timeout
                )
                connector = aiohttp.TCPConnector(limit=max(10, opts.max_concurrency))
                session = aiohttp.ClientSession(timeout=timeout, connector=connector)
                if opts.signed:
                    info = opts.service_account_info
                    key = io.StringIO(json.dumps(dict(info))) if info is not None else None
                    # The token keeps a session of its own for the OAuth exchange (closed below).
                    self._token = _one_attempt_token(key)
                self._session = session
        return self._session

    async def _headers(self) -> dict[str, str]:
        if self._token is None:
            return {}
        try:
            token = await self._token.get()
        except Exception as e:  # gcloud-aio-auth raises aiohttp's and plain exceptions
            raise CredentialsError(e) from e
        return {"Authorization": f"Bearer {token}"}

    async def aclose(self) -> None:
        async with self._lock:
            self._closed = True
            session, self._session = self._session, None
            token, self._token = self._token, None
        if token is not None:
            await token.close()
        if session is not None:
            await session.close()
        await self._close_foreign()

    async def _call(
        self, uri: str, operation: str, op: Callable[[aiohttp.ClientSession], Awaitable[T]]
    ) -> T:
        session = await self._get_session()

        async def attempt() -> T:
            return await op(session)

        try:
            return await self._with_retries(
                attempt,
                operation=operation,
                target=uri,
                policy=self.options.retry_policy,
                transient=_transient,
                logger=log,
            )
        except CredentialsError as e:
            raise StorageError(uri, f"{operation} failed: {e}") from e
        except aiohttp.ClientResponseError as e:
            if not _is_status_error(e):
                raise
            if e.status == 404:
                raise ObjectNotFoundError(uri) from e
            if e.status == 412:
                raise PreconditionFailedError(uri) from e
            if e.status in (401, 403):
                raise AccessDeniedError(
                    uri, f"{operation} failed after 1 attempt(s): {_status_text(e)}"
                ) from e
            raise StorageError(
                uri, f"{operation} failed after 1 attempt(s): {_status_text(e)}"
            ) from e

    async def _request(
        self,
        session: aiohttp.ClientSession,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
    ) -> tuple[bytes, Mapping[str, str], int]:
        all_headers = {**(await self._headers()), **(headers or {})}
        async with session.request(
            method, url, params=params, headers=all_headers, data=data
        ) as resp:
            body = await resp.read()
            if resp.status >= 400:
                raise _status_error(resp, body)
            expected = resp.content_length
            if method != "HEAD" and expected is not None and len(body) != expected:
                raise aiohttp.ClientPayloadError(
                    f"response ended after {len(body)} of {expected} bytes"
                )
            return body, resp.headers, resp.status

    # --- reads --------------------------------------------------------------------------

    async def list_from(
        self, directory: str, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        prefix = directory if not directory or directory.endswith("/") else directory + "/"
        full_prefix = self._name(prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        uri = self.uri_for(prefix)
        floor = self._name(start_after) if start_after is not None else None
        token: str | None = None
        while True:
            params = {"prefix": full_prefix, "delimiter": "/", "maxResults": str(PAGE_SIZE)}
            params["fields"] = "items(name,size,updated,generation),nextPageToken"
            if token is not None:
                params["pageToken"] = token
            elif floor is not None:
                params["startOffset"] = floor

            async def list_page(
                session: aiohttp.ClientSession, params: dict[str, str] = params
            ) -> Any:
                self.stats.list_requests += 1
                body, _, _ = await self._request(session, "GET", self._objects_url, params=params)
                return json.loads(body or b"{}")

            try:
                page = await self._call(uri, "LIST", list_page)
            except ObjectNotFoundError as e:
                raise StorageError(
                    uri, f"LIST failed: bucket {self.bucket!r} does not exist"
                ) from e
            for item in page.get("items", ()):
                name = item["name"]
                # startOffset is inclusive, and emulators ignore it: filter here too.
                if floor is not None and name <= floor:
                    continue
                key = name[len(self.prefix) + 1 :] if self.prefix else name
                if key == prefix:  # a "directory marker" object
                    continue
                yield ObjectMeta(
                    key=key,
                    size=int(item["size"]),
                    last_modified_ms=_millis(item["updated"]),
                    tag=str(item.get("generation", "")),
                )
            token = page.get("nextPageToken")
            if not token:
                return

    async def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        uri = self.uri_for(key)
        check_byte_range(uri, byte_range)
        if byte_range is not None and byte_range[0] == byte_range[1]:
            return b""
        headers = {}
        if byte_range is not None:
            headers["Range"] = f"bytes={byte_range[0]}-{byte_range[1] - 1}"

        async def fetch(session: aiohttp.ClientSession) -> bytes:
            self.stats.get_requests += 1
            body, _, _ = await self._request(
                session, "GET", self._object_url(key), params={"alt": "media"}, headers=headers
            )
            return body

        try:
            return await self._call(uri, "GET", fetch)
        except StorageError as e:
            if _is_status_error(e.__cause__) and e.__cause__.status == 416:
                return b""  # the range starts past the end: nothing there, as for local files
            raise

    async def _metadata(self, key: str) -> Any:
        """The object's metadata (JSON: ``generation``, ``size``, ``md5Hash``...)."""

        async def metadata(session: aiohttp.ClientSession) -> Any:
            self.stats.head_requests += 1
            body, _, _ = await self._request(session, "GET", self._object_url(key))
            return json.loads(body)

        return await self._call(self.uri_for(key), "HEAD", metadata)

    async def head(self, key: str) -> ObjectMeta:
        item = await self._metadata(key)
        return ObjectMeta(
            key=key,
            size=int(item["size"]),
            last_modified_ms=_millis(item["updated"]),
            tag=str(item["generation"]),
        )

    async def get_tagged(self, key: str) -> tuple[bytes, str]:
        uri = self.uri_for(key)

        async def fetch(session: aiohttp.ClientSession) -> tuple[bytes, str]:
            self.stats.get_requests += 1
            body, headers, _ = await self._request(
                session, "GET", self._object_url(key), params={"alt": "media"}
            )
            return body, headers.get("x-goog-generation", "")

        if not self._no_generation_header:
            data, generation = await self._call(uri, "GET", fetch)
            if generation:
                return data, generation
            # An emulator: it never sends one (GCS does, with every download).
            self._no_generation_header = True

        async def read(which: str) -> Any:
            if which == "media":
                return await self._call(uri, "GET", fetch)
            return await self._metadata(key)

        while True:
            # The bytes and the metadata at once (one round trip, not four in a row: a
            # record read is a hand-over's unit of work): the metadata's generation is the
            # bytes' when its MD5 is theirs, whichever write made them.
            (data, _), item = await self._gather(("media", "metadata"), read)
            md5 = item.get("md5Hash")
            if md5 == base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode():
                return data, str(item["generation"])
            if not md5:
                # No MD5 (a composite object): the generation a HEAD before and a HEAD
                # after a GET both report.
                before = (await self.head(key)).tag
                data, _ = await self._call(uri, "GET", fetch)
                if (await self.head(key)).tag == before:
                    return data, before
            # (Otherwise it changed between the two: read both again.)

    async def open_file(self, key: str, size: int | None = None) -> pa.NativeFile:
        return await open_remote_file(self, key, size)

    # --- writes -------------------------------------------------------------------------

    async def put(self, key: str, data: bytes, *, if_match: str | None = None) -> str:
        uri = self.uri_for(key)
        params = {"uploadType": "multipart"}
        if if_match is not None:
            params["ifGenerationMatch"] = if_match or "0"
        # A multipart upload (metadata, then the bytes) rather than a media one: the same
        # single request, and emulators store empty objects only this way.
        headers = {"Content-Type": f"multipart/related; boundary={_BOUNDARY}"}
        upload_body = _multipart(self._name(key), data)

        async def upload(session: aiohttp.ClientSession) -> str:
            self.stats.put_requests += 1
            answer, _, _ = await self._request(
                session, "POST", self._upload_url, params=params, headers=headers, data=upload_body
            )
            return str(json.loads(answer)["generation"])

        try:
            return await self._call(uri, "PUT", upload)
        except PreconditionFailedError:
            # A retried upload whose first attempt landed (its answer was lost) fails its
            # own precondition; the object then holds exactly these bytes.
            landed = None if if_match is None else await self._put_landed(key, data)
            if landed is None:
                raise
            return landed

    async def delete(self, key: str) -> None:
        async def remove(session: aiohttp.ClientSession) -> None:
            await self._request(session, "DELETE", self._object_url(key))

        with contextlib.suppress(ObjectNotFoundError):  # gone already: what was asked
            await self._call(self.uri_for(key), "DELETE", remove)

    def _store_at(self, root_uri: str) -> ObjectStore | None:
        # Objects in other buckets are read through a store at that bucket's root, sharing
        # this store's options and counters.
        parts = split_uri(root_uri)
        if parts.scheme not in GCS_SCHEMES or not parts.authority:
            return None
        bucket = parts.authority
        return self._foreign_store(bucket, lambda: GcsStore(bucket, "", self.options))


_BOUNDARY = "deltastream-7f3c2a9e5b1d4c68"


def _multipart(name: str, data: bytes) -> bytes:
    """A ``multipart/related`` upload body: the object's metadata, then its bytes."""
    metadata = json.dumps({"name": name, "contentType": "application/octet-stream"})
    return b"".join(
        (
            f"--{_BOUNDARY}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
            metadata.encode(),
            f"\r\n--{_BOUNDARY}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
            data,
            f"\r\n--{_BOUNDARY}--\r\n".encode(),
        )
    )


def _message(body: bytes) -> str:
    """GCS's error message from an error body (JSON ``{"error": {"message": …}}``)."""
    if not body:
        return ""
    try:
        error = json.loads(body).get("error", {})
        return str(error.get("message", "")) if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError):
        # Not GCS's JSON (a proxy's page, say): its text, on one line.
        return " ".join(body[:300].decode("utf-8", "replace").split())
