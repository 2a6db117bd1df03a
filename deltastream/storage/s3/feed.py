"""The S3 store's change feed, woken by an SQS queue of S3 event notifications.

With the ``sqs_queue_url`` option, :meth:`S3Store.watch` offers a change feed: woken when the
SQS queue receiving the bucket's ``s3:ObjectCreated:*`` event notifications (sent by S3
directly or through SNS) reports a new object directly in the watched directory. One reader
per queue long-polls it for all the feeds of an event loop (many tables, one queue).
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import unquote_plus

import anyio

from deltastream.errors import StorageError
from deltastream.storage.base import SignalledChangeFeed
from deltastream.storage.s3.client import SQS_WAIT_SECONDS

if TYPE_CHECKING:
    from deltastream.storage.s3.options import S3Options

T = TypeVar("T")

#: The logger of :mod:`deltastream.storage.s3` as a whole (its name predates the package).
log = logging.getLogger("deltastream.storage.s3")

#: Messages one ReceiveMessage may return, and one DeleteMessageBatch may delete (both: 10).
_SQS_BATCH = 10


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


class FeedStore(Protocol):
    """What a feed uses of its store (:class:`~deltastream.storage.s3.store.S3Store`, which
    makes the feeds: this module does not import it)."""

    @property
    def bucket(self) -> str: ...

    @property
    def options(self) -> S3Options: ...

    def uri_for(self, key: str) -> str: ...

    def full_key(self, key: str) -> str: ...

    async def sqs_request(
        self,
        uri: str,
        what: str,
        op: Callable[[Any], Awaitable[T]],
        *,
        operation: str,
        on_retry: Callable[[], None] | None = None,
    ) -> T: ...


class SqsChangeFeed(SignalledChangeFeed):
    """Wakes when the store's SQS queue reports an object created directly in one directory.

    Every feed of an event loop on one queue (and with the same store options) is served by
    one :class:`_QueueReader`: a message goes to one receiver, so feeds reading a shared
    queue each on their own would take each other's messages, and a thousand tables would
    hold a thousand long polls.
    """

    def __init__(
        self,
        store: FeedStore,
        directory: str,
        queue_url: str,
        *,
        on_close: Callable[[SqsChangeFeed], None],
    ) -> None:
        super().__init__(store.uri_for(directory))
        self._store = store
        self._queue_url = queue_url
        self._prefix = store.full_key(directory)
        self._on_close = on_close  # the store forgets the feed
        self._reader = _QueueReader.of(store, queue_url)
        self._reader.subscribe(self)

    @property
    def _task(self) -> asyncio.Task[None]:
        """The reader's receive loop (for tests)."""
        assert self._reader.task is not None
        return self._reader.task

    def _wakes(self, created: list[tuple[str, str]]) -> bool:
        """Whether any of the ``(bucket, key)`` a message reports created is an object
        directly in the watched directory."""
        for bucket, key in created:
            name = key[len(self._prefix) :]
            # An empty name is the directory's own marker object, not an object in it.
            in_directory = key.startswith(self._prefix) and name and "/" not in name
            if bucket == self._store.bucket and in_directory:
                return True
        return False

    async def aclose(self) -> None:
        if not self.closed:
            self._on_close(self)
            await self._reader.unsubscribe(self)
        await super().aclose()


class _QueueReader:
    """Long-polls one SQS queue for every feed subscribed to it, from the first subscription
    to the last (a cancelled :meth:`~SqsChangeFeed.wait` cancels no request, so no received
    message is lost), wakes the feeds each message concerns, and deletes every message it
    receives. Requests go through the store of the first feed (its client, its retries);
    when that feed closes, the loop restarts on the next one's. Any failed receive makes
    every feed lapse (its messages may be lost until their visibility timeout), even one the
    retries recover from; an error that persists through the retries fails every feed.
    """

    def __init__(self, key: tuple[str, S3Options]) -> None:
        self.key = key
        self.queue_url = key[0]
        self.feeds: list[SqsChangeFeed] = []
        self.task: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, store: FeedStore, queue_url: str) -> _QueueReader:
        readers = _readers.setdefault(asyncio.get_running_loop(), {})
        key = (queue_url, store.options)
        if key not in readers:
            readers[key] = cls(key)
        return readers[key]

    def subscribe(self, feed: SqsChangeFeed) -> None:
        self.feeds.append(feed)
        if self.task is None or self.task.done():
            self._start()

    async def unsubscribe(self, feed: SqsChangeFeed) -> None:
        if feed not in self.feeds:
            return
        lead = self.feeds[0] is feed
        self.feeds.remove(feed)
        if lead or not self.feeds:
            await self._stop()
            if self.feeds:
                self._start()  # on the next feed's store: the closing one's client goes away
        if not self.feeds:
            readers = _readers.get(asyncio.get_running_loop(), {})
            if readers.get(self.key) is self:
                del readers[self.key]

    def _start(self) -> None:
        lead = self.feeds[0]
        self.task = asyncio.get_running_loop().create_task(
            self._run(lead), name=f"deltastream-watch:{self.queue_url}"
        )

    async def _stop(self) -> None:
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait([task])

    async def _run(self, lead: SqsChangeFeed) -> None:
        queue = self.queue_url
        store = lead._store

        async def receive(client: Any) -> Any:
            return await client.receive_message(
                QueueUrl=queue, MaxNumberOfMessages=_SQS_BATCH, WaitTimeSeconds=SQS_WAIT_SECONDS
            )

        def retrying() -> None:
            # Even an attempt the retries recover from may have taken messages whose answer
            # never came back: they stay invisible for the queue's visibility timeout (30 s
            # by default). Every feed lists at once instead of waiting for them.
            self._lapse_all(f"an SQS ReceiveMessage from {queue} failed and is being retried")

        try:
            while True:
                response = await store.sqs_request(
                    lead.uri,
                    f"SQS ReceiveMessage from {queue}",
                    receive,
                    operation="SQS ReceiveMessage",
                    on_retry=retrying,
                )
                messages: list[dict[str, Any]] = response.get("Messages") or []
                for message in messages:
                    self._dispatch(message)
                if messages:
                    await self._delete(lead, messages)
        except StorageError as e:
            log.debug("change feeds on %s failed: %s", queue, e)
            self._fail_all(e.problem, e)
        except Exception as e:  # a bug: fail the feeds rather than lose them in a dead task
            log.exception("change feeds on %s failed", queue)
            self._fail_all(f"change feed failed: {type(e).__name__}: {e}", e)

    def _dispatch(self, message: Mapping[str, Any]) -> None:
        """Wake the feeds a message concerns (every message is looked at and logged)."""
        message_id = message.get("MessageId", "?")
        created = _created_objects(str(message.get("Body", "")))  # parsed once, for all feeds
        if isinstance(created, str):
            log.debug("ignoring SQS message %s from %s: %s", message_id, self.queue_url, created)
            return
        woken = [feed for feed in self.feeds if feed._wakes(created)]
        for feed in woken:
            feed._signal()
        if not woken:
            log.debug("SQS message %s: no new object in a watched directory", message_id)

    def _lapse_all(self, reason: str) -> None:
        for feed in self.feeds:
            feed._lapse(reason)

    def _fail_all(self, problem: str, cause: BaseException) -> None:
        for feed in self.feeds:
            feed._fail(problem, cause)

    async def _delete(self, lead: SqsChangeFeed, messages: list[dict[str, Any]]) -> None:
        entries = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
        ]

        async def delete(client: Any) -> Any:
            return await client.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)

        response = await lead._store.sqs_request(
            lead.uri,
            f"SQS DeleteMessageBatch on {self.queue_url}",
            delete,
            operation="SQS DeleteMessageBatch",
        )
        for failed in response.get("Failed") or ():
            # Such a message comes back after its visibility timeout: one spurious wake-up.
            log.warning(
                "could not delete a message from %s: %s: %s",
                self.queue_url,
                failed.get("Code"),
                failed.get("Message"),
            )


#: The readers of each event loop, by queue URL and store options.
_readers: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[str, S3Options], _QueueReader]
] = weakref.WeakKeyDictionary()
