"""LocalStore: the shared store contract on a real directory, plus local-only behaviour
(paths escaping the root, mtimes) and ``open_store`` for local paths and ``file:`` URIs."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from storage_contract import Harness, StoreContract, collect

from deltastream.errors import InvalidArgumentError, ObjectNotFoundError
from deltastream.storage import LocalStore, S3Store, open_store


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
    ["gs://bucket/table", "abfss://container@account.dfs.core.windows.net/t", "http://host/t"],
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
    assert "only apply to s3://" in str(info.value)
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
