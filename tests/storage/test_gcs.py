"""GcsStore over HTTP against gcp-storage-emulator: the shared store contract (through
:class:`gcs_strict.StrictGcs`, which adds what the emulator lacks: ``startOffset``, pages,
``ifGenerationMatch``, ``x-goog-generation``), the emulator's gaps and the store's answers to
them, retries against real HTTP faults (:class:`faultproxy.FaultProxy`), errors in one line,
options and credentials (a service account key whose OAuth exchange goes to a local token
server), ``open_store`` for ``gs://`` URIs, and the client's lifecycle."""

from __future__ import annotations

import gc
import json
import threading
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from emulators import gcs_create_bucket, gcs_put
from faultproxy import FaultProxy
from gcs_strict import StrictGcs
from storage_contract import Harness, StoreContract, collect

from deltastream.errors import (
    AccessDeniedError,
    InvalidArgumentError,
    PreconditionFailedError,
    StorageError,
)
from deltastream.storage import open_store
from deltastream.storage.gcs import STORAGE_OPTION_NAMES, GcsOptions, GcsStore
from deltastream.storage.retry import RetryEvent

PREFIX = "tables/t1"


def new_bucket(endpoint: str) -> str:
    name = f"test-{uuid.uuid4().hex[:12]}"
    gcs_create_bucket(endpoint, name)
    return name


def make_store(endpoint: str, bucket: str, prefix: str = PREFIX, **options: str) -> GcsStore:
    store = open_store(f"gs://{bucket}/{prefix}", {"endpoint_url": endpoint, **options})
    assert isinstance(store, GcsStore)
    return store


@pytest.fixture(scope="module")
def strict(gcs_server: str) -> Iterator[StrictGcs]:
    # Pages of at most 3 entries: every listing of the contract spans several pages.
    with StrictGcs(gcs_server, page_size_cap=3) as proxy:
        yield proxy


@pytest.fixture
async def harness(gcs_server: str, strict: StrictGcs) -> AsyncIterator[Harness]:
    bucket = new_bucket(gcs_server)
    async with make_store(strict.url, bucket) as store:
        yield Harness(store, lambda key, data: gcs_put(gcs_server, bucket, f"{PREFIX}/{key}", data))


class TestGcsStoreContract(StoreContract):
    """The contract through the strict proxy: real GCS's listing, pages and conditions."""


# -------------------------------------------------------------------- the emulator's gaps


@pytest.mark.anyio
async def test_the_emulator_ignores_start_offset_and_conditions_the_store_copes(
    gcs_server: str,
) -> None:
    """gcp-storage-emulator ignores ``startOffset`` and ``ifGenerationMatch`` and sends no
    generation with downloads. The store still lists from a key (it filters), and reads
    tagged bytes (the bytes and the metadata at once, matched by MD5, even while the object
    is rewritten); conditional writes are tested through StrictGcs."""
    bucket = new_bucket(gcs_server)
    for v in range(4):
        gcs_put(gcs_server, bucket, f"{PREFIX}/_delta_log/{v:020d}.json", b"{}")
    async with make_store(gcs_server, bucket) as store:
        keys = [m.key for m in await collect(store, "_delta_log/", f"_delta_log/{1:020d}.json")]
        assert keys == [f"_delta_log/{v:020d}.json" for v in (2, 3)]
        first = await store.put("s/k", b"one")
        # Not enforced by the emulator: a second create succeeds there (GCS answers 412).
        second = await store.put("s/k", b"two", if_match="")
        assert second != first
        assert await store.get_tagged("s/k") == (b"two", second)
        # Known from then on: one GET and one metadata read, at once.
        gets, heads = store.stats.get_requests, store.stats.head_requests
        assert await store.get_tagged("s/k") == (b"two", second)
        assert (store.stats.get_requests, store.stats.head_requests) == (gets + 1, heads + 1)
        # Rewritten all the while: every read's bytes are its generation's.
        written = {second: b"two"}

        async def rewrite() -> None:
            for i in range(30):
                data = f"v{i}".encode()
                written[await store.put("s/k", data)] = data

        reads = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(rewrite)
            for _ in range(30):
                reads.append(await store.get_tagged("s/k"))
        assert all(written[tag] == data for data, tag in reads), (reads, written)
        assert len({tag for _, tag in reads}) > 1  # (it did change meanwhile)


@pytest.mark.anyio
async def test_strict_gcs_sees_start_offset_pages_and_conditions(
    gcs_server: str, strict: StrictGcs
) -> None:
    bucket = new_bucket(gcs_server)
    for v in range(7):
        gcs_put(gcs_server, bucket, f"{PREFIX}/_delta_log/{v:020d}.json", b"{}")
    async with make_store(strict.url, bucket) as store:
        before = len(strict.list_params)
        listed = await collect(store, "_delta_log/", f"_delta_log/{2:020d}.json")
        assert [m.key for m in listed] == [f"_delta_log/{v:020d}.json" for v in range(3, 7)]
        params = strict.list_params[before:]
        assert params[0]["startOffset"] == f"{PREFIX}/_delta_log/{2:020d}.json"
        assert params[0]["delimiter"] == "/" and "pageToken" in params[1]
        assert store.stats.list_requests == len(params) == 2  # 5 entries, pages of 3
        tag = await store.put("s/k", b"one", if_match="")
        with pytest.raises(PreconditionFailedError):
            await store.put("s/k", b"two", if_match="")
        assert await store.get_tagged("s/k") == (b"one", tag)


# -------------------------------------------------------------------------------- retries


@pytest.fixture
def faults(gcs_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_server, keep_alive=False) as proxy:
        yield proxy


@pytest.mark.anyio
@pytest.mark.parametrize("fault", ["throttled", "slowdown", "internal"])
async def test_transient_faults_are_retried(
    gcs_server: str, faults: FaultProxy, fault: str
) -> None:
    bucket = new_bucket(gcs_server)
    gcs_put(gcs_server, bucket, f"{PREFIX}/k", b"data")
    events: list[RetryEvent] = []
    async with make_store(faults.url, bucket, retry_base_delay="0.01") as store:
        store.retry_listener = events.append
        for call in (lambda: store.get("k"), lambda: store.head("k"), lambda: collect(store, "")):
            faults.inject(fault, fault)
            await call()
        assert store.stats.retries == 6
    assert [e.attempt for e in events] == [1, 2] * 3
    assert {e.operation for e in events} == {"GET", "HEAD", "LIST"}
    assert all(e.target.startswith(f"gs://{bucket}/{PREFIX}") for e in events)


@pytest.mark.anyio
@pytest.mark.parametrize("fault", ["drop", "reset"])
async def test_broken_connections_are_retried(
    gcs_server: str, faults: FaultProxy, fault: str
) -> None:
    """A connection closed without an answer. aiohttp itself tries an idempotent request
    once more on a fresh connection when a connection closes under it, so the store sees
    (and reports) fewer failures than the proxy made; every one it sees is retried."""
    bucket = new_bucket(gcs_server)
    gcs_put(gcs_server, bucket, f"{PREFIX}/k", b"data")
    events: list[RetryEvent] = []
    async with make_store(faults.url, bucket, retry_base_delay="0.01") as store:
        store.retry_listener = events.append
        faults.inject(fault, fault, fault, fault)
        assert await store.get("k") == b"data"
        assert store.stats.retries == len(events) >= 1
    assert [s.outcome for s in faults.seen] == [fault] * 4 + ["forwarded 200"]
    assert all("Server disconnected" in e.cause or "Connection" in e.cause for e in events)


@pytest.mark.anyio
async def test_exhausted_retries_are_one_line(gcs_server: str, faults: FaultProxy) -> None:
    bucket = new_bucket(gcs_server)
    async with make_store(faults.url, bucket, max_attempts="3", retry_base_delay="0.01") as store:
        store.retry_listener = lambda e: None
        faults.inject("throttled", "throttled", "throttled")
        with pytest.raises(StorageError) as info:
            await store.get("k")
    message = str(info.value)
    assert message.startswith(f"gs://{bucket}/{PREFIX}/k: GET failed after 3 attempt(s): 429")
    assert "\n" not in message


@pytest.mark.anyio
async def test_forbidden_is_not_retried(gcs_server: str, faults: FaultProxy) -> None:
    bucket = new_bucket(gcs_server)
    async with make_store(faults.url, bucket) as store:
        faults.inject("denied")
        with pytest.raises(StorageError) as info:
            await store.get("k")
        assert store.stats.retries == 0
    assert isinstance(info.value, AccessDeniedError)
    assert str(info.value).startswith(
        f"gs://{bucket}/{PREFIX}/k: GET failed after 1 attempt(s): 403 Forbidden"
    )


@pytest.mark.anyio
async def test_a_retried_create_whose_first_attempt_landed_succeeds(
    gcs_server: str, strict: StrictGcs
) -> None:
    bucket = new_bucket(gcs_server)
    with FaultProxy(strict.url, keep_alive=False) as proxy:
        async with make_store(proxy.url, bucket, retry_base_delay="0.01") as store:
            store.retry_listener = lambda e: None
            proxy.inject("lost")  # the upload lands; its answer does not come back
            tag = await store.put("s/k", b"mine", if_match="")
            assert await store.get_tagged("s/k") == (b"mine", tag)
            with pytest.raises(PreconditionFailedError):
                await store.put("s/k", b"theirs", if_match="")


# -------------------------------------------------------------------------------- errors


@pytest.mark.anyio
async def test_missing_bucket_names_it(gcs_server: str) -> None:
    async with make_store(gcs_server, "no-such-bucket-here") as store:
        with pytest.raises(StorageError) as info:
            await collect(store, "_delta_log/")
    assert str(info.value) == (
        f"gs://no-such-bucket-here/{PREFIX}/_delta_log/: LIST failed: "
        "bucket 'no-such-bucket-here' does not exist"
    )


# ------------------------------------------------------------------------- options, URIs


def test_option_names_and_aliases(tmp_path: Path) -> None:
    key = service_account_key(tmp_path, "http://127.0.0.1:1/token")
    for name in ("google_service_account", "GOOGLE_SERVICE_ACCOUNT", "service_account",
                 "google_service_account_path", "google_application_credentials"):  # fmt: skip
        options = GcsOptions.from_storage_options({name: str(key)}, environ={})
        assert options.signed and options.service_account_info is not None
        assert options.endpoint_url == "https://storage.googleapis.com"
    inline = GcsOptions.from_storage_options({"google_service_account_key": key.read_text()}, {})
    assert inline.service_account_info == json.loads(key.read_text())
    assert "private_key" not in repr(inline) and "BEGIN" not in repr(inline)
    emulator = GcsOptions.from_storage_options({"endpoint_url": "http://127.0.0.1:9/"}, {})
    assert (emulator.endpoint_url, emulator.signed) == ("http://127.0.0.1:9", False)
    env = GcsOptions.from_storage_options(None, {"STORAGE_EMULATOR_HOST": "127.0.0.1:9"})
    assert (env.endpoint_url, env.signed) == ("http://127.0.0.1:9", False)
    assert GcsOptions.from_storage_options(None, {}).signed
    skip = GcsOptions.from_storage_options({"google_skip_signature": "true"}, {})
    assert not skip.signed and skip.endpoint_url == "https://storage.googleapis.com"
    signed = GcsOptions.from_storage_options(
        {"endpoint_url": "http://127.0.0.1:9", "google_service_account": str(key)}, {}
    )
    assert signed.signed
    common = GcsOptions.from_storage_options({"max_attempts": "3", "read_timeout": "5"}, {})
    assert (common.max_attempts, common.read_timeout) == (3, 5.0)
    assert {"google_service_account", "google_skip_signature", "max_attempts"} <= (
        STORAGE_OPTION_NAMES
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"google_sevice_account": "x"}, "unknown GCS storage option 'google_sevice_account'"),
        ({"google_service_account": "/no/such/key.json"}, "cannot read the key file"),
        ({"google_service_account": "{not json"}, "not a JSON service account key"),
        ({"google_service_account": '{"type": "x"}'}, "not a Google credentials file"),
        ({"google_service_account": '{"type": "service_account"}'}, "lacks client_email"),
        ({"google_skip_signature": "maybe"}, "is not true or false"),
        ({"endpoint_url": "ftp://x"}, "is not an http(s) URL"),
        ({"max_attempts": "0"}, "must be >= 1"),
    ],
)
def test_bad_options_are_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        open_store("gs://b/t", options)


def test_both_credential_options_are_refused(tmp_path: Path) -> None:
    key = str(service_account_key(tmp_path, "http://127.0.0.1:1/token"))
    with pytest.raises(InvalidArgumentError, match="both give credentials"):
        open_store(
            "gs://b/t", {"google_service_account": key, "google_application_credentials": key}
        )


def test_gs_uris() -> None:
    store = open_store("gs://bkt/a%20b/t/", {"endpoint_url": "http://127.0.0.1:9"})
    assert isinstance(store, GcsStore)
    assert (store.bucket, store.prefix, store.root_uri) == ("bkt", "a b/t", "gs://bkt/a b/t")
    assert open_store("GS://bkt", {"endpoint_url": "http://127.0.0.1:9"}).root_uri == "gs://bkt"
    with pytest.raises(InvalidArgumentError, match="needs a bucket"):
        open_store("gs:///t")


# -------------------------------------------------------------------- credentials, lifecycle


def service_account_key(tmp_path: Path, token_uri: str) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    key = {
        "type": "service_account",
        "project_id": "test",
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": "reader@test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }
    path = tmp_path / "key.json"
    path.write_text(json.dumps(key))
    return path


class _TokenServer(BaseHTTPRequestHandler):
    grants: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        type(self).grants.append(body)
        answer = json.dumps({"access_token": "tok-123", "expires_in": 3600}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.anyio
async def test_a_service_account_signs_requests(gcs_server: str, tmp_path: Path) -> None:
    """The key's JWT is exchanged at its token URI (a local server here) and every request
    carries the token."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _TokenServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        key = service_account_key(tmp_path, f"http://127.0.0.1:{server.server_port}/token")
        bucket = new_bucket(gcs_server)
        gcs_put(gcs_server, bucket, f"{PREFIX}/k", b"data")
        with FaultProxy(gcs_server, keep_alive=False) as proxy:
            async with make_store(proxy.url, bucket, google_service_account=str(key)) as store:
                assert await store.get("k") == b"data"
                await collect(store, "")
            authorizations = {s.authorization for s in proxy.seen}
    finally:
        server.shutdown()
    assert authorizations == {"Bearer tok-123"}
    assert len(_TokenServer.grants) == 1 and "jwt-bearer" in _TokenServer.grants[0]


class _FailingTokenServer(BaseHTTPRequestHandler):
    """A token endpoint that answers every grant with 503."""

    grants: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).grants.append(self.path)
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.anyio
async def test_a_failing_token_endpoint_is_asked_once_per_attempt(tmp_path: Path) -> None:
    """The shared retry policy alone decides how often a token is asked for: with
    ``max_attempts=2``, two grants, then one error naming the object and the cause
    (gcloud-aio-auth's own five tries, up to a minute apart, would make ten)."""
    _FailingTokenServer.grants.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FailingTokenServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        key = service_account_key(tmp_path, f"http://127.0.0.1:{server.server_port}/token")
        options = {"google_service_account": str(key), "max_attempts": "2"}
        async with make_store("http://127.0.0.1:9", "bkt", **options) as store:
            with pytest.raises(StorageError) as raised:
                await store.get("k")
    finally:
        server.shutdown()
    assert len(_FailingTokenServer.grants) == 2
    message = str(raised.value)
    assert message.startswith("gs://bkt/tables/t1/k: GET failed after 2 attempt(s)"), message
    assert "cannot get Google credentials: ClientResponseError: 503" in message, message


@pytest.mark.anyio
async def test_unsigned_requests_carry_no_authorization(gcs_server: str) -> None:
    bucket = new_bucket(gcs_server)
    with FaultProxy(gcs_server, keep_alive=False) as proxy:
        async with make_store(proxy.url, bucket) as store:
            await collect(store, "")
        assert [(s.outcome, s.authorization) for s in proxy.seen] == [("forwarded 200", None)]


@pytest.mark.anyio
async def test_the_client_is_lazy_and_closed(gcs_server: str) -> None:
    bucket = new_bucket(gcs_server)
    store = make_store(gcs_server, bucket)
    assert store._session is None  # opening a store touches no network
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with store:
            await collect(store, "")
            assert store._session is not None
        assert store._session is None
        gc.collect()
    assert not [w for w in caught if "Unclosed" in str(w.message)]
    with pytest.raises(StorageError, match="store is closed"):
        await store.get("k")


@pytest.mark.anyio
async def test_another_bucket_is_read_through_a_store_at_its_root(gcs_server: str) -> None:
    bucket, other = new_bucket(gcs_server), new_bucket(gcs_server)
    gcs_put(gcs_server, other, "x/y", b"there")
    async with make_store(gcs_server, bucket) as store:
        store.external_paths = store.external_paths.of(True)
        foreign, key = store.resolve(f"gs://{other}/x/y")
        assert foreign is not store and foreign.root_uri == f"gs://{other}" and key == "x/y"
        assert await foreign.get(key) == b"there"
        assert foreign.stats is store.stats
    assert foreign._session is None  # type: ignore[attr-defined]
