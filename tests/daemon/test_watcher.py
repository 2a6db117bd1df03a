"""The log watcher's trust in a change feed: with a trusted feed listing is a safety net (every
``safety_poll_interval``) and a notification wakes the watcher at once; each way a feed can
lapse (an inotify queue overflow, its directory removed or replaced, SQS receives failing, a
queue that stays quiet while a listing finds a new version) is driven to the point, and the
watcher lists at once (or at the next listing) and falls back to ``poll_interval`` until the
feed has gone a safety interval without a lapse."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import S3_CREDENTIALS, S3Bucket, notify, overflow_queue
from deltalake import write_deltalake
from faultproxy import FaultProxy
from tailing import Collector, batch, create_table, eventually, follow_stream

from deltastream.daemon.observability.metrics_exposition import render_prometheus
from deltastream.daemon.stream.poll_schedule import PollSlots
from deltastream.daemon.stream.tailer import Tailer
from deltastream.daemon.stream.watcher import LogWatcher
from deltastream.storage import LocalStore, ObjectStore, open_store

pytestmark = pytest.mark.anyio

COMMIT = "{:020d}.json"


def commit(log_dir: Path, version: int) -> None:
    """A commit file as a writer puts it: written beside, then renamed into place."""
    tmp = log_dir / f".{version}.tmp"
    tmp.write_text('{"commitInfo":{}}\n')
    tmp.rename(log_dir / COMMIT.format(version))


def versions(listing: Any, start: int = 0) -> list[int]:
    return sorted(v for v in listing.commits() if v >= start)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    path = tmp_path / "table" / "_delta_log"
    path.mkdir(parents=True)
    return path


def watcher(store: ObjectStore, poll: float, safety: float, **kw: Any) -> LogWatcher:
    return LogWatcher(
        store,
        poll_interval=poll,
        safety_poll_interval=safety,
        jitter=0.0,
        slots=PollSlots(offset=0.0),
        name="t",
        **kw,
    )


@pytest.fixture
async def store(log_dir: Path) -> AsyncIterator[LocalStore]:
    async with LocalStore(log_dir.parent) as s:
        yield s


async def test_a_trusted_feed_makes_listing_a_safety_net(store: LocalStore, log_dir: Path) -> None:
    async with watcher(store, poll=5, safety=60) as w:
        assert versions(await w.poll(0)) == []
        assert w.trusted and w.interval == 60
        async with anyio.create_task_group() as tg:

            async def write_later() -> None:
                await anyio.sleep(0.2)
                commit(log_dir, 0)

            tg.start_soon(write_later)
            with anyio.fail_after(10):  # a timer would take 60 s
                await w.sleep()
        assert w.stats.wakeups == 1
        listing = await w.poll(0)
        assert versions(listing) == [0]
        w.arrived(listing.commits().values())
        assert w.stats.lapses == 0 and w.trusted


async def test_without_notifications_every_poll_interval(store: LocalStore) -> None:
    async with watcher(store, poll=0.05, safety=60, notifications=False) as w:
        await w.poll(0)
        assert not w.trusted and w.interval == 0.05
        with anyio.fail_after(5):
            await w.sleep()
        assert w.stats.wakeups == 0


async def test_an_overflowed_queue_lists_at_once_and_polls_until_trusted_again(
    store: LocalStore, log_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="deltastream.daemon.stream.watcher")
    async with watcher(store, poll=0.1, safety=1.0) as w:
        await w.poll(0)
        assert w.trusted
        overflow_queue(log_dir)  # the event loop does not run: the events are lost
        commit(log_dir, 0)  # its notification with them
        started = time.monotonic()
        with anyio.fail_after(10):
            await w.sleep()  # woken by the overflow itself, not a timer
        assert w.stats.lapses == 1
        assert not w.trusted and w.interval == 0.1
        assert versions(await w.poll(0)) == [0]
        lapsed = [r for r in caplog.records if "lapsed" in r.message]
        assert len(lapsed) == 1 and lapsed[0].levelno == logging.WARNING
        assert "inotify event queue overflowed" in lapsed[0].message
        # Trusted again once the feed has gone a safety interval without a lapse (the
        # overflow's queued events wake it a few more times meanwhile: no lapse).
        with anyio.fail_after(10):
            while not w.trusted:
                await w.sleep()
                await w.poll(1)
        assert time.monotonic() - started >= 1.0
        assert w.stats.lapses == 1 and w.interval == 1.0
        with anyio.fail_after(10):
            await w.sleep()  # where the watcher notices, and says so once
        assert [r.levelno for r in caplog.records if "trusted again" in r.message] == [logging.INFO]


async def test_a_replaced_log_directory_lists_at_once_and_watches_the_new_one(
    store: LocalStore, log_dir: Path
) -> None:
    async with watcher(store, poll=30, safety=60) as w:
        await w.poll(0)
        assert w.trusted
        commit(log_dir, 0)
        await w.sleep()
        assert versions(await w.poll(0)) == [0]
        # The table is replaced: the log directory renamed away and a new one in its place.
        os.rename(log_dir, log_dir.with_name("_delta_log.old"))
        os.mkdir(log_dir)
        commit(log_dir, 0)
        with anyio.fail_after(10):  # at once: the old directory's watch says it moved
            await w.sleep()
        assert w.stats.lapses == 1 and not w.trusted
        assert versions(await w.poll(0)) == [0]  # listed, and a feed opened on the new one
        async with anyio.create_task_group() as tg:

            async def write_later() -> None:
                await anyio.sleep(0.2)
                commit(log_dir, 1)

            tg.start_soon(write_later)
            wakeups = w.stats.wakeups
            with anyio.fail_after(10):  # the poll interval is 30 s: the new feed wakes it
                await w.sleep()
            assert w.stats.wakeups == wakeups + 1
        assert versions(await w.poll(1), 1) == [1]


async def test_a_removed_log_directory_is_polled_until_it_is_back(
    store: LocalStore, log_dir: Path
) -> None:
    async with watcher(store, poll=0.05, safety=60) as w:
        await w.poll(0)
        os.rmdir(log_dir)  # the kernel drops the watch
        with anyio.fail_after(10):
            await w.sleep()
        assert w.stats.lapses == 1 and not w.trusted
        for _ in range(3):  # no directory, no feed: every poll interval
            assert versions(await w.poll(0)) == []
            with anyio.fail_after(5):
                await w.sleep()
        assert w.stats.lapses == 1  # logged and counted once
        os.mkdir(log_dir)
        commit(log_dir, 0)
        assert versions(await w.poll(0)) == [0]
        assert w.stats.lapses == 1


async def test_a_feed_that_keeps_failing_does_not_make_the_watcher_spin(
    store: LocalStore, log_dir: Path
) -> None:
    """A directory removed over and over (each new feed fails at once): the watcher lists
    once per poll interval, not without pause."""
    async with watcher(store, poll=0.2, safety=60) as w:
        started = time.monotonic()
        for _ in range(5):
            await w.poll(0)  # opens a feed on the directory
            os.rmdir(log_dir)
            with anyio.fail_after(10):
                await w.sleep()
            os.mkdir(log_dir)
        # Failures come at least a poll interval apart.
        assert time.monotonic() - started >= 4 * 0.2
        assert w.stats.lapses == 5 and w.stats.polls == 5


# --- SQS ---------------------------------------------------------------------------------

PREFIX = "tables/t"


def s3_store(endpoint: str, bucket: str, queue: str) -> ObjectStore:
    options = {"endpoint_url": endpoint, "sqs_queue_url": queue, **S3_CREDENTIALS}
    return open_store(f"s3://{bucket}/{PREFIX}", options)


def put_commit(bucket: S3Bucket, version: int) -> None:
    bucket.put(f"{PREFIX}/_delta_log/{COMMIT.format(version)}", b'{"commitInfo":{}}\n')


async def test_a_quiet_queue_is_caught_by_the_safety_listing(
    s3_bucket: S3Bucket, sqs: Any, queue: str
) -> None:
    """S3 stops sending notifications (the queue goes quiet) while commits land: the safety
    listing finds the version within its interval, and the feed lapses (a version it never
    announced)."""
    s3 = s3_bucket.server.client()
    notify(s3, sqs, s3_bucket.name, queue)
    async with (
        s3_store(s3_bucket.server.endpoint, s3_bucket.name, queue) as store,
        watcher(store, poll=0.2, safety=1.0, announce_grace=0.0) as w,
    ):
        await w.poll(0)
        put_commit(s3_bucket, 0)
        with anyio.fail_after(10):
            await w.sleep()  # the notification wakes it
        assert w.stats.wakeups == 1 and w.trusted
        listing = await w.poll(0)
        w.arrived(listing.commits().values())
        assert w.stats.lapses == 0

        notify(s3, sqs, s3_bucket.name, None)
        put_commit(s3_bucket, 1)
        started = time.monotonic()
        with anyio.fail_after(10):
            await w.sleep()  # no notification: the safety interval's timer
        assert w.stats.wakeups == 1  # the timer's, not a notification
        # The safety interval's timer (1 s), not SQS's 20 s long poll coming back empty.
        assert time.monotonic() - started < 5.0
        listing = await w.poll(1)
        assert versions(listing, 1) == [1]
        w.arrived(f for v, f in listing.commits().items() if v >= 1)
        assert w.stats.lapses == 1 and not w.trusted and w.interval == 0.2


async def test_failing_sqs_receives_fall_back_to_polling_and_open_a_new_feed(
    s3_bucket: S3Bucket, sqs: Any, queue: str
) -> None:
    s3 = s3_bucket.server.client()
    notify(s3, sqs, s3_bucket.name, queue)
    with FaultProxy(s3_bucket.server.endpoint, keep_alive=False) as proxy:
        async with (
            s3_store(proxy.url, s3_bucket.name, queue) as store,
            watcher(store, poll=30, safety=60) as w,
        ):
            await w.poll(0)
            assert w.trusted
            # The next SQS request is refused (AccessDenied is not retried): a message
            # ends the reader's long poll, and deleting it fails.
            proxy.inject("denied")
            s3_bucket.put(f"{PREFIX}/elsewhere.txt", b"x")
            with anyio.fail_after(20):  # at once, not after the 30 s poll interval
                await w.sleep()
            assert w.stats.lapses == 1 and not w.trusted and w.interval == 30
            # The next poll opens a new feed, whose notifications wake the watcher.
            assert versions(await w.poll(0)) == []
            put_commit(s3_bucket, 0)
            wakeups = w.stats.wakeups
            with anyio.fail_after(20):
                await w.sleep()
            assert w.stats.wakeups == wakeups + 1
            assert versions(await w.poll(0)) == [0]


def receiving(proxy: FaultProxy) -> bool:
    """Whether a request is in flight through ``proxy`` (the feed's long poll, once its
    listings are answered)."""
    counts = proxy.counts()
    return counts["requests"] > counts["forwarded"] + counts["faults"]


def drain(sqs: Any, queue: str) -> None:
    """Take every message off ``queue`` (S3's test event, sent when notifications are
    configured), so that the feed's first long poll waits for the test's own."""
    while messages := sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages"):
        for m in messages:
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=m["ReceiptHandle"])


async def test_a_receive_the_retries_recover_from_lapses_the_feed_at_once(
    s3_bucket: S3Bucket, sqs: Any, queue: str
) -> None:
    """One SQS receive fails (503) and its retry succeeds: the failed attempt may have taken
    messages that stay invisible for the queue's visibility timeout, so the watcher lists at
    once and polls until the feed is trusted again; the feed itself goes on."""
    s3 = s3_bucket.server.client()
    notify(s3, sqs, s3_bucket.name, queue)
    drain(sqs, queue)
    with FaultProxy(s3_bucket.server.endpoint, keep_alive=False, methods={"POST"}) as proxy:
        async with (
            s3_store(proxy.url, s3_bucket.name, queue) as store,
            watcher(store, poll=30, safety=60) as w,
        ):
            await w.poll(0)
            assert w.trusted
            await eventually(lambda: receiving(proxy))
            # The long poll in flight ends with a message; deleting it passes, and the next
            # receive meets one 503 before its retry goes through.
            proxy.inject("pass", "internal")
            s3_bucket.put(f"{PREFIX}/elsewhere.txt", b"x")
            with anyio.fail_after(20):  # at once, not after the 30 s poll interval
                await w.sleep()
            assert [s.outcome for s in proxy.seen if s.outcome == "internal"] == ["internal"]
            assert w.stats.lapses == 1 and not w.trusted and w.interval == 30
            assert w.stats.wakeups == 1
            # The feed did not fail: the next commit's notification wakes the watcher.
            assert versions(await w.poll(0)) == []
            put_commit(s3_bucket, 0)
            with anyio.fail_after(20):
                await w.sleep()
            assert w.stats.wakeups == 2 and w.stats.lapses == 1
            assert versions(await w.poll(0)) == [0]


async def test_a_message_deleted_before_it_is_read_is_caught_by_the_safety_listing(
    s3_bucket: S3Bucket, sqs: Any, queue: str
) -> None:
    """A commit's notification is taken off the queue by someone else before the feed reads
    it: the safety listing finds the version within its interval (not the 20 s long poll's),
    and the feed lapses (a version it never announced)."""
    s3 = s3_bucket.server.client()
    notify(s3, sqs, s3_bucket.name, queue)
    drain(sqs, queue)
    with FaultProxy(
        s3_bucket.server.endpoint, keep_alive=False, methods={"POST"}, delay_range=(4.0, 4.0)
    ) as proxy:
        async with (
            s3_store(proxy.url, s3_bucket.name, queue) as store,
            watcher(store, poll=0.2, safety=1.0, announce_grace=0.0) as w,
        ):
            await w.poll(0)
            assert w.trusted
            await eventually(lambda: receiving(proxy))
            # The long poll in flight ends with a message, which is deleted; the next receive
            # is held 4 s at the proxy, while the commit lands and its message is taken.
            proxy.inject("pass", "delay")
            s3_bucket.put(f"{PREFIX}/elsewhere.txt", b"x")
            await eventually(lambda: any(s.outcome == "delay" for s in proxy.seen))
            put_commit(s3_bucket, 0)
            taken = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)["Messages"]
            assert len(taken) == 1 and COMMIT.format(0) in taken[0]["Body"]
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=taken[0]["ReceiptHandle"])
            started = time.monotonic()
            with anyio.fail_after(10):
                await w.sleep()  # the safety interval's timer: no notification comes
            assert time.monotonic() - started < 5.0 and w.stats.wakeups == 0
            listing = await w.poll(0)
            assert versions(listing) == [0]
            w.arrived(listing.commits().values())
            assert w.stats.lapses == 1 and not w.trusted and w.interval == 0.2


# --- through a stream ----------------------------------------------------------------------


async def test_a_stream_delivers_through_a_lapse_and_counts_it(tmp_path: Path) -> None:
    """A followed table whose inotify queue overflows while a commit lands: the commit is
    delivered at once (not after the 30 s poll interval), the lapse is counted in the
    stream's metrics and the feed is no longer trusted; the metrics say so to Prometheus."""
    uri = str(tmp_path / "t")
    create_table(uri)
    stream = follow_stream(tmp_path, "t", uri)
    config = replace(stream.tail, poll_interval=30, safety_poll_interval=60)
    rows = Collector()
    tailer = Tailer(config, rows.sink())
    async with anyio.create_task_group() as tg:
        tg.start_soon(tailer.run)
        await eventually(lambda: len(rows.rows) == 10 and tailer.metrics.feed_trusted is True)
        overflow_queue(tmp_path / "t" / "_delta_log")
        write_deltalake(uri, batch(range(10, 15)), mode="append")
        # Delivered within 20 s, where the poll interval is 30 s; the lapse is counted when
        # the stream next sleeps (it may list the new version first, if it was not asleep).
        await eventually(lambda: len(rows.rows) == 15, within=20)
        await eventually(lambda: tailer.metrics.feed_lapses == 1, within=20)
        assert tailer.metrics.feed_trusted is False
        text = render_prometheus([tailer.metrics])
        assert 'deltastream_change_feed_lapses_total{table="t"} 1.0' in text
        assert 'deltastream_change_feed_trusted{table="t"} 0.0' in text
        tailer.stop()
