"""LocalStore: the shared store contract on a real directory, plus local-only behaviour
(paths escaping the root, mtimes), ``open_store`` for local paths and ``file:`` URIs, and
change feeds on real inotify events (``LocalStore.watch``)."""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import quote

import anyio
import pytest
from conftest import overflow_queue
from storage_contract import Harness, StoreContract, collect

from deltastream.errors import (
    DataFileError,
    InvalidArgumentError,
    ObjectNotFoundError,
    StorageError,
    UnsafePathError,
    is_transient,
)
from deltastream.storage import ChangeFeed, LocalStore, S3Store, open_store
from deltastream.storage.paths import ExternalPaths


def write(root: Path, key: str, data: bytes) -> None:
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "table"
    root.mkdir()
    async with LocalStore(root) as store:
        yield Harness(store, lambda key, data: write(root, key, data))


class TestLocalStoreContract(StoreContract):
    pass


# -------------------------------------------------------------------- local-only behaviour


@pytest.mark.anyio
async def test_head_and_listing_use_the_file_mtime_in_ms(tmp_path: Path) -> None:
    write(tmp_path, "_delta_log/00000000000000000000.json", b"{}")
    path = tmp_path / "_delta_log/00000000000000000000.json"
    mtime_ns = 1_700_000_000_123_456_789
    os.utime(path, ns=(mtime_ns, mtime_ns))
    store = LocalStore(tmp_path)
    assert (await store.head("_delta_log/00000000000000000000.json")).last_modified_ms == (
        1_700_000_000_123
    )
    (meta,) = await collect(store, "_delta_log/")
    assert meta.last_modified_ms == 1_700_000_000_123


@pytest.mark.anyio
@pytest.mark.parametrize("key", ["../outside.json", "a/../../outside.json", "/etc/hostname"])
async def test_keys_escaping_the_root_are_rejected(tmp_path: Path, key: str) -> None:
    root = tmp_path / "table"
    root.mkdir()
    write(tmp_path, "outside.json", b"secret")
    store = LocalStore(root)
    with pytest.raises(InvalidArgumentError, match="escapes the store root"):
        await store.get(key)
    with pytest.raises(InvalidArgumentError, match="escapes the store root"):
        await store.head(key)
    with pytest.raises(InvalidArgumentError, match="escapes the store root"):
        await collect(store, key.rsplit("/", 1)[0] + "/")


@pytest.mark.anyio
async def test_listing_skips_directories_and_follows_file_symlinks(tmp_path: Path) -> None:
    write(tmp_path, "_delta_log/00000000000000000000.json", b"{}")
    (tmp_path / "_delta_log" / "00000000000000000001.json").mkdir()  # a directory, not an object
    (tmp_path / "_delta_log" / "00000000000000000002.json").symlink_to(
        tmp_path / "_delta_log" / "00000000000000000000.json"
    )
    (tmp_path / "_delta_log" / "dangling.json").symlink_to(tmp_path / "nowhere")
    store = LocalStore(tmp_path)
    listed = await collect(store, "_delta_log/")
    assert [(m.key, m.size) for m in listed] == [
        ("_delta_log/00000000000000000000.json", 2),
        ("_delta_log/00000000000000000002.json", 2),
    ]


@pytest.mark.anyio
async def test_listing_a_file_as_a_directory_yields_nothing(tmp_path: Path) -> None:
    write(tmp_path, "_delta_log", b"not a directory")
    assert await collect(LocalStore(tmp_path), "_delta_log/") == []


@pytest.mark.anyio
async def test_stats_count_requests(tmp_path: Path) -> None:
    write(tmp_path, "a", b"1")
    write(tmp_path, "b", b"2")
    store = LocalStore(tmp_path)
    await collect(store, "")
    await store.get("a")
    await store.head("b")
    await store.get_many(["a", "b"])
    assert (store.stats.list_requests, store.stats.get_requests, store.stats.head_requests) == (
        1,
        3,
        1,
    )
    assert store.stats.retries == 0


# -------------------------------------------------------------------- resolving log paths


@pytest.mark.anyio
async def test_resolve_reads_log_paths_under_the_root_through_the_store(tmp_path: Path) -> None:
    root = tmp_path / "my table"
    write(root, "p=a b/x y.parquet", b"inside")
    store = LocalStore(root)
    encoded = quote(str(root))
    for path in (
        "p=a%20b/x%20y.parquet",
        f"{encoded}/p=a%20b/x%20y.parquet",
        f"file:{encoded}/p=a%20b/x%20y.parquet",
        f"file://{encoded}/p=a%20b/x%20y.parquet",
        f"file://localhost{encoded}/p=a%20b/x%20y.parquet",
    ):
        assert store.resolve(path) == (store, "p=a b/x y.parquet"), path
        assert await store.get(store.resolve(path)[1]) == b"inside"


@pytest.mark.anyio
async def test_resolve_reads_files_elsewhere_through_one_file_system_store(
    tmp_path: Path,
) -> None:
    write(tmp_path, "elsewhere/x y.parquet", b"outside")
    store = LocalStore(tmp_path / "table")
    store.external_paths = ExternalPaths(allow_all=True)
    other, key = store.resolve(f"file:{quote(str(tmp_path))}/elsewhere/x%20y.parquet")
    assert isinstance(other, LocalStore) and other is not store
    assert other.root_uri == "/" and key == f"{tmp_path}/elsewhere/x y.parquet".lstrip("/")
    assert await other.get(key) == b"outside"
    assert other.stats is store.stats
    assert store.resolve(f"{tmp_path}/elsewhere/x%20y.parquet")[0] is other


@pytest.mark.anyio
async def test_resolved_keys_escaping_the_root_are_still_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "table")
    store.external_paths = ExternalPaths(allow_all=True)
    for path in ("%2e%2e/x", f"file:{tmp_path}/table/../x"):
        target, key = store.resolve(path)
        assert (target, key) == (store, "../x")
        with pytest.raises(InvalidArgumentError, match="escapes the store root"):
            await target.get(key)


@pytest.mark.parametrize("path", ["s3://bucket/t/x", "file://server/t/x", "//server/t/x", "C:/x"])
def test_resolve_refuses_paths_no_local_store_can_read(tmp_path: Path, path: str) -> None:
    store = LocalStore(tmp_path)
    # Outside the root: refused unless allowed; allowed, still unreadable from here, and a
    # permanent error (retrying cannot help).
    with pytest.raises(UnsafePathError, match="outside the table"):
        store.resolve(path)
    store.external_paths = ExternalPaths(allow_all=True)
    with pytest.raises(DataFileError, match="cannot read files from that location") as info:
        store.resolve(path)
    assert info.value.path == path and not is_transient(info.value)


@pytest.mark.parametrize(
    "path", ["/elsewhere/x.parquet", "file:///elsewhere/x", "../x", "%2e%2e/x", "a/../../x"]
)
def test_resolve_refuses_paths_outside_the_root_by_default(tmp_path: Path, path: str) -> None:
    with pytest.raises(UnsafePathError, match="--allow-external-paths") as info:
        LocalStore(tmp_path / "t").resolve(path)
    assert info.value.path == path


def test_resolve_allows_paths_under_allowed_roots_only(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "t")
    store.external_paths = ExternalPaths.of([f"{tmp_path}/src"])
    other, key = store.resolve(f"{tmp_path}/src/x.parquet")
    assert other.root_uri == "/" and key.endswith("src/x.parquet")
    for path in (f"{tmp_path}/srcx/y", f"{tmp_path}/other/y", "../src/x.parquet"):
        with pytest.raises(UnsafePathError):
            store.resolve(path)


@pytest.mark.parametrize("path", ["a%00b.parquet", "/x/a%00b", "file:/x\x00"])
def test_resolve_refuses_nul_bytes(tmp_path: Path, path: str) -> None:
    with pytest.raises(InvalidArgumentError, match="NUL byte"):
        LocalStore(tmp_path).resolve(path)


# -------------------------------------------------------------------- open_store, local


@pytest.mark.anyio
async def test_open_store_absolute_path(tmp_path: Path) -> None:
    write(tmp_path, "_delta_log/00000000000000000000.json", b"{}")
    store = open_store(str(tmp_path))
    assert isinstance(store, LocalStore)
    assert store.root == tmp_path
    assert store.root_uri == str(tmp_path)
    assert await store.get("_delta_log/00000000000000000000.json") == b"{}"


def test_open_store_relative_path_is_made_absolute() -> None:
    store = open_store("some/relative/table")
    assert isinstance(store, LocalStore)
    assert store.root == Path.cwd() / "some" / "relative" / "table"


def test_open_store_plain_path_is_not_percent_decoded() -> None:
    store = open_store("/data/a%20b/part=1")
    assert isinstance(store, LocalStore)
    assert store.root == Path("/data/a%20b/part=1")


@pytest.mark.anyio
async def test_open_store_file_uri_is_percent_decoded(tmp_path: Path) -> None:
    root = tmp_path / "abs path" / "é=1 100%"
    write(root, "_delta_log/00000000000000000000.json", b"{}")
    uri = root.as_uri()
    assert "%20" in uri and "%25" in uri  # the URI really is encoded
    localhost = uri.replace("file:///", "file://localhost/")
    for candidate in (uri, localhost, uri.replace("file:", "FILE:")):
        store = open_store(candidate)
        assert isinstance(store, LocalStore)
        assert store.root == root
        listed = await collect(store, "_delta_log/")
        assert [m.key for m in listed] == ["_delta_log/00000000000000000000.json"]


@pytest.mark.parametrize(
    "uri",
    ["hdfs://namenode/table", "https://example.com/t", "http://host/t"],
)
def test_open_store_rejects_unsupported_schemes(uri: str) -> None:
    with pytest.raises(InvalidArgumentError, match="unsupported URI scheme"):
        open_store(uri)


def test_open_store_rejects_file_uri_with_host() -> None:
    with pytest.raises(InvalidArgumentError, match="must not name a host"):
        open_store("file://server/share/table")


def test_open_store_rejects_empty_uri() -> None:
    with pytest.raises(InvalidArgumentError, match="empty table URI"):
        open_store("")


@pytest.mark.parametrize("uri", ["/data/table", "relative/table", "file:///data/table"])
def test_open_store_rejects_storage_options_for_local_paths(uri: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        open_store(uri, {"AWS_REGION": "us-east-1"})
    assert uri in str(info.value)
    assert "AWS_REGION" in str(info.value)
    assert "only apply to tables in object stores (s3://, gs://, Azure)" in str(info.value)
    # An empty mapping is no options at all.
    assert isinstance(open_store(uri, {}), LocalStore)


def test_open_store_s3_is_not_local() -> None:
    # The local/S3 decision is made on the scheme alone (no network access).
    assert isinstance(open_store("s3://bucket/t"), S3Store)


@pytest.mark.anyio
async def test_missing_local_file_error_names_the_path(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    with pytest.raises(ObjectNotFoundError) as info:
        await store.get("_delta_log/_last_checkpoint")
    assert str(tmp_path / "_delta_log" / "_last_checkpoint") in str(info.value)


# -------------------------------------------------------------------- change feeds

COMMIT = "_delta_log/{:020d}.json"


@pytest.fixture(params=["shared-inotify", "watchfiles-thread"])
async def store(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[LocalStore]:
    """A local store whose feeds share the loop's inotify instance, or (as where there is
    no inotify) each run a watchfiles thread: both pass every feed test."""
    (tmp_path / "_delta_log" / "_sidecars").mkdir(parents=True)
    async with LocalStore(tmp_path) as store:
        store.shared_notifications = request.param == "shared-inotify"
        yield store


def feed_is_running(store: LocalStore, feed: ChangeFeed) -> bool:
    """Whether a feed still has its watcher: its thread, or its watch on the shared
    instance."""
    if store.shared_notifications:
        from deltastream.storage import inotify

        hub = inotify._hubs.get(asyncio.get_running_loop())
        return hub is not None and any(feed in feeds for feeds in hub._feeds.values())
    return bool(feed._thread.is_alive())  # type: ignore[attr-defined]


@pytest.fixture
async def feed(store: LocalStore) -> AsyncIterator[ChangeFeed]:
    feed = await store.watch("_delta_log/")
    assert feed is not None
    async with feed:
        yield feed


async def wakes(feed: ChangeFeed, within: float) -> bool:
    with anyio.move_on_after(within):
        await feed.wait()
        return True
    return False


async def drain(feed: ChangeFeed) -> None:
    """Consume wake-ups still due for earlier changes (a create and the write after it may
    come as two)."""
    while await wakes(feed, 0.05):
        pass


async def wake_latency(feed: ChangeFeed, change: Callable[[], object]) -> float:
    """Seconds from just before ``change()`` until ``feed.wait()`` returns."""
    await drain(feed)
    start = time.perf_counter()
    change()
    with anyio.fail_after(5):
        await feed.wait()
    return time.perf_counter() - start


def create(root: Path, version: int) -> None:
    (root / COMMIT.format(version)).write_bytes(b'{"commitInfo":{}}\n')


def rename_into_place(root: Path, version: int, temp_dir: str) -> None:
    temp = root / temp_dir / f".{version:020d}.json.tmp"
    temp.write_bytes(b'{"commitInfo":{}}\n')
    os.rename(temp, root / COMMIT.format(version))


@pytest.mark.anyio
async def test_feed_wakes_within_milliseconds_of_a_created_commit(
    store: LocalStore, feed: ChangeFeed
) -> None:
    latencies = [await wake_latency(feed, lambda v=v: create(store.root, v)) for v in range(20)]
    assert max(latencies) < 0.5
    # Measured here: a median of about 4 ms (two 2 ms watcher steps).
    assert statistics.median(latencies) < 0.1, latencies


@pytest.mark.anyio
@pytest.mark.parametrize("temp_dir", ["_delta_log", "."])
async def test_feed_wakes_on_a_rename_into_place(
    store: LocalStore, feed: ChangeFeed, temp_dir: str
) -> None:
    # A temporary file beside the commit (Spark, delta-rs) or elsewhere, renamed into place.
    latencies = [
        await wake_latency(feed, lambda v=v: rename_into_place(store.root, v, temp_dir))
        for v in range(10)
    ]
    assert max(latencies) < 0.5
    assert statistics.median(latencies) < 0.1, latencies


@pytest.mark.anyio
async def test_feed_wakes_on_the_store_s_own_put(store: LocalStore, feed: ChangeFeed) -> None:
    await drain(feed)
    await store.put(COMMIT.format(0), b"{}", if_match="")
    assert await wakes(feed, 0.5)


@pytest.mark.anyio
async def test_feed_ignores_subdirectories_the_parent_and_deletions(
    store: LocalStore, feed: ChangeFeed
) -> None:
    create(store.root, 0)
    await drain(feed)
    (store.root / "_delta_log" / "_sidecars" / "a.parquet").write_bytes(b"PAR1")
    (store.root / "part-0.parquet").write_bytes(b"PAR1")
    (store.root / COMMIT.format(0)).unlink()
    assert not await wakes(feed, 0.3)
    create(store.root, 1)
    assert await wakes(feed, 0.5)


@pytest.mark.anyio
async def test_changes_while_no_one_waits_wake_the_next_wait_once(
    store: LocalStore, feed: ChangeFeed
) -> None:
    await drain(feed)
    for version in range(3):
        rename_into_place(store.root, version, ".")
    await anyio.sleep(0.1)  # the watcher has seen them all by now
    assert await wakes(feed, 0.01)
    assert not await wakes(feed, 0.2)


@pytest.mark.anyio
async def test_wait_is_cancellable_and_the_feed_still_works(
    store: LocalStore, feed: ChangeFeed
) -> None:
    await drain(feed)
    start = time.perf_counter()
    with anyio.move_on_after(0.05) as scope:
        await feed.wait()
    assert scope.cancelled_caught
    assert time.perf_counter() - start < 0.5
    create(store.root, 0)
    assert await wakes(feed, 0.5)


@pytest.mark.anyio
async def test_closing_the_feed_stops_its_thread(store: LocalStore) -> None:
    feed = await store.watch("_delta_log/")
    assert feed is not None
    assert feed_is_running(store, feed)
    outcome: list[BaseException] = []

    async def waiter() -> None:
        try:
            await feed.wait()
        except StorageError as e:
            outcome.append(e)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.sleep(0.05)
        start = time.perf_counter()
        await feed.aclose()
        assert time.perf_counter() - start < 0.5
    assert not feed_is_running(store, feed)
    # A wait in progress when the feed closes, and any later one, fail: nothing will wake it.
    assert [str(e) for e in outcome] == [f"{store.root / '_delta_log'}: change feed is closed"]
    with pytest.raises(StorageError, match="change feed is closed"):
        await feed.wait()
    await feed.aclose()  # closing twice is harmless


@pytest.mark.anyio
@pytest.mark.parametrize("shared", [True, False])
async def test_closing_the_store_closes_its_feeds(tmp_path: Path, shared: bool) -> None:
    store = LocalStore(tmp_path)
    store.shared_notifications = shared
    feeds = [await store.watch(""), await store.watch("")]
    await store.aclose()
    for feed in feeds:
        assert feed is not None
        assert not feed_is_running(store, feed)
        with pytest.raises(StorageError, match="change feed is closed"):
            await feed.wait()


@pytest.mark.anyio
async def test_watching_the_store_root(store: LocalStore) -> None:
    async with await store.watch("") as feed:  # type: ignore[union-attr]
        await drain(feed)
        (store.root / "_last_checkpoint").write_bytes(b"{}")
        assert await wakes(feed, 0.5)


@pytest.mark.anyio
async def test_watching_through_a_symbolic_link(tmp_path: Path) -> None:
    (tmp_path / "real" / "_delta_log").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    async with LocalStore(tmp_path / "link") as store:
        feed = await store.watch("_delta_log/")
        assert feed is not None
        create(store.root, 0)
        assert await wakes(feed, 0.5)
        shutil.rmtree(tmp_path / "real" / "_delta_log")
        with anyio.fail_after(5), pytest.raises(StorageError) as info:
            while True:
                await feed.wait()
        assert info.value.uri == str(tmp_path / "link" / "_delta_log")  # as the store names it


@pytest.mark.anyio
async def test_no_feed_for_a_directory_that_does_not_exist(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    store = LocalStore(tmp_path / "table")
    assert await store.watch("_delta_log/") is None
    assert await store.watch("") is None
    assert await LocalStore(tmp_path).watch("file/") is None
    assert os.listdir(tmp_path) == ["file"]  # nothing was created
    with pytest.raises(InvalidArgumentError, match="escapes the store root"):
        await LocalStore(tmp_path).watch("../")


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["removed", "renamed"])
async def test_feed_fails_when_its_directory_goes_away(
    store: LocalStore, feed: ChangeFeed, how: str
) -> None:
    log_dir = store.root / "_delta_log"
    await drain(feed)
    if how == "removed":
        shutil.rmtree(log_dir)
    else:
        log_dir.rename(store.root / "_delta_log.old")
    # inotify watches the old directory (or nothing): a new _delta_log would go unseen.
    with anyio.fail_after(5), pytest.raises(StorageError) as info:
        while True:
            await feed.wait()
    assert info.value.uri == str(log_dir)
    assert "the directory was removed or renamed" in str(info.value)
    with pytest.raises(StorageError, match="removed or renamed"):
        await feed.wait()  # the feed stays failed


@pytest.mark.anyio
async def test_a_watcher_error_surfaces_from_wait(tmp_path: Path) -> None:
    from watchfiles._rust_notify import RustNotify

    from deltastream.storage.local import _LocalChangeFeed

    # A real watcher that fails: RustNotify.watch raises RuntimeError once it is closed.
    notify = RustNotify([str(tmp_path)], False, False, 300, False, False)
    notify.close()
    feed = _LocalChangeFeed(tmp_path, (str(tmp_path), notify), 2, lambda feed: None)
    with anyio.fail_after(5), pytest.raises(StorageError) as info:
        await feed.wait()
    assert info.value.uri == str(tmp_path)
    assert "watching for changes failed" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    await feed.aclose()
    assert not feed._thread.is_alive()


# ------------------------------------------------------- one inotify instance for all feeds


@pytest.mark.anyio
async def test_many_feeds_share_one_inotify_instance_and_no_thread(tmp_path: Path) -> None:
    """More tables than Linux's default 128 inotify instances per user, on one instance and
    no thread per feed; each feed wakes for its own directory only."""
    from deltastream.storage import inotify

    n = 300
    stores = [LocalStore(tmp_path / f"t{i}") for i in range(n)]
    for store in stores:
        (store.root / "_delta_log").mkdir(parents=True)
        assert store.shared_notifications
    threads = threading.active_count()
    feeds = [await store.watch("_delta_log/") for store in stores]
    assert all(feed is not None for feed in feeds)
    assert threading.active_count() == threads
    hub = inotify._hubs[asyncio.get_running_loop()]
    assert hub.watches == n
    for i in (0, 137, n - 1):
        create(stores[i].root, 0)
        assert await wakes(feeds[i], 0.5)  # type: ignore[arg-type]
        woken = [j for j, feed in enumerate(feeds) if await wakes(feed, 0)]  # type: ignore[arg-type]
        assert woken == [], (i, woken)
    for store in stores:
        await store.aclose()
    assert asyncio.get_running_loop() not in inotify._hubs  # the last feed closed the fd


@pytest.mark.anyio
async def test_two_feeds_on_one_directory(tmp_path: Path) -> None:
    from deltastream.storage import inotify

    (tmp_path / "_delta_log").mkdir()
    async with LocalStore(tmp_path) as a, LocalStore(tmp_path) as b:
        fa, fb = await a.watch("_delta_log/"), await b.watch("_delta_log/")
        assert fa is not None and fb is not None
        assert inotify._hubs[asyncio.get_running_loop()].watches == 1  # one watch, two feeds
        create(tmp_path, 0)
        assert await wakes(fa, 0.5) and await wakes(fb, 0.5)
        await fa.aclose()
        create(tmp_path, 1)
        assert await wakes(fb, 0.5)  # the other feed's watch is still there
        with pytest.raises(StorageError, match="change feed is closed"):
            await fa.wait()


@pytest.mark.anyio
async def test_a_lost_event_queue_wakes_every_feed(tmp_path: Path) -> None:
    """When the kernel's queue overflows (events were dropped), every feed lapses: it wakes
    (it may wake for nothing but never sleeps through a change) and says why, once."""
    busy, quiet = tmp_path / "busy", tmp_path / "quiet"
    for d in (busy, quiet):
        (d / "_delta_log").mkdir(parents=True)
    async with LocalStore(busy) as b, LocalStore(quiet) as q:
        fb, fq = await b.watch("_delta_log/"), await q.watch("_delta_log/")
        assert fb is not None and fq is not None
        overflow_queue(busy / "_delta_log")  # the event loop does not run meanwhile
        assert await wakes(fq, 1)
        assert await wakes(fb, 1)
        for feed in (fq, fb):
            assert feed.take_lapse() == "the inotify event queue overflowed: events were lost"
            assert feed.take_lapse() is None


def test_filesystem_type_is_that_of_the_longest_mount_point_holding_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltastream.storage import local

    share = tmp_path / "my share"
    (share / "deep").mkdir(parents=True)
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/sda1 / ext4 rw 0 0\n"
        f"server:/export {str(share).replace(' ', chr(92) + '040')} nfs4 rw 0 0\n"
        f"tmpfs {tmp_path}/my tmpfs rw 0 0\n"
    )
    monkeypatch.setattr(local, "MOUNTS", str(mounts))
    assert local.filesystem_type(share / "deep") == "nfs4"
    assert local.filesystem_type(share) == "nfs4"
    assert local.filesystem_type(tmp_path) == "ext4"
    assert local.filesystem_type(tmp_path / "my") == "tmpfs"
    monkeypatch.setattr(local, "MOUNTS", str(tmp_path / "absent"))
    assert local.filesystem_type(tmp_path) is None


@pytest.mark.anyio
async def test_a_writer_frozen_in_a_conditional_write_holds_up_only_that_file(
    tmp_path: Path,
) -> None:
    """The check and rename of a conditional write are locked per file: another writer of
    the same file waits at most a bounded time, then fails (transient); writers of other
    files in the directory go on; the lock files are no objects of the listing."""
    import fcntl

    store = LocalStore(str(tmp_path))
    await store.put("d/held.json", b"0", if_match="")
    await store.put("d/free.json", b"0", if_match="")
    # Another process frozen inside its write of d/held.json holds the file's lock.
    frozen = os.open(tmp_path / "d" / ".held.json.deltastream-lock", os.O_RDWR)
    fcntl.flock(frozen, fcntl.LOCK_EX)
    try:
        start = time.monotonic()
        with pytest.raises(StorageError, match="held its lock") as info:
            await store.put("d/held.json", b"1", if_match=(await store.head("d/held.json")).tag)
        assert 1.5 < time.monotonic() - start < 5
        assert info.value.uri == str(tmp_path / "d" / "held.json")
        assert is_transient(info.value)
        tag = (await store.head("d/free.json")).tag
        assert await store.put("d/free.json", b"1", if_match=tag)
    finally:
        os.close(frozen)
    assert [m.key for m in await collect(store, "d/")] == ["d/free.json", "d/held.json"]
    assert await store.get("d/held.json") == b"0"
