"""S3Store over HTTP against moto's server: the shared store contract (directly and through
a pass-through proxy), pagination, option parsing, ``open_store`` for ``s3://`` URIs, the
retry policy against real HTTP faults, the client's lifecycle, and change feeds fed by the
bucket's event notifications through moto's SQS (moto delivers them as S3 does).

Nothing is patched: every request goes through aiobotocore and aiohttp to a real socket.
Faults come from :class:`faultproxy.FaultProxy`, an HTTP reverse proxy in front of moto, with
queued faults and ``Connection: close`` on every answer (:func:`new_proxy`).
"""

from __future__ import annotations

import http.client
import itertools
import json
import logging
import re
import socket
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import quote, quote_plus, urlsplit

import aiohttp
import anyio
import pytest
from conftest import notify
from faultproxy import FaultProxy
from storage_contract import Harness, StoreContract, byte_order, collect

from deltastream.errors import (
    AccessDeniedError,
    DataFileError,
    InvalidArgumentError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
    UnsafePathError,
)
from deltastream.storage import ChangeFeed, S3Options, S3Store, StoreStats, open_store
from deltastream.storage.paths import ExternalPaths
from deltastream.storage.retry import RetryEvent

PREFIX = "tables/t1"
KEY = "_delta_log/00000000000000000000.json"
DATA = b'{"protocol":{"minReaderVersion":1,"minWriterVersion":2}}\n' * 20
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@pytest.fixture(scope="module")
def boto(s3_server: Any) -> Any:
    """One synchronous boto3 client for set-up writes (creating clients is slow)."""
    return s3_server.client()


def make_store(endpoint: str, bucket: str, prefix: str = PREFIX, **options: str) -> S3Store:
    opts = {"endpoint_url": endpoint, "region": "us-east-1", **CREDENTIALS, **options}
    store = open_store(f"s3://{bucket}/{prefix}", opts)
    assert isinstance(store, S3Store)
    return store


def new_bucket(boto: Any) -> str:
    name = f"test-{uuid.uuid4().hex[:12]}"
    boto.create_bucket(Bucket=name)
    return name


# The contract tests share one bucket and one store per module (creating an aiobotocore
# client costs ~0.2 s of model loading); each test starts from an empty prefix.


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module-scoped, so that module-scoped async fixtures (the shared stores) can exist."""
    return "asyncio"


@pytest.fixture(scope="module")
def contract_bucket(boto: Any) -> str:
    return new_bucket(boto)


def empty_prefix(boto: Any, bucket: str, prefix: str) -> None:
    pages = boto.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/")
    for page in pages:
        objects = [{"Key": o["Key"]} for o in page.get("Contents", ())]
        if objects:
            boto.delete_objects(Bucket=bucket, Delete={"Objects": objects, "Quiet": True})


def contract_harness(store: S3Store, boto: Any, bucket: str) -> Iterator[Harness]:
    def put(key: str, data: bytes) -> None:
        boto.put_object(Bucket=bucket, Key=f"{PREFIX}/{key}", Body=data)

    empty_prefix(boto, bucket, PREFIX)
    try:
        yield Harness(store, put)
    finally:
        empty_prefix(boto, bucket, PREFIX)


@pytest.fixture(scope="module")
async def direct_store(s3_server: Any, contract_bucket: str) -> AsyncIterator[S3Store]:
    async with make_store(s3_server.endpoint, contract_bucket) as store:
        yield store


@pytest.fixture
def harness(direct_store: S3Store, boto: Any, contract_bucket: str) -> Iterator[Harness]:
    yield from contract_harness(direct_store, boto, contract_bucket)


class TestS3StoreContract(StoreContract):
    pass


def new_proxy(upstream: str) -> FaultProxy:
    """A fault proxy for queued faults (not started): a fresh connection per request, so
    that a fault never leaks into the next request through a reused socket."""
    return FaultProxy(upstream, keep_alive=False)


@pytest.fixture(scope="module")
def passthrough_proxy(s3_server: Any) -> Iterator[FaultProxy]:
    with new_proxy(s3_server.endpoint) as proxy:
        yield proxy


@pytest.fixture(scope="module")
async def proxied_store(
    passthrough_proxy: FaultProxy, contract_bucket: str
) -> AsyncIterator[S3Store]:
    async with make_store(passthrough_proxy.url, contract_bucket) as store:
        yield store


class TestS3StoreContractThroughProxy(StoreContract):
    """The same contract through the fault proxy with no faults queued: the proxy forwards
    HEADs, ranged GETs and odd keys faithfully, so the retry tests below test the store."""

    @pytest.fixture
    def harness(
        self,
        proxied_store: S3Store,
        passthrough_proxy: FaultProxy,
        boto: Any,
        contract_bucket: str,
    ) -> Iterator[Harness]:
        seen_before = len(passthrough_proxy.seen)
        yield from contract_harness(proxied_store, boto, contract_bucket)
        seen = passthrough_proxy.seen[seen_before:]
        assert all(s.outcome.startswith("forwarded ") for s in seen)
        assert proxied_store.stats.retries == 0


# -------------------------------------------------------------------- S3-only listing


@pytest.mark.anyio
async def test_directory_marker_objects_are_skipped(s3_bucket: Any, boto: Any) -> None:
    for key in ("_delta_log/", "_delta_log/00000000000000000000.json", "_delta_log/_sidecars/"):
        boto.put_object(Bucket=s3_bucket.name, Key=f"{PREFIX}/{key}", Body=b"")
    async with open_store(s3_bucket.uri(PREFIX), s3_bucket.storage_options) as store:
        listed = await collect(store, "_delta_log/")
    assert [m.key for m in listed] == ["_delta_log/00000000000000000000.json"]


@pytest.mark.anyio
async def test_sibling_prefixes_do_not_leak_into_the_store(s3_bucket: Any, boto: Any) -> None:
    for key, data in {
        "tables/t1/_delta_log/00000000000000000000.json": b"mine",
        "tables/t10/_delta_log/00000000000000000000.json": b"sibling",
        "tables/t1_old/_delta_log/00000000000000000001.json": b"sibling",
        "tables/t1.json": b"sibling",
    }.items():
        boto.put_object(Bucket=s3_bucket.name, Key=key, Body=data)
    async with open_store(s3_bucket.uri("tables/t1/"), s3_bucket.storage_options) as store:
        assert store.root_uri == f"s3://{s3_bucket.name}/tables/t1"
        listed = await collect(store, "_delta_log/")
        assert [m.key for m in listed] == ["_delta_log/00000000000000000000.json"]
        assert await collect(store, "") == []
        assert await store.get("_delta_log/00000000000000000000.json") == b"mine"


@pytest.mark.anyio
async def test_store_at_the_bucket_root(s3_bucket: Any, boto: Any) -> None:
    for key in (
        "_delta_log/00000000000000000001.json",
        "_delta_log/00000000000000000000.json",
        "part-0.parquet",
        "dir/part-1.parquet",
    ):
        boto.put_object(Bucket=s3_bucket.name, Key=key, Body=key.encode())
    async with open_store(s3_bucket.uri(), s3_bucket.storage_options) as store:
        assert store.root_uri == f"s3://{s3_bucket.name}"
        assert [m.key for m in await collect(store, "")] == ["part-0.parquet"]
        assert [m.key for m in await collect(store, "_delta_log/", "_delta_log/0")] == [
            "_delta_log/00000000000000000000.json",
            "_delta_log/00000000000000000001.json",
        ]
        assert await store.get("dir/part-1.parquet") == b"dir/part-1.parquet"
        assert store.uri_for("x") == f"s3://{s3_bucket.name}/x"


@pytest.mark.anyio
async def test_missing_bucket_is_a_storage_error(s3_server: Any) -> None:
    async with make_store(s3_server.endpoint, f"missing-{uuid.uuid4().hex[:8]}") as store:
        with pytest.raises(StorageError) as info:
            await store.get(KEY)
    assert store.uri_for(KEY) in str(info.value)
    assert store.stats.retries == 0


# -------------------------------------------------------------------- pagination

PAGED_PREFIX = "big"
PAGED_KEYS = [f"_delta_log/{v:020d}.json" for v in range(1024)]
# Subdirectories come back as common prefixes, which count towards the 1000-entry page.
PAGED_NESTED = ["_delta_log/_sidecars/a.parquet", "_delta_log/_staged_commits/b.json"]


@pytest.fixture(scope="module")
def paged_bucket(s3_server: Any, boto: Any) -> str:
    """A bucket with more keys in one directory than a ListObjectsV2 page (1000) holds.

    The objects are written with plain HTTP PUTs on one keep-alive connection: moto does not
    check signatures, and skipping boto3's per-request work halves this set-up's time.
    """
    name = new_bucket(boto)
    parts = urlsplit(s3_server.endpoint)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        for key in [*PAGED_KEYS, *PAGED_NESTED]:
            conn.request(
                "PUT", "/" + quote(f"{name}/{PAGED_PREFIX}/{key}"), body=key[-10:].encode()
            )
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200, (key, resp.status)
    finally:
        conn.close()
    count = boto.list_objects_v2(Bucket=name, Prefix=f"{PAGED_PREFIX}/")["KeyCount"]
    assert count == 1000  # a full first page: there really are more keys than one page holds
    return name


@pytest.mark.anyio
async def test_listing_spans_pages(s3_server: Any, paged_bucket: str) -> None:
    async with make_store(s3_server.endpoint, paged_bucket, PAGED_PREFIX) as store:
        listed = await collect(store, "_delta_log/")
    keys = [m.key for m in listed]
    assert len(keys) == len(PAGED_KEYS)
    assert keys == sorted(PAGED_KEYS, key=byte_order)
    assert len(set(keys)) == len(keys)
    assert all(m.size == 10 for m in listed)
    assert store.stats.list_requests == 2


@pytest.mark.anyio
@pytest.mark.parametrize(("start_index", "requests"), [(9, 2), (1000, 1), (1023, 1)])
async def test_listing_spans_pages_after_start(
    s3_server: Any, paged_bucket: str, start_index: int, requests: int
) -> None:
    async with make_store(s3_server.endpoint, paged_bucket, PAGED_PREFIX) as store:
        listed = await collect(store, "_delta_log/", PAGED_KEYS[start_index])
    assert [m.key for m in listed] == PAGED_KEYS[start_index + 1 :]
    assert store.stats.list_requests == requests


@pytest.mark.anyio
async def test_failed_page_is_retried_from_its_continuation_token(
    s3_server: Any, paged_bucket: str, fault_proxy: FaultProxy
) -> None:
    # Page 1 goes through; page 2 fails twice (a dropped connection costs two HTTP tries).
    fault_proxy.inject("pass", "slowdown", "drop", "drop")
    async with make_store(
        fault_proxy.url, paged_bucket, PAGED_PREFIX, retry_base_delay="0.001"
    ) as store:
        listed = await collect(store, "_delta_log/")
    assert [m.key for m in listed] == PAGED_KEYS
    assert store.stats.retries == 2
    assert store.stats.list_requests == 4
    outcomes = [s.outcome for s in fault_proxy.seen]
    assert outcomes == ["forwarded 200", "slowdown", "drop", "drop", "forwarded 200"]
    assert "continuation-token" in fault_proxy.seen[-1].path


# -------------------------------------------------------------------- options


def test_options_accept_aws_spellings_case_insensitively() -> None:
    opts = S3Options.from_storage_options(
        {
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
            "AWS_REGION": "eu-west-3",
            "AWS_ACCESS_KEY_ID": "AKID",
            "aws_secret_access_key": "SECRET",
            "Aws_Session_Token": "TOKEN",
            "AWS_PROFILE": "dev",
            "MAX_ATTEMPTS": "4",
            "Retry_Base_Delay": "0.25",
            "retry_max_delay": "2",
            "CONNECT_TIMEOUT": "1.5",
            "read_timeout": "30",
            "MAX_CONCURRENCY": "5",
            "AWS_ALLOW_HTTP": "true",  # accepted for delta-rs compatibility, no effect
        }
    )
    assert opts == S3Options(
        endpoint_url="http://127.0.0.1:9000",
        region="eu-west-3",
        access_key_id="AKID",
        secret_access_key="SECRET",
        session_token="TOKEN",
        profile="dev",
        max_attempts=4,
        retry_base_delay=0.25,
        retry_max_delay=2.0,
        connect_timeout=1.5,
        read_timeout=30.0,
        max_concurrency=5,
    )
    assert S3Store("b", "", opts).max_concurrency == 5


@pytest.mark.parametrize(
    ("options", "field", "value"),
    [
        ({"endpoint": "http://h:1"}, "endpoint_url", "http://h:1"),
        ({"AWS_ENDPOINT": "http://h:2"}, "endpoint_url", "http://h:2"),
        ({"endpoint_url": "http://h:3"}, "endpoint_url", "http://h:3"),
        ({"AWS_DEFAULT_REGION": "ap-south-1"}, "region", "ap-south-1"),
        ({"region_name": "us-west-2"}, "region", "us-west-2"),
        ({"AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "TRUE"}, "addressing_style", "virtual"),
        ({"aws_virtual_hosted_style_request": "false"}, "addressing_style", "path"),
        ({"addressing_style": "auto"}, "addressing_style", "auto"),
    ],
)
def test_options_aliases(options: dict[str, str], field: str, value: str) -> None:
    assert getattr(S3Options.from_storage_options(options), field) == value


def test_options_defaults() -> None:
    assert S3Options.from_storage_options(None) == S3Options()
    assert S3Options.from_storage_options({}) == S3Options()
    assert S3Options.from_storage_options({"aws_s3_allow_unsafe_rename": "true"}) == S3Options()


@pytest.mark.parametrize("key", ["AWS_ENDPOINT_URLL", "bucket", "aws_secret_key"])
def test_options_reject_unknown_keys_listing_known_ones(key: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        S3Options.from_storage_options({"region": "us-east-1", key: "x"})
    message = str(info.value)
    assert repr(key) in message
    assert "known options:" in message
    for known in ("aws_endpoint_url", "aws_region", "aws_access_key_id", "max_attempts"):
        assert known in message


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("max_attempts", "three", "is not a number"),
        ("AWS_MAX_ATTEMPTS", "3", "unknown S3 storage option"),
        ("max_attempts", "", "is not a number"),
        ("max_attempts", "2.5", "is not a number"),
        ("max_attempts", "0", "must be >= 1"),
        ("max_concurrency", "-4", "must be >= 1"),
        ("retry_base_delay", "fast", "is not a number"),
        ("read_timeout", "1s", "is not a number"),
        ("addressing_style", "sideways", "must be path, virtual or auto"),
    ],
)
def test_options_reject_bad_values(key: str, value: str, problem: str) -> None:
    with pytest.raises(InvalidArgumentError, match=problem) as info:
        S3Options.from_storage_options({key: value})
    assert key in str(info.value)


# -------------------------------------------------------------------- open_store


@pytest.mark.parametrize(
    ("uri", "bucket", "prefix"),
    [
        ("s3://bucket/prefix", "bucket", "prefix"),
        ("s3://bucket/prefix/deeper/", "bucket", "prefix/deeper"),
        ("s3a://bucket/prefix", "bucket", "prefix"),
        ("S3A://bucket/prefix", "bucket", "prefix"),
        ("s3://bucket", "bucket", ""),
        ("s3://bucket/", "bucket", ""),
        ("s3://bucket/a%20b/c=d", "bucket", "a b/c=d"),
    ],
)
def test_open_store_s3_uris(uri: str, bucket: str, prefix: str) -> None:
    store = open_store(uri, {"AWS_REGION": "eu-central-1", "max_attempts": "2"})
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix) == (bucket, prefix)
    assert store.root_uri == (f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}")
    assert store.options.region == "eu-central-1"
    assert store.options.max_attempts == 2


def test_open_store_s3_needs_a_bucket() -> None:
    with pytest.raises(InvalidArgumentError, match="needs a bucket"):
        open_store("s3:///prefix")


def test_open_store_s3_rejects_bad_options() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown S3 storage option"):
        open_store("s3://bucket/t", {"AWS_REGOIN": "us-east-1"})


@pytest.mark.anyio
async def test_open_store_s3_reads_through_the_options(s3_bucket: Any, boto: Any) -> None:
    boto.put_object(Bucket=s3_bucket.name, Key="a b/t/_delta_log/x.json", Body=b"x")
    options = {
        "AWS_ENDPOINT_URL": s3_bucket.server.endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    for scheme in ("s3", "s3a"):
        async with open_store(f"{scheme}://{s3_bucket.name}/a%20b/t", options) as store:
            assert await store.get("_delta_log/x.json") == b"x"


# -------------------------------------------------------------------- resolving log paths


def test_resolve_reads_objects_under_the_prefix_through_the_store() -> None:
    store = S3Store("bucket", "a b/t")
    for path in (
        "p=1/x%20y.parquet",
        "s3://bucket/a%20b/t/p=1/x%20y.parquet",
        "s3a://bucket/a%20b/t/p=1/x%20y.parquet",
        "S3://bucket/a b/t/p=1/x y.parquet",
    ):
        assert store.resolve(path) == (store, "p=1/x y.parquet"), path


def test_resolve_reads_other_objects_through_one_store_per_bucket() -> None:
    store = S3Store("bucket", "t", S3Options(region="eu-central-1"))
    store.retry_listener = lambda event: None
    store.external_paths = ExternalPaths(allow_all=True)
    same, key = store.resolve("s3://bucket/t2/x")
    assert isinstance(same, S3Store) and same is not store
    assert (same.bucket, same.prefix, key) == ("bucket", "", "t2/x")
    assert same.options is store.options and same.stats is store.stats
    assert same.retry_listener is store.retry_listener
    assert store.resolve("s3a://bucket/x")[0] is same
    other, key = store.resolve("s3://other/t/x")
    assert isinstance(other, S3Store) and (other.bucket, other.prefix, key) == ("other", "", "t/x")


@pytest.mark.parametrize("path", ["/t/x", "file:///t/x", "s3n://bucket/t/x", "s3:/bucket/t/x"])
def test_resolve_refuses_paths_no_s3_store_can_read(path: str) -> None:
    store = S3Store("bucket", "t")
    with pytest.raises(UnsafePathError, match="outside the table"):
        store.resolve(path)
    store.external_paths = ExternalPaths(allow_all=True)
    with pytest.raises(DataFileError, match="cannot read files from that location") as info:
        store.resolve(path)
    assert info.value.path == path


@pytest.mark.parametrize("path", ["s3://other/t/x", "s3://bucket/t2/x", "s3://bucket/x", "../x"])
def test_resolve_refuses_other_buckets_and_prefixes_by_default(path: str) -> None:
    with pytest.raises(UnsafePathError, match="s3://bucket/t"):
        S3Store("bucket", "t").resolve(path)


def test_resolve_allows_only_the_roots_given() -> None:
    store = S3Store("bucket", "t")
    store.external_paths = ExternalPaths.of("s3://shared/src")
    other, key = store.resolve("s3://shared/src/x.parquet")
    assert isinstance(other, S3Store) and (other.bucket, key) == ("shared", "src/x.parquet")
    with pytest.raises(UnsafePathError):
        store.resolve("s3://shared/other/x.parquet")


def test_resolve_needs_a_bucket() -> None:
    store = S3Store("bucket", "t")
    store.external_paths = ExternalPaths(allow_all=True)
    with pytest.raises(InvalidArgumentError, match="needs a bucket"):
        store.resolve("s3:///t/x")


# -------------------------------------------------------------------- retries over HTTP


MANY = {f"_delta_log/{v:020d}.json": f"commit {v}".encode() for v in range(1, 9)}
FAST_RETRIES = {"retry_base_delay": "0.001", "retry_max_delay": "0.01"}


@pytest.fixture(scope="module")
def retry_bucket(boto: Any) -> str:
    """A bucket holding KEY and ``_delta_log/_last_checkpoint`` under PREFIX (and MANY
    elsewhere); the retry tests only read it."""
    name = new_bucket(boto)
    boto.put_object(Bucket=name, Key=f"{PREFIX}/{KEY}", Body=DATA)
    boto.put_object(Bucket=name, Key=f"{PREFIX}/_delta_log/_last_checkpoint", Body=b"{}")
    for key, data in MANY.items():
        boto.put_object(Bucket=name, Key=f"many/{key}", Body=data)
    return name


@pytest.fixture(scope="module")
def module_fault_proxy(s3_server: Any) -> Iterator[FaultProxy]:
    with new_proxy(s3_server.endpoint) as proxy:
        yield proxy


@pytest.fixture
def fault_proxy(module_fault_proxy: FaultProxy) -> Iterator[FaultProxy]:
    """The fault proxy, with no faults queued and no requests seen yet."""
    module_fault_proxy.reset()
    yield module_fault_proxy
    module_fault_proxy.reset()


@pytest.fixture(scope="module")
async def shared_stores() -> AsyncIterator[dict[tuple[tuple[str, str], ...], S3Store]]:
    stores: dict[tuple[tuple[str, str], ...], S3Store] = {}
    yield stores
    for store in stores.values():
        await store.aclose()


@pytest.fixture
def proxied(
    shared_stores: dict[tuple[tuple[str, str], ...], S3Store],
    fault_proxy: FaultProxy,
    retry_bucket: str,
) -> Callable[..., S3Store]:
    """Stores on ``retry_bucket`` behind the fault proxy, one per set of options.

    They are shared across tests (creating a client is slow), with fresh stats per test;
    tests must not close them (the lifecycle tests use ``fresh_store``).
    """
    for store in shared_stores.values():
        store.stats = StoreStats()

    def get(prefix: str = PREFIX, **options: str) -> S3Store:
        options = {**FAST_RETRIES, **options}
        key = (("prefix", prefix), *sorted(options.items()))
        if key not in shared_stores:
            shared_stores[key] = make_store(fault_proxy.url, retry_bucket, prefix, **options)
        return shared_stores[key]

    return get


_fresh = itertools.count(1)


@pytest.fixture
def fresh_store(fault_proxy: FaultProxy, retry_bucket: str) -> Callable[[], S3Store]:
    """A new store behind the proxy per call, with a client of its own (stores with equal
    options share one, so each gets a read timeout of its own); the test closes it."""
    return lambda: make_store(
        fault_proxy.url,
        retry_bucket,
        read_timeout=f"{60 + next(_fresh) / 1000:.3f}",
        **FAST_RETRIES,
    )


Op = Callable[[S3Store], Awaitable[object]]


async def _list(store: S3Store) -> object:
    return [m.key for m in await collect(store, "_delta_log/")]


async def _head(store: S3Store) -> object:
    meta = await store.head(KEY)
    return (meta.key, meta.size)


OPS: dict[str, tuple[Op, object, str, str]] = {
    # name: (operation, expected result, key of the URI in errors, HTTP method)
    "get": (lambda s: s.get(KEY), DATA, KEY, "GET"),
    "get-range": (lambda s: s.get(KEY, (10, 70)), DATA[10:70], KEY, "GET"),
    "head": (_head, (KEY, len(DATA)), KEY, "HEAD"),
    "list": (_list, [KEY, "_delta_log/_last_checkpoint"], "_delta_log/", "GET"),
}

# HTTP requests one failed store attempt consumes. When a connection drops before any
# response, aiohttp (>= 3.x, RFC 9112 section 9.3.1) silently re-sends an idempotent request
# once; only if that fails too does the store see an error and apply its own retry policy.
TRIES = {"slowdown": 1, "internal": 1, "denied": 1, "drop": 2, "reset": 2}

# The reason a failure names: HEAD responses have no body, so botocore only has the status.
REASONS = {
    ("slowdown", "HEAD"): "503",
    ("slowdown", "GET"): "SlowDown",
    ("internal", "HEAD"): "500",
    ("internal", "GET"): "InternalError",
    ("denied", "HEAD"): "403",
    ("denied", "GET"): "AccessDenied",
    ("drop", "HEAD"): "ConnectionClosedError",
    ("drop", "GET"): "ConnectionClosedError",
}


@pytest.mark.anyio
@pytest.mark.parametrize("fault", ["slowdown", "internal", "drop", "reset"])
@pytest.mark.parametrize("op_name", list(OPS))
async def test_transient_faults_are_retried(
    proxied: Callable[..., S3Store], fault_proxy: FaultProxy, op_name: str, fault: str
) -> None:
    op, expected, _, method = OPS[op_name]
    failed = [fault] * (2 * TRIES[fault])  # two failed attempts
    fault_proxy.inject(*failed)
    store = proxied()
    assert await op(store) == expected
    assert store.stats.retries == 2
    seen = fault_proxy.seen
    assert [s.method for s in seen] == [method] * (len(failed) + 1)
    status = 206 if op_name == "get-range" else 200
    assert [s.outcome for s in seen] == [*failed, f"forwarded {status}"]


@pytest.mark.anyio
async def test_mixed_faults_are_all_retried(
    proxied: Callable[..., S3Store], fault_proxy: FaultProxy
) -> None:
    fault_proxy.inject("slowdown", "internal", "drop", "drop", "reset", "reset", "slowdown")
    store = proxied(max_attempts="6")
    assert await store.get(KEY) == DATA
    assert store.stats.retries == 5
    assert store.stats.get_requests == 6
    assert fault_proxy.pending == 0
    assert len(fault_proxy.seen) == 8


@pytest.mark.anyio
async def test_get_many_retries_each_failed_fetch(
    proxied: Callable[..., S3Store], fault_proxy: FaultProxy
) -> None:
    keys = sorted(MANY, reverse=True)
    # Only faults that cost exactly one HTTP try: with concurrent requests, aiohttp's own
    # re-send after a drop could take the next queued fault.
    fault_proxy.inject("slowdown", "internal", "slowdown")
    store = proxied("many")
    assert await store.get_many(keys) == [MANY[k] for k in keys]
    assert store.stats.retries == 3
    assert store.stats.get_requests == len(keys) + 3
    assert len(fault_proxy.seen) == len(keys) + 3


@pytest.mark.anyio
@pytest.mark.parametrize("fault", ["slowdown", "internal", "drop"])
@pytest.mark.parametrize("op_name", list(OPS))
async def test_gives_up_after_max_attempts(
    proxied: Callable[..., S3Store], fault_proxy: FaultProxy, op_name: str, fault: str
) -> None:
    op, _, uri_key, method = OPS[op_name]
    fault_proxy.inject(*[fault] * (3 * TRIES[fault] + 2))
    store = proxied(max_attempts="3")
    with pytest.raises(StorageError) as info:
        await op(store)
    err = info.value
    assert not isinstance(err, ObjectNotFoundError)
    assert err.uri == store.uri_for(uri_key)
    message = str(err)
    assert message.startswith(f"{store.uri_for(uri_key)}: ")
    assert "failed after 3 attempt(s)" in message
    assert REASONS[fault, method] in message
    assert store.stats.retries == 2
    assert len(fault_proxy.seen) == 3 * TRIES[fault]
    assert fault_proxy.pending == 2


@pytest.mark.anyio
async def test_single_attempt_means_no_retries(
    proxied: Callable[..., S3Store], fault_proxy: FaultProxy
) -> None:
    fault_proxy.inject("slowdown")
    store = proxied(max_attempts="1")
    with pytest.raises(StorageError, match=r"failed after 1 attempt\(s\)"):
        await store.get(KEY)
    assert store.stats.retries == 0
    assert await store.get(KEY) == DATA  # the fault was transient; the store still works


@pytest.mark.anyio
@pytest.mark.parametrize("op_name", list(OPS))
async def test_access_denied_is_not_retried(
    proxied: Callable[..., S3Store], fault_proxy: FaultProxy, op_name: str
) -> None:
    op, _, uri_key, method = OPS[op_name]
    fault_proxy.inject("denied", "denied")
    store = proxied()
    with pytest.raises(StorageError) as info:
        await op(store)
    assert isinstance(info.value, AccessDeniedError)
    assert info.value.uri == store.uri_for(uri_key)
    assert "failed after 1 attempt(s)" in str(info.value)
    assert REASONS["denied", method] in str(info.value)
    assert store.stats.retries == 0
    assert [s.outcome for s in fault_proxy.seen] == ["denied"]
    assert fault_proxy.pending == 1


@pytest.mark.anyio
@pytest.mark.parametrize("op_name", ["get", "get-range", "head"])
async def test_not_found_is_not_retried(
    proxied: Callable[..., S3Store], fault_proxy: FaultProxy, op_name: str
) -> None:
    missing = "_delta_log/00000000000000000042.json"
    calls: dict[str, Op] = {
        "get": lambda s: s.get(missing),
        "get-range": lambda s: s.get(missing, (0, 10)),
        "head": lambda s: s.head(missing),
    }
    store = proxied()
    with pytest.raises(ObjectNotFoundError) as info:
        await calls[op_name](store)
    assert info.value.uri == store.uri_for(missing)
    assert str(info.value) == f"{store.uri_for(missing)}: not found"
    assert store.stats.retries == 0
    assert [s.outcome for s in fault_proxy.seen] == ["forwarded 404"]


@pytest.mark.anyio
@pytest.mark.parametrize("conditional", ["absent", "match"])
async def test_conditional_put_whose_reply_was_lost_succeeds(
    proxied: Callable[..., S3Store], fault_proxy: FaultProxy, conditional: str
) -> None:
    """The first PUT lands but its reply is lost; the re-sent PUT then fails its own
    precondition. The store must see that the object holds its bytes and succeed."""
    store = proxied()
    key = f"state/lost-{conditional}.json"
    await store.delete(key)
    if_match = "" if conditional == "absent" else await store.put(key, b"before")
    fault_proxy.reset()
    fault_proxy.inject("lost", "lost")
    tag = await store.put(key, b"after", if_match=if_match)
    assert await store.get_tagged(key) == (b"after", tag)
    outcomes = [s.outcome for s in fault_proxy.seen]
    assert outcomes.count("forwarded 412") >= 1, outcomes


@pytest.mark.anyio
async def test_conditional_put_conflict_is_not_masked_by_the_retry_check(
    proxied: Callable[..., S3Store],
) -> None:
    store = proxied()
    key = "state/conflict.json"
    await store.delete(key)
    stale = await store.put(key, b"v1")
    await store.put(key, b"v2")
    with pytest.raises(PreconditionFailedError):
        await store.put(key, b"v3", if_match=stale)
    assert await store.get(key) == b"v2"


#: The operation a retry report names, per entry of OPS.
OPERATIONS = {"get": "GET", "get-range": "GET", "head": "HEAD", "list": "LIST"}


@pytest.mark.anyio
@pytest.mark.parametrize("op_name", list(OPS))
async def test_retries_are_reported_to_the_listener(
    fresh_store: Callable[[], S3Store],
    fault_proxy: FaultProxy,
    caplog: pytest.LogCaptureFixture,
    op_name: str,
) -> None:
    op, expected, uri_key, method = OPS[op_name]
    fault_proxy.inject("slowdown", "slowdown", "internal")
    events: list[RetryEvent] = []
    async with fresh_store() as store:
        store.retry_listener = events.append
        with caplog.at_level(logging.DEBUG, logger="deltastream.storage"):
            assert await op(store) == expected
    assert store.stats.retries == 3
    assert [(e.operation, e.target, e.attempt) for e in events] == [
        (OPERATIONS[op_name], store.uri_for(uri_key), n) for n in (1, 2, 3)
    ]
    # A HEAD's error has no body: its cause is only the status.
    if method == "HEAD":
        assert [e.cause for e in events] == ["503", "503", "500"]
    else:
        assert [e.cause for e in events] == ["503 SlowDown", "503 SlowDown", "500 InternalError"]
    assert all(0 <= e.delay <= 0.01 for e in events)  # FAST_RETRIES: capped at 10 ms
    # The listener reports the retries: the store logs no line of its own.
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


@pytest.mark.anyio
async def test_retries_of_a_put_name_the_operation(
    fresh_store: Callable[[], S3Store], fault_proxy: FaultProxy
) -> None:
    events: list[RetryEvent] = []
    async with fresh_store() as store:
        store.retry_listener = events.append
        fault_proxy.inject("slowdown", "drop", "drop")
        await store.put("state/listened.json", b"{}")
        fault_proxy.inject("internal")
        await store.delete("state/listened.json")
    assert [(e.operation, e.attempt) for e in events] == [("PUT", 1), ("PUT", 2), ("DELETE", 1)]
    assert events[1].cause.startswith("ConnectionClosedError")
    assert events[0].target == store.uri_for("state/listened.json")


@pytest.mark.anyio
async def test_without_a_listener_each_retry_is_one_warning(
    fresh_store: Callable[[], S3Store], fault_proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    fault_proxy.inject("slowdown", "internal")
    async with fresh_store() as store:
        with caplog.at_level(logging.DEBUG, logger="deltastream.storage"):
            assert await store.get(KEY) == DATA
    uri = store.uri_for(KEY)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 2
    for line, cause, n in zip(lines, ["503 SlowDown", "500 InternalError"], [1, 2], strict=True):
        expected = rf"GET {re.escape(uri)} failed \({cause}\); retry {n} in \d\.\d\ds"
        assert re.fullmatch(expected, line), line


def test_fault_proxy_shuts_down_cleanly(s3_server: Any) -> None:
    proxy = new_proxy(s3_server.endpoint).start()
    host, port = proxy.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", "/")  # moto's bucket listing, forwarded
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Connection") == "close"
    conn.close()
    proxy.stop()
    assert [s.outcome for s in proxy.seen] == ["forwarded 200"]
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=5).close()


# -------------------------------------------------------------------- client lifecycle


def _aiohttp_sessions(store: S3Store) -> list[aiohttp.ClientSession]:
    # The client's HTTP session pool (aiobotocore internals, read-only): what aclose frees.
    return list(store._client._endpoint.http_session._sessions.values())


@pytest.mark.anyio
async def test_client_is_created_lazily(
    fresh_store: Callable[[], S3Store], fault_proxy: FaultProxy
) -> None:
    store = fresh_store()
    try:
        assert store._client is None
        assert store.uri_for(KEY) == f"{store.root_uri}/{KEY}"
        assert store._client is None
        assert fault_proxy.seen == []
        meta = await store.head(KEY)
        assert (meta.key, meta.size) == (KEY, len(DATA))
        assert store._client is not None
        assert [s.method for s in fault_proxy.seen] == ["HEAD"]
        client = store._client
        await store.get(KEY)
        assert store._client is client  # one client, reused
    finally:
        await store.aclose()


@pytest.mark.anyio
async def test_aclose_closes_the_client(fresh_store: Callable[[], S3Store]) -> None:
    store = fresh_store()
    assert await store.get(KEY) == DATA
    sessions = _aiohttp_sessions(store)
    assert sessions and not any(s.closed for s in sessions)
    await store.aclose()
    assert store._client is None
    assert all(s.closed for s in sessions)
    await store.aclose()  # closing twice is harmless


@pytest.mark.anyio
@pytest.mark.parametrize("used", [True, False])
async def test_use_after_close_raises(
    fresh_store: Callable[[], S3Store], fault_proxy: FaultProxy, used: bool
) -> None:
    store = fresh_store()
    if used:
        await store.get(KEY)
    await store.aclose()
    requests = len(fault_proxy.seen)
    for op_name, (op, _, _, _) in OPS.items():
        with pytest.raises(StorageError) as info:
            await op(store)
        assert str(info.value) == f"{store.root_uri}: store is closed", op_name
    with pytest.raises(StorageError, match="store is closed"):
        await store.get_many([KEY, KEY])
    assert store._client is None  # no client was re-created
    assert len(fault_proxy.seen) == requests  # and no request was sent


@pytest.mark.anyio
async def test_async_with_closes_the_store(fresh_store: Callable[[], S3Store]) -> None:
    async with fresh_store() as store:
        assert await store.get(KEY) == DATA
        sessions = _aiohttp_sessions(store)
    assert store._client is None
    assert sessions and all(s.closed for s in sessions)
    with pytest.raises(StorageError, match="store is closed"):
        await store.head(KEY)


@pytest.mark.anyio
async def test_async_with_closes_the_store_on_error(fresh_store: Callable[[], S3Store]) -> None:
    store = fresh_store()
    with pytest.raises(ObjectNotFoundError):
        async with store:
            await store.get("_delta_log/missing.json")
    assert store._client is None
    with pytest.raises(StorageError, match="store is closed"):
        await store.get(KEY)


# -------------------------------------------------------------------- change feeds (SQS)

LOG_KEY = f"{PREFIX}/_delta_log/{{:020d}}.json"


def messages_left(sqs: Any, queue_url: str) -> int:
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)
    return sum(int(attributes["Attributes"][name]) for name in names)


async def emptied(sqs: Any, queue_url: str) -> bool:
    """Whether the queue becomes empty (the feed deleted every message) within 5 s."""
    deadline = time.monotonic() + 5
    while messages_left(sqs, queue_url):
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(0.02)
    return True


async def wakes(feed: ChangeFeed, within: float) -> bool:
    with anyio.move_on_after(within):
        await feed.wait()
        return True
    return False


def event(bucket: str, key: str, name: str = "ObjectCreated:Put") -> str:
    """An S3 event notification as S3 sends it (the key URL-encoded as in a form)."""
    record = {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "awsRegion": "us-east-1",
        "eventName": name,
        "s3": {"bucket": {"name": bucket}, "object": {"key": quote_plus(key), "size": 2}},
    }
    return json.dumps({"Records": [record]})


def sns(message: str) -> str:
    """``message`` in the envelope SNS wraps it in when it delivers to SQS."""
    return json.dumps(
        {
            "Type": "Notification",
            "MessageId": str(uuid.uuid4()),
            "TopicArn": "arn:aws:sns:us-east-1:123456789012:bucket-events",
            "Subject": "Amazon S3 Notification",
            "Message": message,
        }
    )


@pytest.mark.anyio
async def test_sqs_feed_wakes_when_objects_are_put_in_its_directory(
    s3_server: Any, notified_bucket: str, boto: Any, sqs: Any, queue: str
) -> None:
    async with make_store(s3_server.endpoint, notified_bucket, sqs_queue_url=queue) as store:
        feed = await store.watch("_delta_log/")
        assert feed is not None
        # moto sent S3's test event when the notification was configured: no wake-up.
        assert not await wakes(feed, 0.3)
        latencies = []
        for version in range(10):
            start = time.perf_counter()
            await anyio.to_thread.run_sync(
                lambda v=version: boto.put_object(
                    Bucket=notified_bucket, Key=LOG_KEY.format(v), Body=b"{}"
                )
            )
            with anyio.fail_after(5):
                await feed.wait()
            latencies.append(time.perf_counter() - start)
        # Measured here: about 14 ms, of which the wake-up after the put returned is 3 ms
        # (0.54 s at most on a machine loaded 8-fold). Each wake-up comes from its
        # notification: an empty long poll (SQS_WAIT_SECONDS, 20 s) would miss fail_after(5).
        assert max(latencies) < 2.0, latencies
        assert statistics.median(latencies) < 0.5, latencies
        assert await emptied(sqs, queue)

        # A change while no one waits wakes the next wait at once; a cancelled wait loses
        # nothing.
        with anyio.move_on_after(0.05):
            await feed.wait()
        boto.put_object(Bucket=notified_bucket, Key=LOG_KEY.format(10), Body=b"{}")
        await anyio.sleep(0.3)
        assert await wakes(feed, 0.01)
        assert not await wakes(feed, 0.1)
        assert store.stats.retries == 0
        await feed.aclose()


@pytest.mark.anyio
async def test_sqs_feed_ignores_other_keys_and_buckets(
    s3_server: Any, notified_bucket: str, boto: Any, sqs: Any, queue: str
) -> None:
    other_bucket = new_bucket(boto)
    notify(boto, sqs, other_bucket, queue)
    async with make_store(s3_server.endpoint, notified_bucket, sqs_queue_url=queue) as store:
        feed = await store.watch("_delta_log/")
        assert feed is not None
        for bucket, key in [
            (other_bucket, LOG_KEY.format(0)),  # same key, another bucket
            (notified_bucket, "tables/t10/_delta_log/00000000000000000000.json"),  # sibling
            (notified_bucket, "tables/t1_delta_log/00000000000000000000.json"),
            (notified_bucket, f"{PREFIX}/_delta_log/_sidecars/a.parquet"),  # subdirectory
            (notified_bucket, f"{PREFIX}/_delta_log/"),  # a directory marker
            (notified_bucket, f"{PREFIX}/part-0.parquet"),  # the parent directory
            (notified_bucket, "_delta_log/00000000000000000000.json"),  # the bucket's root
        ]:
            boto.put_object(Bucket=bucket, Key=key, Body=b"x")
        assert not await wakes(feed, 0.5)
        assert await emptied(sqs, queue)  # every message was deleted all the same
        boto.put_object(Bucket=notified_bucket, Key=LOG_KEY.format(0), Body=b"{}")
        assert await wakes(feed, 5)
        await feed.aclose()


@pytest.mark.anyio
async def test_sqs_feed_decodes_event_keys(
    s3_server: Any, notified_bucket: str, boto: Any, queue: str
) -> None:
    prefix = "tables/a b+c/é=1 100%"
    async with make_store(
        s3_server.endpoint, notified_bucket, prefix, sqs_queue_url=queue
    ) as store:
        feed = await store.watch("_delta_log")  # the trailing "/" is implied
        assert feed is not None
        # Encoded, the key of this sibling is the key below with "+" for " ": only decoding
        # the key as a form tells them apart.
        sibling = "tables/a+b+c/é=1+100%/_delta_log/00000000000000000000.json"
        boto.put_object(Bucket=notified_bucket, Key=sibling, Body=b"{}")
        assert not await wakes(feed, 0.5)
        key = f"{prefix}/_delta_log/0 +%2B&=é.json"
        boto.put_object(Bucket=notified_bucket, Key=key, Body=b"{}")
        assert await wakes(feed, 5)
        await feed.aclose()


@pytest.mark.anyio
async def test_sqs_feed_ignores_test_events_and_garbage_and_reads_sns_envelopes(
    s3_server: Any, s3_bucket: Any, sqs: Any, queue: str
) -> None:
    bucket = s3_bucket.name
    mine = LOG_KEY.format(7)
    ignored = [
        "not json",
        "[1, 2]",
        '{"Records": "not a list"}',
        '{"Records": [{"eventName": 5}, null, {"s3": {}}]}',
        json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": bucket}),
        sns(json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": bucket})),
        json.dumps({"Type": "Notification", "Message": "not json"}),
        event(bucket, mine, "ObjectRemoved:Delete"),  # nothing appeared
        sns(event(bucket, f"{PREFIX}/_delta_log/_sidecars/x.parquet")),
        event(bucket, quote_plus(mine)),  # encoded twice: not this key
    ]
    for body in ignored:
        sqs.send_message(QueueUrl=queue, MessageBody=body)
    async with make_store(s3_server.endpoint, bucket, sqs_queue_url=queue) as store:
        feed = await store.watch("_delta_log/")
        assert feed is not None
        assert not await wakes(feed, 0.5)
        assert await emptied(sqs, queue)
        sqs.send_message(QueueUrl=queue, MessageBody=sns(event(bucket, mine)))
        assert await wakes(feed, 5)
        sqs.send_message(
            QueueUrl=queue,
            MessageBody=event(bucket, mine, "s3:ObjectCreated:CompleteMultipartUpload"),
        )
        assert await wakes(feed, 5)
        assert await emptied(sqs, queue)
        await feed.aclose()


@pytest.mark.anyio
async def test_sqs_feed_retries_like_every_request(
    s3_server: Any, s3_bucket: Any, sqs: Any, queue: str
) -> None:
    with new_proxy(s3_server.endpoint) as proxy:  # its own: long polls outlive the test
        proxy.inject("slowdown", "internal")
        store = make_store(proxy.url, s3_bucket.name, sqs_queue_url=queue, **FAST_RETRIES)
        async with store:
            feed = await store.watch("_delta_log/")
            assert feed is not None
            sqs.send_message(QueueUrl=queue, MessageBody=event(s3_bucket.name, LOG_KEY.format(0)))
            # The first failed receive already wakes the feed, as a lapse: the answer of a
            # failed receive may have carried messages that are now invisible for a while.
            assert await wakes(feed, 5)
            assert await emptied(sqs, queue)  # the third attempt took the message
            assert store.stats.retries == 2
            assert feed.take_lapse() == (
                f"an SQS ReceiveMessage from {queue} failed and is being retried"
            )
            assert [s.outcome for s in proxy.seen][:2] == ["slowdown", "internal"]
            assert all(s.method == "POST" for s in proxy.seen)  # SQS, not S3


@pytest.mark.anyio
@pytest.mark.parametrize("problem", ["denied", "no such queue"])
async def test_sqs_feed_errors_surface_from_wait(
    s3_server: Any, s3_bucket: Any, queue: str, problem: str
) -> None:
    with new_proxy(s3_server.endpoint) as proxy:
        if problem == "denied":
            proxy.inject("denied")
        else:
            queue = queue.rsplit("/", 1)[0] + "/no-such-queue"
        async with make_store(proxy.url, s3_bucket.name, sqs_queue_url=queue) as store:
            feed = await store.watch("_delta_log/")
            assert feed is not None
            with anyio.fail_after(5), pytest.raises(StorageError) as info:
                await feed.wait()
            assert info.value.uri == store.uri_for("_delta_log/")
            assert f"SQS ReceiveMessage from {queue} failed after 1 attempt(s)" in str(info.value)
            assert store.stats.retries == 0
            with pytest.raises(StorageError, match="failed after 1 attempt"):
                await feed.wait()  # the feed stays failed
            assert len(proxy.seen) == 1  # and sends nothing more


def _sessions(client: Any) -> list[aiohttp.ClientSession]:
    return list(client._endpoint.http_session._sessions.values())


@pytest.mark.anyio
async def test_closing_the_store_closes_its_feeds_and_the_sqs_client(
    s3_server: Any, s3_bucket: Any, queue: str
) -> None:
    store = make_store(s3_server.endpoint, s3_bucket.name, sqs_queue_url=queue)
    assert store._sqs_client is None
    feed = await store.watch("_delta_log/")
    assert feed is not None
    client = store._sqs_client
    assert client is not None
    # A long poll is in flight once the client opened its HTTP session (on a busy machine
    # that takes longer than on an idle one: waited for, not slept).
    with anyio.fail_after(10):
        while not _sessions(client):  # noqa: ASYNC110 (the client has no event for it)
            await anyio.sleep(0.02)
    task = feed._task  # type: ignore[attr-defined]
    assert not task.done()
    sessions = _sessions(client)
    assert sessions and not any(s.closed for s in sessions)
    start = time.perf_counter()
    await store.aclose()
    assert time.perf_counter() - start < 1  # the 20 s long poll does not hold it up
    assert task.done()
    assert store._sqs_client is None and store._client is None
    assert all(s.closed for s in sessions)
    with pytest.raises(StorageError, match="change feed is closed"):
        await feed.wait()
    with pytest.raises(StorageError, match="store is closed"):
        await store.watch("_delta_log/")


@pytest.mark.anyio
async def test_closing_a_feed_stops_its_long_poll(
    s3_server: Any, s3_bucket: Any, queue: str
) -> None:
    async with make_store(s3_server.endpoint, s3_bucket.name, sqs_queue_url=queue) as store:
        feed = await store.watch("_delta_log/")
        assert feed is not None
        await anyio.sleep(0.1)
        waiter_error: list[StorageError] = []

        async def waiter() -> None:
            try:
                await feed.wait()
            except StorageError as e:
                waiter_error.append(e)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.sleep(0.05)
            await feed.aclose()
        assert feed._task.done()  # type: ignore[attr-defined]
        assert [e.problem for e in waiter_error] == ["change feed is closed"]
        await feed.aclose()  # closing twice is harmless
        # The store (and its SQS client) stay usable, for new feeds too.
        assert store._sqs_client is not None
        async with await store.watch("_delta_log/") as again:  # type: ignore[union-attr]
            assert not await wakes(again, 0.1)


@pytest.mark.anyio
async def test_no_feed_without_a_queue(s3_server: Any, s3_bucket: Any) -> None:
    async with make_store(s3_server.endpoint, s3_bucket.name) as store:
        assert await store.watch("_delta_log/") is None
        assert store._sqs_client is None and store._client is None  # no client was made


@pytest.mark.parametrize("name", ["sqs_queue_url", "SQS_QUEUE_URL", "AWS_SQS_QUEUE_URL"])
def test_options_sqs_queue_url(name: str) -> None:
    url = "https://sqs.eu-west-1.amazonaws.com/123456789012/delta-events"
    assert S3Options.from_storage_options({name: url}) == S3Options(sqs_queue_url=url)
    assert S3Options().sqs_queue_url is None


@pytest.mark.parametrize(
    "value", ["delta-events", "arn:aws:sqs:us-east-1:123456789012:delta-events", "", "https://h/"]
)
def test_options_reject_what_is_not_a_queue_url(value: str) -> None:
    with pytest.raises(InvalidArgumentError, match="must be a queue URL") as info:
        S3Options.from_storage_options({"AWS_SQS_QUEUE_URL": value})
    assert "sqs_queue_url" in str(info.value)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("queue_url", "region", "expected"),
    [
        ("https://sqs.eu-west-1.amazonaws.com/123456789012/q", None, "eu-west-1"),
        ("https://ap-south-1.queue.amazonaws.com/123456789012/q", None, "ap-south-1"),
        ("https://sqs.eu-west-1.amazonaws.com/123456789012/q", "us-west-2", "us-west-2"),
        ("http://127.0.0.1:4566/000000000000/q", "us-east-2", "us-east-2"),
    ],
)
async def test_sqs_client_region(queue_url: str, region: str | None, expected: str) -> None:
    options = {**CREDENTIALS, "sqs_queue_url": queue_url}
    if region:
        options["region"] = region
    store = open_store("s3://bucket/t", options)
    assert isinstance(store, S3Store)
    try:
        client = await store._get_sqs_client()  # created without sending a request
        assert client.meta.region_name == expected
    finally:
        await store.aclose()


@pytest.mark.anyio
async def test_many_tables_on_one_queue_share_one_reader(
    s3_server: Any, notified_bucket: str, boto: Any, sqs: Any, queue: str
) -> None:
    """Tables of one process on one queue: one long poll for all of them, each woken for
    its own directory only (read separately, feeds would take each other's messages); the
    reader moves on when the store it polls through closes."""
    stores = [
        make_store(s3_server.endpoint, notified_bucket, f"t{i}", sqs_queue_url=queue)
        for i in range(5)
    ]
    feeds = [await store.watch("_delta_log/") for store in stores]
    assert all(feed is not None for feed in feeds)
    tasks = {feed._task for feed in feeds}  # type: ignore[union-attr]
    assert len(tasks) == 1  # one receive loop
    await anyio.sleep(0.3)
    for feed in feeds:
        while await wakes(feed, 0.05):  # type: ignore[arg-type]
            pass
    names = [f"t{i}" for i in range(len(stores))]
    for round_ in range(2):
        for i, name in enumerate(names):
            boto.put_object(
                Bucket=notified_bucket, Key=f"{name}/_delta_log/{round_:020d}.json", Body=b"{}"
            )
            assert await wakes(feeds[i], 5), (round_, i)  # type: ignore[arg-type]
            for j, other in enumerate(feeds):
                if j != i:
                    assert not await wakes(other, 0), (round_, i, j)  # type: ignore[arg-type]
        if round_ == 0:
            await stores[0].aclose()  # the store the reader polled through
            stores, feeds, names = stores[1:], feeds[1:], names[1:]
            assert not feeds[0]._task.done()  # type: ignore[union-attr]
    assert await emptied(sqs, queue)
    task = feeds[0]._task  # type: ignore[union-attr]
    for store in stores:
        await store.aclose()
    assert task.done()


@pytest.mark.anyio
async def test_stores_with_the_same_options_share_one_client(
    s3_server: Any, s3_bucket: Any
) -> None:
    """A thousand tables in one bucket hold one client (and connection pool), not a
    thousand; it closes with the last store using it."""
    # Options no other test's store has, so that no store outside this test shares them.
    timeout = f"{60 + next(_fresh) / 1000:.3f}"
    a = make_store(s3_server.endpoint, s3_bucket.name, "a", read_timeout=timeout)
    b = make_store(s3_server.endpoint, s3_bucket.name, "b", read_timeout=timeout)
    other = make_store(s3_server.endpoint, s3_bucket.name, "c", read_timeout="7")
    await a.put("x", b"1")
    await b.put("x", b"2")
    await other.put("x", b"3")
    assert a._client is b._client and a._client is not other._client
    sessions = _sessions(a._client)
    assert sessions
    await a.aclose()
    assert not any(s.closed for s in sessions)  # b still uses it
    assert await b.get("x") == b"2"
    await b.aclose()
    assert all(s.closed for s in sessions)
    assert await other.get("x") == b"3"
    await other.aclose()
