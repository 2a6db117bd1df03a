"""S3 object store over aiobotocore.

The client is created lazily on first use and closed by :meth:`S3Store.aclose`. Requests are
retried by this module (botocore's own retries are switched off so that there is exactly one
policy): throttling (``503 SlowDown`` and friends), any 5xx and connection errors are retried
with exponential backoff and full jitter (:func:`~deltastream.storage.retry.backoff_delay`),
up to ``max_attempts`` attempts; anything else fails at once. Every retry is reported to the
store's ``retry_listener`` (operation, URI, cause, attempt, delay) or, without one, logged at
WARNING.

With the ``sqs_queue_url`` option, :meth:`S3Store.watch` offers a change feed: it long-polls
an SQS queue that receives the bucket's ``s3:ObjectCreated:*`` event notifications (sent by
S3 directly or through SNS) and wakes when a new object is directly in the watched directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote, unquote_plus, urlsplit

import aiohttp
import anyio
import anyio.from_thread
import anyio.lowlevel
import botocore.exceptions
import pyarrow as pa
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from deltastream.errors import (
    InvalidArgumentError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
)
from deltastream.storage.base import (
    ChangeFeed,
    ObjectMeta,
    ObjectStore,
    SignalledChangeFeed,
    check_byte_range,
)
from deltastream.storage.retry import RetryEvent, backoff_delay

__all__ = ["STORAGE_OPTION_NAMES", "S3Options", "S3Store"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Option names users may pass, mapped to S3Options fields. The AWS_* spellings match the
# environment variables and delta-rs's storage options, so one options dict serves both.
_OPTION_ALIASES: dict[str, str] = {
    "endpoint_url": "endpoint_url",
    "endpoint": "endpoint_url",
    "aws_endpoint_url": "endpoint_url",
    "aws_endpoint": "endpoint_url",
    "region": "region",
    "region_name": "region",
    "aws_region": "region",
    "aws_default_region": "region",
    "access_key_id": "access_key_id",
    "aws_access_key_id": "access_key_id",
    "secret_access_key": "secret_access_key",
    "aws_secret_access_key": "secret_access_key",
    "session_token": "session_token",
    "aws_session_token": "session_token",
    "profile": "profile",
    "aws_profile": "profile",
    "addressing_style": "addressing_style",
    "aws_virtual_hosted_style_request": "virtual_hosted_style",
    "virtual_hosted_style_request": "virtual_hosted_style",
    "max_attempts": "max_attempts",
    "retry_base_delay": "retry_base_delay",
    "retry_max_delay": "retry_max_delay",
    "connect_timeout": "connect_timeout",
    "read_timeout": "read_timeout",
    "max_concurrency": "max_concurrency",
    "sqs_queue_url": "sqs_queue_url",
    "aws_sqs_queue_url": "sqs_queue_url",
    # Accepted for compatibility with delta-rs option dicts; they change nothing here.
    "aws_allow_http": "_ignored",
    "allow_http": "_ignored",
    "aws_s3_allow_unsafe_rename": "_ignored",
    "aws_conditional_put": "_ignored",
}

#: Every storage option name :meth:`S3Options.from_storage_options` accepts (lower case).
STORAGE_OPTION_NAMES: frozenset[str] = frozenset(_OPTION_ALIASES)

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


#: Seconds one SQS ReceiveMessage long poll may wait for a message (SQS allows 0 to 20).
_SQS_WAIT_SECONDS = 20
#: Messages one ReceiveMessage may return, and one DeleteMessageBatch may delete (both: 10).
_SQS_BATCH = 10
_SQS_REGION = re.compile(
    r"^(?:sqs\.(?P<a>[a-z0-9-]+)\.amazonaws\.com|(?P<b>[a-z0-9-]+)\.queue\.amazonaws\.com)"
    r"(?:\.cn)?$"
)

#: Objects up to this size are fetched with one GET when opened for random access.
_WHOLE_OBJECT_LIMIT = 8 << 20
#: Minimum size of each ranged GET of a larger object (reads ahead for sequential readers).
_READ_AHEAD = 4 << 20


class _RangedObject(io.RawIOBase):
    """A read-only, seekable file over one S3 object, fetched by ranged GETs.

    Used by pyarrow's (synchronous) parquet reader from worker threads, its own included:
    every read hands the GET back to the event loop the file was opened on.
    """

    def __init__(self, store: S3Store, key: str, size: int) -> None:
        super().__init__()
        self._store, self._key, self._size = store, key, size
        self._loop = anyio.lowlevel.current_token()
        self._lock = threading.Lock()
        self._pos = 0
        self._buffer = b""
        self._buffer_start = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, n: int = -1) -> bytes:
        with self._lock:
            return self._read(n)

    def _read(self, n: int) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        if end <= self._pos:
            return b""
        buffered_end = self._buffer_start + len(self._buffer)
        if not (self._buffer_start <= self._pos and end <= buffered_end):
            fetch_end = min(self._size, max(end, self._pos + _READ_AHEAD))
            self._buffer = anyio.from_thread.run(
                self._store.get, self._key, (self._pos, fetch_end), token=self._loop
            )
            self._buffer_start = self._pos
        start = self._pos - self._buffer_start
        data = self._buffer[start : start + (end - self._pos)]
        self._pos += len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


class _RangeNotSatisfiableError(Exception):
    """A ranged GET asked for bytes starting after the end of the object."""


@dataclass(frozen=True)
class S3Options:
    """Connection and retry settings for :class:`S3Store`.

    Credentials left unset fall back to the standard AWS chain (environment, shared config
    and credentials files, container and instance metadata).

    ``sqs_queue_url`` (storage option ``sqs_queue_url`` or ``AWS_SQS_QUEUE_URL``, any case) is
    the URL of an SQS queue that receives the bucket's ``s3:ObjectCreated:*`` event
    notifications, directly or through an SNS topic; :meth:`S3Store.watch` long-polls it. It is
    reached with the same credentials, ``endpoint_url`` (so one local emulator serves both)
    and region (when ``region`` is unset, the one in an AWS queue URL). The feed deletes every
    message it receives, events for other keys included: give each watching process a queue
    of its own (an SNS topic fans the bucket's events out to several queues).
    """

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    profile: str | None = None
    addressing_style: str | None = None
    max_attempts: int = 10
    #: Retry ``n`` waits ``uniform(0, min(retry_max_delay, retry_base_delay * 2**(n - 1)))``
    #: seconds (:func:`~deltastream.storage.retry.backoff_delay`).
    retry_base_delay: float = 0.1
    retry_max_delay: float = 5.0
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    max_concurrency: int = 32
    sqs_queue_url: str | None = None

    @classmethod
    def from_storage_options(cls, options: Mapping[str, str] | None) -> S3Options:
        """Build options from a ``storage_options`` mapping (keys are case-insensitive)."""
        values: dict[str, Any] = {}
        for raw_key, raw_value in (options or {}).items():
            key = _OPTION_ALIASES.get(raw_key.lower())
            if key is None:
                known = ", ".join(sorted(k for k, v in _OPTION_ALIASES.items() if v != "_ignored"))
                raise InvalidArgumentError(
                    f"unknown S3 storage option {raw_key!r}; known options: {known}"
                )
            if key == "_ignored":
                continue
            value = str(raw_value)
            if key == "virtual_hosted_style":
                values["addressing_style"] = "virtual" if _truthy(value) else "path"
            elif key in ("max_attempts", "max_concurrency"):
                values[key] = _parse_number(raw_key, value, int)
                if values[key] < 1:
                    raise InvalidArgumentError(f"storage option {raw_key!r} must be >= 1")
            elif key in ("retry_base_delay", "retry_max_delay", "connect_timeout", "read_timeout"):
                values[key] = _parse_number(raw_key, value, float)
            else:
                values[key] = value
        style = values.get("addressing_style")
        if style is not None and style not in ("path", "virtual", "auto"):
            raise InvalidArgumentError(
                f"storage option 'addressing_style' must be path, virtual or auto, not {style!r}"
            )
        queue = values.get("sqs_queue_url")
        if queue is not None and not re.match(r"^https?://[^/]+/.", queue):
            raise InvalidArgumentError(
                f"storage option 'sqs_queue_url' must be a queue URL such as "
                f"https://sqs.us-east-1.amazonaws.com/123456789012/name, not {queue!r}"
            )
        return cls(**values)


# botocore's data loader (the parsed service models) is the costly part of creating a
# client, and it is plain cached data: share it between all clients of the process.
_shared_loader: Any = None


def _new_session() -> Any:
    global _shared_loader
    session = get_session()
    if _shared_loader is None:
        _shared_loader = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _shared_loader)
    return session


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def _parse_number(name: str, value: str, kind: Callable[[str], T]) -> T:
    try:
        return kind(value)
    except ValueError as e:
        raise InvalidArgumentError(f"storage option {name!r}: {value!r} is not a number") from e


def _error_code(err: botocore.exceptions.ClientError) -> tuple[str, int]:
    code = str(err.response.get("Error", {}).get("Code", ""))
    status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def _queue_region(queue_url: str) -> str | None:
    """The region named by an AWS SQS queue URL's host, if it names one."""
    match = _SQS_REGION.match(urlsplit(queue_url).hostname or "")
    return (match.group("a") or match.group("b")) if match else None


def _created_objects(body: str) -> list[tuple[str, str]] | str:
    """The ``(bucket, key)`` of each object an S3 event notification says was created (keys
    decoded), or why the message is not such a notification. The notification may come as
    sent by S3 or wrapped in an SNS envelope."""
    try:
        event = json.loads(body)
        if (
            isinstance(event, dict)
            and event.get("Type") == "Notification"
            and isinstance(event.get("Message"), str)
        ):
            event = json.loads(event["Message"])
    except ValueError:
        return "not JSON"
    if not isinstance(event, dict):
        return "not an S3 event notification"
    if event.get("Event") == "s3:TestEvent":
        return "S3 test event"
    records = event.get("Records")
    if not isinstance(records, list):
        return "not an S3 event notification"
    created: list[tuple[str, str]] = []
    for record in records:
        try:
            name, s3 = record["eventName"], record["s3"]
            bucket, key = s3["bucket"]["name"], s3["object"]["key"]
        except (KeyError, TypeError):
            continue
        if not (isinstance(name, str) and isinstance(bucket, str) and isinstance(key, str)):
            continue
        if name.removeprefix("s3:").startswith("ObjectCreated:"):
            # Event keys are URL-encoded as in a form: "+" is a space, "%2B" a plus sign.
            created.append((bucket, unquote_plus(key)))
    return created


def is_retryable(err: BaseException) -> bool:
    """Whether a failed S3 or SQS request may succeed if simply tried again."""
    if isinstance(err, botocore.exceptions.ClientError):
        code, status = _error_code(err)
        return code in _THROTTLE_CODES or status >= 500 or status == 429
    return isinstance(err, _CONNECTION_ERRORS)


class _SqsChangeFeed(SignalledChangeFeed):
    """Wakes when the store's SQS queue reports an object created directly in one directory.

    A background task long-polls the queue from the moment the feed opens until it closes
    (a cancelled :meth:`wait` cancels no request, so no received message is lost) and
    deletes every message it receives. Errors are retried like every request of the store;
    one that persists fails the feed.
    """

    def __init__(self, store: S3Store, directory: str, queue_url: str) -> None:
        super().__init__(store.uri_for(directory))
        self._store = store
        self._queue_url = queue_url
        self._prefix = store._full_key(directory)
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"deltastream-watch:{self.uri}"
        )

    def _wakes(self, message: Mapping[str, Any]) -> bool:
        """Whether the message reports a new object directly in the watched directory."""
        message_id = message.get("MessageId", "?")
        created = _created_objects(str(message.get("Body", "")))
        if isinstance(created, str):
            log.debug("ignoring SQS message %s from %s: %s", message_id, self._queue_url, created)
            return False
        for bucket, key in created:
            name = key[len(self._prefix) :]
            # An empty name is the directory's own marker object, not an object in it.
            in_directory = key.startswith(self._prefix) and name and "/" not in name
            if bucket == self._store.bucket and in_directory:
                return True
        log.debug("SQS message %s: no new object in %s", message_id, self.uri)
        return False

    async def _run(self) -> None:
        queue = self._queue_url

        async def receive(client: Any) -> Any:
            return await client.receive_message(
                QueueUrl=queue, MaxNumberOfMessages=_SQS_BATCH, WaitTimeSeconds=_SQS_WAIT_SECONDS
            )

        try:
            while True:
                response = await self._store._call(
                    self.uri,
                    f"SQS ReceiveMessage from {queue}",
                    receive,
                    service="sqs",
                    operation="SQS ReceiveMessage",
                )
                messages: list[dict[str, Any]] = response.get("Messages") or []
                # Every message is looked at (and logged) before waking the waiter.
                if any([self._wakes(m) for m in messages]):
                    self._signal()
                if messages:
                    await self._delete(messages)
        except StorageError as e:
            log.debug("change feed for %s failed: %s", self.uri, e)
            self._fail(e.problem, e)
        except Exception as e:  # a bug: fail the feed rather than lose it in a dead task
            log.exception("change feed for %s failed", self.uri)
            self._fail(f"change feed failed: {type(e).__name__}: {e}", e)

    async def _delete(self, messages: list[dict[str, Any]]) -> None:
        entries = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
        ]

        async def delete(client: Any) -> Any:
            return await client.delete_message_batch(QueueUrl=self._queue_url, Entries=entries)

        response = await self._store._call(
            self.uri,
            f"SQS DeleteMessageBatch on {self._queue_url}",
            delete,
            service="sqs",
            operation="SQS DeleteMessageBatch",
        )
        for failed in response.get("Failed") or ():
            # Such a message comes back after its visibility timeout: one spurious wake-up.
            log.warning(
                "could not delete a message from %s: %s: %s",
                self._queue_url,
                failed.get("Code"),
                failed.get("Message"),
            )

    async def aclose(self) -> None:
        if not self.closed:
            self._store._feeds.discard(self)
            self._task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait([self._task])
        await super().aclose()


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
        self._stack: AsyncExitStack | None = None
        self._client_lock = anyio.Lock()
        self._closed = False
        self._foreign: dict[str, S3Store] = {}
        self._feeds: set[ChangeFeed] = set()

    @property
    def root_uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def _full_key(self, key: str) -> str:
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
        """A new client for ``service`` ("s3" or "sqs"), closed by :meth:`aclose`. The caller
        holds the client lock."""
        opts = self.options
        session = _new_session()
        if opts.profile:
            session.set_config_variable("profile", opts.profile)
        region = opts.region
        if service == "s3":
            s3_config: dict[str, str] = {}
            if opts.addressing_style:
                s3_config["addressing_style"] = opts.addressing_style
            elif opts.endpoint_url:
                s3_config["addressing_style"] = "path"
            config = AioConfig(
                retries={"total_max_attempts": 1, "mode": "standard"},
                connect_timeout=opts.connect_timeout,
                read_timeout=opts.read_timeout,
                max_pool_connections=max(10, opts.max_concurrency),
                s3=s3_config or None,
            )
        else:
            if region is None and opts.sqs_queue_url:
                region = _queue_region(opts.sqs_queue_url)
            config = AioConfig(
                retries={"total_max_attempts": 1, "mode": "standard"},
                connect_timeout=opts.connect_timeout,
                # A long poll legitimately answers only after its wait time.
                read_timeout=max(opts.read_timeout, _SQS_WAIT_SECONDS + 10),
                max_pool_connections=4,
            )
        if self._stack is None:
            self._stack = AsyncExitStack()
        return await self._stack.enter_async_context(
            session.create_client(
                service,
                region_name=region,
                endpoint_url=opts.endpoint_url,
                aws_access_key_id=opts.access_key_id,
                aws_secret_access_key=opts.secret_access_key,
                aws_session_token=opts.session_token,
                config=config,
            )
        )

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
        feed = _SqsChangeFeed(self, prefix, queue_url)
        self._feeds.add(feed)
        return feed

    async def aclose(self) -> None:
        for feed in list(self._feeds):
            await feed.aclose()
        async with self._client_lock:
            self._closed = True
            stack, self._stack = self._stack, None
            self._client = self._sqs_client = None
        if stack is not None:
            await stack.aclose()
        foreign, self._foreign = list(self._foreign.values()), {}
        for store in foreign:
            await store.aclose()

    async def _call(
        self,
        uri: str,
        what: str,
        op: Callable[[Any], Awaitable[T]],
        *,
        service: str = "s3",
        operation: str | None = None,
    ) -> T:
        """Run ``op(client)`` with this store's retry policy, on its S3 client or (``service``
        "sqs") its SQS client. ``what`` names the request in errors; ``operation`` (default
        ``what``: ``GET``, ``PUT``, ``LIST``…) names it in retry reports."""
        opts = self.options
        client = await (self._get_client() if service == "s3" else self._get_sqs_client())
        attempt = 0
        while True:
            attempt += 1
            try:
                return await op(client)
            except botocore.exceptions.ClientError as e:
                code, status = _error_code(e)
                if service == "s3":
                    self._raise_s3_meaning(uri, what, e)
                if not is_retryable(e) or attempt >= opts.max_attempts:
                    raise StorageError(
                        uri, f"{what} failed after {attempt} attempt(s): {code or status}: {e}"
                    ) from e
                # A HEAD's error has no body: botocore's code is then just the status.
                reason = (
                    f"{status} {code}" if status and code != str(status) else code or str(status)
                )
            except _CONNECTION_ERRORS as e:
                if attempt >= opts.max_attempts:
                    raise StorageError(
                        uri, f"{what} failed after {attempt} attempt(s): {type(e).__name__}: {e}"
                    ) from e
                reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            except botocore.exceptions.NoCredentialsError as e:
                raise StorageError(uri, f"{what} failed: no AWS credentials found") from e
            # The retry policy's formula is base * 2**(attempt - 1): the same delays as this
            # store's former base * 2**attempt with its default base doubled (0.05 -> 0.1 s).
            delay = backoff_delay(attempt, opts.retry_base_delay, opts.retry_max_delay)
            self.stats.retries += 1
            event = RetryEvent(operation or what, uri, attempt, reason, delay)
            listener = self.retry_listener
            if listener is not None:
                listener(event)
            else:
                log.warning(
                    "%s %s failed (%s); retry %d in %.2fs",
                    event.operation,
                    uri,
                    reason,
                    attempt,
                    delay,
                )
            await anyio.sleep(delay)

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

    async def list_from(
        self, directory: str, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        prefix = directory if not directory or directory.endswith("/") else directory + "/"
        full_prefix = self._full_key(prefix)
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
                kwargs["StartAfter"] = self._full_key(start_after)

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
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full_key(key)}
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
            resp = await client.get_object(Bucket=self.bucket, Key=self._full_key(key))
            async with resp["Body"] as body:
                data: bytes = await body.read()
            return data, str(resp.get("ETag", ""))

        return await self._call(uri, "GET", fetch)

    async def put(self, key: str, data: bytes, *, if_match: str | None = None) -> str:
        uri = self.uri_for(key)
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full_key(key), "Body": data}
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
            return await client.delete_object(Bucket=self.bucket, Key=self._full_key(key))

        await self._call(uri, "DELETE", delete_object)

    async def open_file(self, key: str, size: int | None = None) -> pa.NativeFile:
        """Small objects are downloaded whole (one request); larger ones are read with ranged
        GETs as the reader asks for them, so memory holds only what is being decoded."""
        if size is None:
            size = (await self.head(key)).size
        if size <= _WHOLE_OBJECT_LIMIT:
            return pa.BufferReader(await self.get(key))
        return pa.PythonFile(_RangedObject(self, key, size), mode="r")

    def _resolve_absolute(self, path: str) -> tuple[ObjectStore, str]:
        scheme, _, rest = path.partition("://")
        if scheme.lower() not in ("s3", "s3a") or not rest:
            return super()._resolve_absolute(path)
        bucket, _, key = rest.partition("/")
        key = unquote(key)
        if bucket == self.bucket and (not self.prefix or key.startswith(self.prefix + "/")):
            return self, self._relative_key(key)
        other = self._foreign.get(bucket)
        if other is None:
            other = S3Store(bucket, "", self.options)
            other.stats = self.stats
            self._foreign[bucket] = other
        # Its retries are this store's: whoever listens here hears them too.
        other.retry_listener = self.retry_listener
        return other, key

    async def head(self, key: str) -> ObjectMeta:
        uri = self.uri_for(key)

        async def head_object(client: Any) -> Any:
            self.stats.head_requests += 1
            return await client.head_object(Bucket=self.bucket, Key=self._full_key(key))

        resp = await self._call(uri, "HEAD", head_object)
        return ObjectMeta(
            key=key,
            size=int(resp["ContentLength"]),
            last_modified_ms=int(resp["LastModified"].timestamp() * 1000),
            tag=str(resp.get("ETag", "")),
        )
