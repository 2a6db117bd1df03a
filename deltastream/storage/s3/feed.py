"""The S3 store's change feed, woken by an SQS queue of S3 event notifications.

With the ``sqs_queue_url`` option, :meth:`S3Store.watch` offers a change feed: it long-polls
an SQS queue that receives the bucket's ``s3:ObjectCreated:*`` event notifications (sent by
S3 directly or through SNS) and wakes when a new object is directly in the watched directory.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_plus

import anyio

from deltastream.errors import StorageError
from deltastream.storage.base import SignalledChangeFeed
from deltastream.storage.s3.client import SQS_WAIT_SECONDS

if TYPE_CHECKING:
    from deltastream.storage.s3.store import S3Store

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


class SqsChangeFeed(SignalledChangeFeed):
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
                QueueUrl=queue, MaxNumberOfMessages=_SQS_BATCH, WaitTimeSeconds=SQS_WAIT_SECONDS
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
