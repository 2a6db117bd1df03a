"""The behaviour every :class:`~deltastream.storage.ObjectStore` must share.

``StoreContract`` holds the tests; ``test_local.py`` and ``test_s3.py`` subclass it and
provide a ``harness`` fixture (a store rooted somewhere fresh, plus a way to create objects
under that root behind the store's back). The same tests thus run against the local
filesystem and, over HTTP, against moto's S3 server.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import anyio.to_thread
import pytest

from deltastream.errors import (
    InvalidArgumentError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
)
from deltastream.storage import ObjectMeta, ObjectStore

__all__ = ["Harness", "StoreContract", "byte_order", "collect", "not_found"]


@dataclass(frozen=True)
class Harness:
    """A store under test and a set-up function writing ``data`` at ``key`` below its root."""

    store: ObjectStore
    put: Callable[[str, bytes], None]


def byte_order(key: str) -> bytes:
    return key.encode("utf-8")


async def collect(
    store: ObjectStore, directory: str, start_after: str | None = None
) -> list[ObjectMeta]:
    return [meta async for meta in store.list_from(directory, start_after)]


async def not_found(call: Awaitable[object]) -> ObjectNotFoundError:
    """Await ``call``, which must raise ObjectNotFoundError; return the error."""
    with pytest.raises(ObjectNotFoundError) as info:
        await call
    return info.value


# A log directory with direct children (in no particular creation order) and objects in
# subdirectories that a listing of ``_delta_log/`` must not return.
LOG_CHILDREN: dict[str, bytes] = {
    "_delta_log/00000000000000000010.checkpoint.parquet": b"PAR1-checkpoint",
    "_delta_log/00000000000000000002.json": b'{"commitInfo":{}}\n' * 3,
    "_delta_log/00000000000000000000.json": b'{"protocol":{}}\n',
    "_delta_log/00000000000000000001.json": b'{"add":{}}\n{"add":{}}\n',
    "_delta_log/00000000000000000009.json": b"{}",
    "_delta_log/_last_checkpoint": b'{"version":10,"size":3}',
    "_delta_log/Z-upper.json": b"upper",
    "_delta_log/a b.json": b"space",
    "_delta_log/é-accent.json": b"accent",
    "_delta_log/日本.json": b"cjk",
    "_delta_log/😀.json": b"astral",
    "_delta_log/00000000000000000003.crc": b"",
}
NESTED: dict[str, bytes] = {
    "_delta_log/_sidecars/x.parquet": b"sidecar",
    "_delta_log/_staged_commits/00000000000000000011.uuid.json": b"staged",
    "_delta_log/zz/deeper/still.json": b"deep",
    "part-00000.parquet": b"root data file",
    "year=2024/part-00001.parquet": b"partitioned data file",
}

SPECIAL_DIR = "part=a b%20c/"
SPECIAL_KEYS: dict[str, bytes] = {
    "part=a b%20c/é.parquet": b"accented parquet",
    "part=a b%20c/100% done=yes.json": b"percent and equals",
    "part=a b%20c/日本 語 😀.bin": b"\x00\x01\x02 unicode",
}


class StoreContract:
    """Tests run against every store; subclasses provide the ``harness`` fixture."""

    @staticmethod
    def populate(h: Harness, objects: dict[str, bytes]) -> None:
        for key, data in objects.items():
            h.put(key, data)

    # ---------------------------------------------------------------- list_from

    # Set-up writes dominate on S3, so a test checks several cases against one populated
    # store (each assertion names its case) instead of being parametrized.

    @pytest.mark.anyio
    async def test_list_returns_direct_children_sorted_by_bytes(self, harness: Harness) -> None:
        self.populate(harness, {**LOG_CHILDREN, **NESTED})
        for directory in ("_delta_log/", "_delta_log"):  # the trailing "/" is implied
            listed = await collect(harness.store, directory)
            keys = [m.key for m in listed]
            assert keys == sorted(LOG_CHILDREN, key=byte_order), directory
            assert all(byte_order(a) < byte_order(b) for a, b in itertools.pairwise(keys))
            assert {m.key: m.size for m in listed} == {k: len(v) for k, v in LOG_CHILDREN.items()}
            assert not any("_sidecars" in k or "_staged_commits" in k or "/zz/" in k for k in keys)

    @pytest.mark.anyio
    async def test_list_root_returns_only_root_objects(self, harness: Harness) -> None:
        self.populate(harness, {**LOG_CHILDREN, **NESTED})
        listed = await collect(harness.store, "")
        assert [m.key for m in listed] == ["part-00000.parquet"]

    START_AFTER = (
        "_delta_log/",  # before every key of the directory
        "_delta_log/00000000000000000001.json",  # an existing key: excluded itself
        "_delta_log/00000000000000000005",  # between two keys
        "_delta_log/Z-upper.json",  # uppercase sorts after digits, before "_"
        "_delta_log/_last_checkpoint",  # "_" sorts after uppercase, before lowercase
        "_delta_log/a",  # a proper prefix of "_delta_log/a b.json"
        "_delta_log/é-accent.json",  # non-ASCII
        "_delta_log/😀.json",  # the greatest key
        "_delta_log/\U0010ffff",  # after everything
        "_delta_log/_sidecars/x.parquet",  # inside a subdirectory
        "",  # before everything
    )

    @pytest.mark.anyio
    async def test_list_start_after_is_strict(self, harness: Harness) -> None:
        self.populate(harness, {**LOG_CHILDREN, **NESTED})
        for start_after in self.START_AFTER:
            listed = await collect(harness.store, "_delta_log/", start_after)
            expected = sorted(
                (k for k in LOG_CHILDREN if byte_order(k) > byte_order(start_after)),
                key=byte_order,
            )
            assert [m.key for m in listed] == expected, start_after

    @pytest.mark.anyio
    async def test_list_missing_directory_yields_nothing(self, harness: Harness) -> None:
        self.populate(harness, LOG_CHILDREN)
        for directory in ("missing/", "_delta_log/missing/", "_delta/", "_", "_delta_log/0"):
            assert await collect(harness.store, directory) == [], directory

    @pytest.mark.anyio
    async def test_list_of_empty_store_yields_nothing(self, harness: Harness) -> None:
        assert await collect(harness.store, "") == []
        assert await collect(harness.store, "_delta_log/", "_delta_log/0") == []

    # ---------------------------------------------------------------- special keys

    @pytest.mark.anyio
    async def test_special_character_keys_round_trip(self, harness: Harness) -> None:
        self.populate(harness, SPECIAL_KEYS)
        listed = await collect(harness.store, SPECIAL_DIR)
        assert [m.key for m in listed] == sorted(SPECIAL_KEYS, key=byte_order)
        for meta in listed:
            assert meta.size == len(SPECIAL_KEYS[meta.key])
            assert await harness.store.get(meta.key) == SPECIAL_KEYS[meta.key]
            head = await harness.store.head(meta.key)
            assert (head.key, head.size) == (meta.key, meta.size)
        # Keys are used as given: nothing is percent-decoded (or encoded) on the way.
        assert await collect(harness.store, "part=a b c/") == []
        await not_found(harness.store.get("part=a b c/é.parquet"))
        await not_found(harness.store.head("part=a%20b%2520c/%C3%A9.parquet"))

    @pytest.mark.anyio
    async def test_special_character_key_start_after(self, harness: Harness) -> None:
        self.populate(harness, SPECIAL_KEYS)
        ordered = sorted(SPECIAL_KEYS, key=byte_order)
        listed = await collect(harness.store, SPECIAL_DIR, ordered[0])
        assert [m.key for m in listed] == ordered[1:]

    # ---------------------------------------------------------------- get

    DATA = bytes(range(256)) * 4  # 1024 bytes, every offset distinguishable by position

    @pytest.mark.anyio
    async def test_get_whole_object(self, harness: Harness) -> None:
        harness.put("_delta_log/00000000000000000000.json", self.DATA)
        assert await harness.store.get("_delta_log/00000000000000000000.json") == self.DATA

    @pytest.mark.anyio
    async def test_get_empty_object(self, harness: Harness) -> None:
        harness.put("empty", b"")
        assert await harness.store.get("empty") == b""
        assert (await harness.store.head("empty")).size == 0

    @pytest.mark.anyio
    async def test_get_byte_range_is_half_open(self, harness: Harness) -> None:
        harness.put("blob.bin", self.DATA)
        for start, end in [(0, 10), (5, 6), (0, 1024), (100, 1000), (1020, 1024), (1000, 5000)]:
            got = await harness.store.get("blob.bin", (start, end))
            assert got == self.DATA[start:end], (start, end)

    @pytest.mark.anyio
    async def test_get_empty_range_returns_empty_bytes(self, harness: Harness) -> None:
        harness.put("blob.bin", self.DATA)
        for byte_range in [(0, 0), (7, 7), (1024, 1024)]:
            assert await harness.store.get("blob.bin", byte_range) == b"", byte_range

    @pytest.mark.anyio
    async def test_range_past_the_end_returns_empty_bytes(self, harness: Harness) -> None:
        harness.put("blob.bin", self.DATA)  # 1024 bytes
        for byte_range in [(1024, 2048), (5000, 6000)]:
            assert await harness.store.get("blob.bin", byte_range) == b"", byte_range
        assert harness.store.stats.retries == 0

    @pytest.mark.anyio
    async def test_get_invalid_range_raises(self, harness: Harness) -> None:
        harness.put("blob.bin", self.DATA)
        for byte_range in [(5, 2), (-1, 4), (-3, -1)]:
            with pytest.raises(InvalidArgumentError) as info:
                await harness.store.get("blob.bin", byte_range)
            assert harness.store.uri_for("blob.bin") in str(info.value)
            assert "invalid byte range" in str(info.value)

    # ---------------------------------------------------------------- missing keys

    @pytest.mark.anyio
    async def test_missing_key_raises_object_not_found(self, harness: Harness) -> None:
        self.populate(harness, LOG_CHILDREN)
        store = harness.store
        for key in ("_delta_log/00000000000000000099.json", "nope/deeper/x.json", "é missing=1"):
            uri = store.uri_for(key)
            errors = [
                await not_found(store.get(key)),
                await not_found(store.get(key, (0, 4))),
                await not_found(store.head(key)),
            ]
            for err in errors:
                assert isinstance(err, FileNotFoundError)
                assert isinstance(err, StorageError)
                assert err.uri == uri
                assert str(err) == f"{uri}: not found"

    @pytest.mark.anyio
    async def test_open_file_reads_what_get_reads(self, harness: Harness) -> None:
        """Random access over an object (and, where the store opens files without the
        event loop, the same from a worker thread); a missing one is ObjectNotFoundError."""
        self.populate(harness, SPECIAL_KEYS)
        store = harness.store
        for key, data in SPECIAL_KEYS.items():
            handle = await store.open_file(key, len(data))
            handle.seek(1)
            assert handle.read() == data[1:], key
            handle.close()
            if store.opens_blocking:
                handle = await anyio.to_thread.run_sync(store.open_file_blocking, key, None)
                assert handle.read() == data, key
                handle.close()
        await not_found(store.open_file("nope/missing.parquet"))
        if store.opens_blocking:
            with pytest.raises(ObjectNotFoundError):
                await anyio.to_thread.run_sync(store.open_file_blocking, "nope/x.parquet", None)
        else:
            with pytest.raises(NotImplementedError):
                store.open_file_blocking("nope/x.parquet")

    @pytest.mark.anyio
    async def test_directory_is_not_an_object(self, harness: Harness) -> None:
        self.populate(harness, LOG_CHILDREN)
        for key in ("_delta_log", "_delta_log/"):
            await not_found(harness.store.get(key))
            await not_found(harness.store.head(key))

    # ---------------------------------------------------------------- head

    @pytest.mark.anyio
    async def test_head_reports_size_and_modification_time(self, harness: Harness) -> None:
        before_ms = time.time() * 1000
        harness.put("_delta_log/00000000000000000000.json", self.DATA)
        after_ms = time.time() * 1000
        meta = await harness.store.head("_delta_log/00000000000000000000.json")
        assert meta.key == "_delta_log/00000000000000000000.json"
        assert meta.size == len(self.DATA)
        assert isinstance(meta.last_modified_ms, int)
        # Milliseconds since the epoch, not seconds or nanoseconds; S3 reports whole seconds.
        assert before_ms - 2000 <= meta.last_modified_ms <= after_ms + 2000
        (listed,) = await collect(harness.store, "_delta_log/")
        assert listed.size == meta.size
        assert abs(listed.last_modified_ms - meta.last_modified_ms) < 1000

    # ---------------------------------------------------------------- get_many

    @pytest.mark.anyio
    async def test_get_many_returns_bytes_in_key_order(self, harness: Harness) -> None:
        objects = {f"_delta_log/{v:020d}.json": f"commit {v}\n".encode() * v for v in range(40)}
        self.populate(harness, objects)
        keys = list(objects)
        random.Random(7).shuffle(keys)
        keys += [keys[3], keys[0]]  # duplicates are fetched (and placed) as asked
        assert await harness.store.get_many(keys) == [objects[k] for k in keys]
        assert await harness.store.get_many([]) == []

    @pytest.mark.anyio
    async def test_get_many_missing_key_raises_object_not_found(self, harness: Harness) -> None:
        objects = {f"_delta_log/{v:020d}.json": b"{}" for v in range(5)}
        self.populate(harness, objects)
        missing = "_delta_log/00000000000000000099.json"
        keys = [*sorted(objects)[:2], missing, *sorted(objects)[2:]]
        # Callers catch ObjectNotFoundError (a vanished commit); it must not come wrapped
        # in an exception group by the concurrent fetch.
        with pytest.raises(ObjectNotFoundError) as info:
            await harness.store.get_many(keys)
        assert info.value.uri == harness.store.uri_for(missing)

    # ---------------------------------------------------------------- writes

    @pytest.mark.anyio
    async def test_put_then_get_and_head(self, harness: Harness) -> None:
        store = harness.store
        tag = await store.put("state/a b%/position.json", b'{"v": 1}')
        assert tag
        assert await store.get("state/a b%/position.json") == b'{"v": 1}'
        meta = await store.head("state/a b%/position.json")
        assert (meta.size, meta.tag) == (8, tag)
        assert await store.get_tagged("state/a b%/position.json") == (b'{"v": 1}', tag)
        listed = await collect(store, "state/a b%/")
        assert [m.key for m in listed] == ["state/a b%/position.json"]
        # A listing carries the same tag: one LIST tells which objects changed.
        assert [m.tag for m in listed] == [tag]

    @pytest.mark.anyio
    async def test_put_replaces_and_changes_the_tag(self, harness: Harness) -> None:
        store = harness.store
        first = await store.put("s/k", b"one")
        second = await store.put("s/k", b"two!")
        assert second != first
        assert await store.get_tagged("s/k") == (b"two!", second)

    @pytest.mark.anyio
    async def test_put_if_absent(self, harness: Harness) -> None:
        store = harness.store
        tag = await store.put("s/k", b"mine", if_match="")
        with pytest.raises(PreconditionFailedError) as info:
            await store.put("s/k", b"theirs", if_match="")
        assert info.value.uri == store.uri_for("s/k")
        assert await store.get_tagged("s/k") == (b"mine", tag)

    @pytest.mark.anyio
    async def test_put_if_match_fences_a_stale_writer(self, harness: Harness) -> None:
        store = harness.store
        base = await store.put("s/k", b"v1")
        mine = await store.put("s/k", b"v2", if_match=base)
        # A second writer still holding the first tag must lose, and change nothing.
        with pytest.raises(PreconditionFailedError):
            await store.put("s/k", b"stale", if_match=base)
        with pytest.raises(PreconditionFailedError):
            await store.put("s/missing", b"x", if_match=base)
        assert await store.get("s/k") == b"v2"
        assert await store.put("s/k", b"v3", if_match=mine)
        assert await store.get("s/k") == b"v3"

    @pytest.mark.anyio
    async def test_delete(self, harness: Harness) -> None:
        store = harness.store
        await store.put("s/k", b"x")
        await store.delete("s/k")
        await not_found(store.get("s/k"))
        await store.delete("s/k")  # deleting what is gone is not an error
        assert await collect(store, "s/") == []
