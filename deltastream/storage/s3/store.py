"""The S3 store (:class:`S3Store`) and its request and retry core.

The client is created lazily on first use and closed by :meth:`S3Store.aclose`. Requests are
retried here (botocore's own retries are switched off so that there is exactly one
policy): throttling (``503 SlowDown`` and friends), any 5xx and connection errors are retried
with exponential backoff and full jitter (:func:`~deltastream.storage.retry.backoff_delay`),
up to ``max_attempts`` attempts; anything else fails at once. Every retry is reported to the
store's ``retry_listener`` (operation, URI, cause, attempt, delay) or, without one, logged at
WARNING.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import aiohttp
import anyio
import botocore.exceptions
import pyarrow as pa

from deltastream.errors import (
    AccessDeniedError,
    InvalidArgumentError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
)
from deltastream.storage.base import (
    ChangeFeed,
    ObjectMeta,
    ObjectStore,
    check_byte_range,
)
from deltastream.storage.paths import S3_SCHEMES, split_uri
from deltastream.storage.ranged import open_remote_file
from deltastream.storage.s3.client import open_client, shared_client
from deltastream.storage.s3.feed import SqsChangeFeed
from deltastream.storage.s3.options import S3Options

#: The logger of :mod:`deltastream.storage.s3` as a whole (its name predates the package).
log = logging.getLogger("deltastream.storage.s3")

T = TypeVar("T")

_THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "TooManyRequestsException",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
    }
)

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})

_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ConnectionError,
    botocore.exceptions.IncompleteReadError,
    aiohttp.ClientError,
    TimeoutError,
)


class _RangeNotSatisfiableError(Exception):
    """A ranged GET asked for bytes starting after the end of the object."""


def _error_code(err: botocore.exceptions.ClientError) -> tuple[str, int]:
    code = str(err.response.get("Error", {}).get("Code", ""))
    status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def _transient_cause(err: BaseException) -> str | None:
    """The cause of a failed S3 or SQS request in one line, if trying again may help."""
    if not is_retryable(err):
        return None
    if isinstance(err, botocore.exceptions.ClientError):
        code, status = _error_code(err)
        # A HEAD's error has no body: botocore's code is then just the status.
        return f"{status} {code}" if status and code != str(status) else code or str(status)
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def is_retryable(err: BaseException) -> bool:
    """Whether a failed S3 or SQS request may succeed if simply tried again."""
    if isinstance(err, botocore.exceptions.ClientError):
        code, status = _error_code(err)
        return code in _THROTTLE_CODES or status >= 500 or status == 429
    return isinstance(err, _CONNECTION_ERRORS)


class S3Store(ObjectStore):
    """Objects under ``s3://bucket/prefix``.

    :meth:`watch` offers change feeds when the options name an SQS queue
    (:class:`S3Options`, ``sqs_queue_url``).
    """

    def __init__(self, bucket: str, prefix: str = "", options: S3Options | None = None) -> None:
        super().__init__()
        if not bucket:
            raise InvalidArgumentError("an S3 URI needs a bucket: s3://bucket/path")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.options = options or S3Options()
        self.max_concurrency = self.options.max_concurrency
        self._client: Any = None
        self._sqs_client: Any = None
        self._releases: list[Callable[[], Awaitable[None]]] = []
        self._client_lock = anyio.Lock()
        self._closed = False
        self._feeds: set[ChangeFeed] = set()

    @property
    def root_uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def full_key(self, key: str) -> str:
        """The bucket's key of ``key`` (relative to the store's root)."""
        return f"{self.prefix}/{key}" if self.prefix else key

    def _relative_key(self, full_key: str) -> str:
        return full_key[len(self.prefix) + 1 :] if self.prefix else full_key

    async def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._client_lock:
            if self._closed:
                raise StorageError(self.root_uri, "store is closed")
            if self._client is None:
                self._client = await self._open_client("s3")
        return self._client

    async def _get_sqs_client(self) -> Any:
        if self._sqs_client is not None:
            return self._sqs_client
        async with self._client_lock:
            if self._closed:
                raise StorageError(self.root_uri, "store is closed")
            if self._sqs_client is None:
                self._sqs_client = await self._open_client("sqs")
        return self._sqs_client

    async def _open_client(self, service: str) -> Any:
        """The client for ``service`` ("s3" or "sqs"), shared with the other stores of this
        event loop that have the same options, released by :meth:`aclose`. The caller holds
        the client lock."""
        if service == "sqs":
            # Not shared: each feed long-polls on its own connections.
            stack = AsyncExitStack()
            client = await open_client(self.options, service, stack)
            self._releases.append(stack.aclose)
            return client
        client, release = await shared_client(self.options, service)
        self._releases.append(release)
        return client

    async def watch(self, directory: str) -> ChangeFeed | None:
        """A feed woken by the ``sqs_queue_url`` queue's event notifications for objects
        created directly in ``directory``; None without that option. Notifications for
        other keys (and S3's test event, and messages that are no S3 event at all) are
        deleted from the queue and otherwise ignored."""
        queue_url = self.options.sqs_queue_url
        if queue_url is None:
            return None
        prefix = directory if not directory or directory.endswith("/") else directory + "/"
        await self._get_sqs_client()  # a closed store fails here, not in the feed
        feed = SqsChangeFeed(self, prefix, queue_url, on_close=self._feeds.discard)
        self._feeds.add(feed)
        return feed

    async def aclose(self) -> None:
        for feed in list(self._feeds):
            await feed.aclose()
        async with self._client_lock:
            self._closed = True
            releases, self._releases = self._releases, []
            self._client = self._sqs_client = None
        for release in releases:
            await release()
        await self._close_foreign()

    async def sqs_request(
        self,
        uri: str,
        what: str,
        op: Callable[[Any], Awaitable[T]],
        *,
        operation: str,
        on_retry: Callable[[], None] | None = None,
    ) -> T:
        """Run ``op(client)`` on this store's SQS client, with its retries (what its change
        feeds ask of the ``sqs_queue_url`` queue). ``uri`` and ``what`` name the request in
        errors, ``operation`` in retry reports; ``on_retry()`` is called before each retry."""
        return await self._call(
            uri, what, op, service="sqs", operation=operation, on_retry=on_retry
        )

    async def _call(
        self,
        uri: str,
        what: str,
        op: Callable[[Any], Awaitable[T]],
        *,
        service: str = "s3",
        operation: str | None = None,
        on_retry: Callable[[], None] | None = None,
    ) -> T:
        """Run ``op(client)`` with the shared retry policy, on this store's S3 client or
        (``service`` "sqs") its SQS client. ``what`` names the request in errors;
        ``operation`` (default ``what``: ``GET``, ``PUT``, ``LIST``…) names it in retry
        reports."""
        opts = self.options
        client = await (self._get_client() if service == "s3" else self._get_sqs_client())

        async def attempt() -> T:
            try:
                return await op(client)
            except botocore.exceptions.ClientError as e:
                if service == "s3":
                    self._raise_s3_meaning(uri, what, e)
                if not is_retryable(e):
                    code, status = _error_code(e)
                    raise StorageError(
                        uri, f"{what} failed after 1 attempt(s): {code or status}: {e}"
                    ) from e
                raise
            except botocore.exceptions.NoCredentialsError as e:
                raise StorageError(uri, f"{what} failed: no AWS credentials found") from e

        return await self._with_retries(
            attempt,
            operation=operation or what,
            target=uri,
            policy=opts.retry_policy,
            transient=_transient_cause,
            logger=log,
            on_retry=on_retry,
        )

    def _raise_s3_meaning(self, uri: str, what: str, e: botocore.exceptions.ClientError) -> None:
        """Raise what an S3 error means for the object at ``uri``, if it means something
        more than a failed request."""
        code, status = _error_code(e)
        if code == "NoSuchBucket":
            raise StorageError(
                uri, f"{what} failed: NoSuchBucket: bucket {self.bucket!r} does not exist"
            ) from e
        if code in _NOT_FOUND_CODES or status == 404:
            raise ObjectNotFoundError(uri) from e
        if code == "InvalidRange" or status == 416:
            raise _RangeNotSatisfiableError() from e
        if code == "PreconditionFailed" or status == 412:
            raise PreconditionFailedError(uri) from e
        if status in (401, 403):
            raise AccessDeniedError(
                uri, f"{what} failed after 1 attempt(s): {code or status}: {e}"
            ) from e

    async def list_from(
        self, directory: str, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        prefix = directory if not directory or directory.endswith("/") else directory + "/"
        full_prefix = self.full_key(prefix)
        token: str | None = None
        uri = self.uri_for(prefix)
        while True:
            kwargs: dict[str, Any] = {
                "Bucket": self.bucket,
                "Prefix": full_prefix,
                "Delimiter": "/",
            }
            if token is not None:
                kwargs["ContinuationToken"] = token
            elif start_after is not None:
                kwargs["StartAfter"] = self.full_key(start_after)

            async def list_page(client: Any, kwargs: dict[str, Any] = kwargs) -> Any:
                self.stats.list_requests += 1
                return await client.list_objects_v2(**kwargs)

            page = await self._call(uri, "LIST", list_page)
            for obj in page.get("Contents", ()):
                key = self._relative_key(obj["Key"])
                if key == prefix:  # a "directory marker" object
                    continue
                yield ObjectMeta(
                    key=key,
                    size=int(obj["Size"]),
                    last_modified_ms=int(obj["LastModified"].timestamp() * 1000),
                    tag=str(obj.get("ETag", "")),
                )
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")
            if not token:
                raise StorageError(uri, "LIST response is truncated but has no continuation token")

    async def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        uri = self.uri_for(key)
        check_byte_range(uri, byte_range)
        if byte_range is not None and byte_range[0] == byte_range[1]:
            return b""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.full_key(key)}
        if byte_range is not None:
            kwargs["Range"] = f"bytes={byte_range[0]}-{byte_range[1] - 1}"

        async def fetch(client: Any) -> bytes:
            self.stats.get_requests += 1
            resp = await client.get_object(**kwargs)
            async with resp["Body"] as body:
                data: bytes = await body.read()
            expected = resp.get("ContentLength")
            if expected is not None and len(data) != int(expected):
                raise botocore.exceptions.IncompleteReadError(
                    actual_bytes=len(data), expected_bytes=int(expected)
                )
            return data

        try:
            return await self._call(uri, "GET", fetch)
        except _RangeNotSatisfiableError:
            # The range starts past the end of the object: nothing there, as for local files.
            return b""

    async def get_tagged(self, key: str) -> tuple[bytes, str]:
        uri = self.uri_for(key)

        async def fetch(client: Any) -> tuple[bytes, str]:
            self.stats.get_requests += 1
            resp = await client.get_object(Bucket=self.bucket, Key=self.full_key(key))
            async with resp["Body"] as body:
                data: bytes = await body.read()
            return data, str(resp.get("ETag", ""))

        return await self._call(uri, "GET", fetch)

    async def put(self, key: str, data: bytes, *, if_match: str | None = None) -> str:
        uri = self.uri_for(key)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.full_key(key), "Body": data}
        if if_match == "":
            kwargs["IfNoneMatch"] = "*"
        elif if_match is not None:
            kwargs["IfMatch"] = if_match

        async def put_object(client: Any) -> Any:
            self.stats.put_requests += 1
            return await client.put_object(**kwargs)

        try:
            resp = await self._call(uri, "PUT", put_object)
        except ObjectNotFoundError as e:
            # S3 answers If-Match on a missing object with 404: the tag no longer holds.
            raise PreconditionFailedError(uri, "no longer exists") from e
        except PreconditionFailedError:
            # A retried PUT whose first attempt did land (its response was lost) fails its
            # own precondition; the object then holds exactly these bytes.
            try:
                current = await self.head(key)
            except ObjectNotFoundError:
                current = None
            if current is not None and current.tag.strip('"') == hashlib.md5(data).hexdigest():
                return current.tag
            raise
        return str(resp.get("ETag", ""))

    async def delete(self, key: str) -> None:
        uri = self.uri_for(key)

        async def delete_object(client: Any) -> Any:
            return await client.delete_object(Bucket=self.bucket, Key=self.full_key(key))

        await self._call(uri, "DELETE", delete_object)

    async def open_file(self, key: str, size: int | None = None) -> pa.NativeFile:
        return await open_remote_file(self, key, size)

    def _store_at(self, root_uri: str) -> ObjectStore | None:
        # Objects outside the prefix are read through a store at their bucket's root,
        # sharing this store's options and counters.
        parts = split_uri(root_uri)
        if parts.scheme not in S3_SCHEMES or not parts.authority:
            return None
        bucket = parts.authority
        return self._foreign_store(bucket, lambda: S3Store(bucket, "", self.options))

    async def head(self, key: str) -> ObjectMeta:
        uri = self.uri_for(key)

        async def head_object(client: Any) -> Any:
            self.stats.head_requests += 1
            return await client.head_object(Bucket=self.bucket, Key=self.full_key(key))

        resp = await self._call(uri, "HEAD", head_object)
        return ObjectMeta(
            key=key,
            size=int(resp["ContentLength"]),
            last_modified_ms=int(resp["LastModified"].timestamp() * 1000),
            tag=str(resp.get("ETag", "")),
        )
