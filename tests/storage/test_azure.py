"""AzureStore over HTTP against Azurite: the shared store contract (directly, with small
listing pages, and through a pass-through proxy), listing from a key (``startFrom``, which
Azurite ignores), retries against real HTTP faults (:class:`faultproxy.FaultProxy`), errors
in one line (a missing container, a wrong key, a forbidden request), SAS tokens, options,
``open_store`` for every Azure URI form, and the client's lifecycle."""

from __future__ import annotations

import gc
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from conftest import AzureContainer
from emulators import AZURITE_ACCOUNT, AZURITE_KEY, azurite_connection_string
from faultproxy import FaultProxy
from storage_contract import Harness, StoreContract, collect

from deltastream.errors import (
    AccessDeniedError,
    InvalidArgumentError,
    StorageError,
)
from deltastream.storage import open_store
from deltastream.storage.azure import STORAGE_OPTION_NAMES, AzureOptions, AzureStore
from deltastream.storage.retry import RetryEvent

PREFIX = "tables/t1"


def make_store(endpoint: str, container: str, prefix: str = PREFIX, **options: str) -> AzureStore:
    store = open_store(f"az://{container}/{prefix}", {"endpoint_url": endpoint, **options})
    assert isinstance(store, AzureStore)
    return store


@pytest.fixture
async def harness(azure_container: AzureContainer) -> AsyncIterator[Harness]:
    async with make_store(azure_container.endpoint, azure_container.name) as store:
        store.list_page_size = 3  # every listing of the contract spans several pages
        yield Harness(store, lambda key, data: azure_container.put(f"{PREFIX}/{key}", data))


class TestAzureStoreContract(StoreContract):
    pass


@pytest.fixture(scope="module")
def passthrough(azurite_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(azurite_server.rsplit("/", 1)[0], keep_alive=False) as proxy:
        yield proxy


class TestAzureStoreContractThroughProxy(StoreContract):
    @pytest.fixture
    async def harness(
        self, azure_container: AzureContainer, passthrough: FaultProxy
    ) -> AsyncIterator[Harness]:
        seen = len(passthrough.seen)
        endpoint = f"{passthrough.url}/{AZURITE_ACCOUNT}"
        async with make_store(endpoint, azure_container.name) as store:
            yield Harness(store, lambda key, data: azure_container.put(f"{PREFIX}/{key}", data))
            assert store.stats.retries == 0
        assert all(s.outcome.startswith("forwarded ") for s in passthrough.seen[seen:])


def proxied(proxy: FaultProxy, container: str, **options: str) -> AzureStore:
    return make_store(f"{proxy.url}/{AZURITE_ACCOUNT}", container, **options)


@pytest.mark.anyio
async def test_listing_from_a_key_sends_start_from_and_filters(
    azure_container: AzureContainer, passthrough: FaultProxy
) -> None:
    """Azurite ignores ``startFrom`` (and --loose lets it): the store asks for it, as real
    Azure honours it, and drops the keys up to ``start_after`` itself."""
    for v in range(5):
        azure_container.put(f"{PREFIX}/_delta_log/{v:020d}.json", b"{}")
    async with proxied(passthrough, azure_container.name) as store:
        before = len(passthrough.seen)
        listed = await collect(store, "_delta_log/", f"_delta_log/{1:020d}.json")
        assert [m.key for m in listed] == [f"_delta_log/{v:020d}.json" for v in (2, 3, 4)]
        (request,) = passthrough.seen[before:]
        assert "comp=list" in request.path and "delimiter=/" in request.path
        assert f"&startFrom=tables/t1/_delta_log/{1:020d}.json" in request.path
        assert store.stats.list_requests == 1


# -------------------------------------------------------------------------------- retries


@pytest.fixture
def faults(azurite_server: str) -> Iterator[FaultProxy]:
    with FaultProxy(azurite_server.rsplit("/", 1)[0], keep_alive=False) as proxy:
        yield proxy


@pytest.mark.anyio
@pytest.mark.parametrize("fault", ["busy", "internal", "throttled"])
async def test_throttling_and_server_errors_are_retried(
    azure_container: AzureContainer, faults: FaultProxy, fault: str
) -> None:
    azure_container.put(f"{PREFIX}/k", b"data")
    events: list[RetryEvent] = []
    async with proxied(faults, azure_container.name, retry_base_delay="0.01") as store:
        store.retry_listener = events.append
        for call in (
            lambda: store.get("k"),
            lambda: store.head("k"),
            lambda: collect(store, ""),
            lambda: store.put("s/k", b"x"),
        ):
            faults.inject(fault, fault)
            await call()
        assert store.stats.retries == 8
    assert [e.attempt for e in events] == [1, 2] * 4
    assert [e.operation for e in events[::2]] == ["GET", "HEAD", "LIST", "PUT"]
    assert all(e.target.startswith(f"abfss://{azure_container.name}@") for e in events)
    status = {"busy": "503", "internal": "500", "throttled": "429"}[fault]
    assert all(e.cause.startswith(status) for e in events)


@pytest.mark.anyio
@pytest.mark.parametrize("fault", ["drop", "reset"])
async def test_broken_connections_are_retried(
    azure_container: AzureContainer, faults: FaultProxy, fault: str
) -> None:
    azure_container.put(f"{PREFIX}/k", b"data")
    events: list[RetryEvent] = []
    async with proxied(faults, azure_container.name, retry_base_delay="0.01") as store:
        store.retry_listener = events.append
        faults.inject(fault, fault, fault, fault)
        assert await store.get("k") == b"data"
        assert store.stats.retries == len(events) >= 1
    assert [s.outcome for s in faults.seen] == [fault] * 4 + ["forwarded 206"]  # SDK: ranged


@pytest.mark.anyio
async def test_exhausted_retries_are_one_line(
    azure_container: AzureContainer, faults: FaultProxy
) -> None:
    async with proxied(
        faults, azure_container.name, max_attempts="3", retry_base_delay="0.01"
    ) as store:
        store.retry_listener = lambda e: None
        faults.inject("busy", "busy", "busy")
        with pytest.raises(StorageError) as info:
            await store.get("k")
    message = str(info.value)
    assert message.startswith(f"{store.uri_for('k')}: GET failed after 3 attempt(s): 503")
    assert "\n" not in message


@pytest.mark.anyio
async def test_a_retried_create_whose_first_attempt_landed_succeeds(
    azure_container: AzureContainer, faults: FaultProxy
) -> None:
    async with proxied(faults, azure_container.name, retry_base_delay="0.01") as store:
        store.retry_listener = lambda e: None
        faults.inject("lost")  # the upload lands; its answer does not come back
        tag = await store.put("s/k", b"mine", if_match="")
        assert await store.get_tagged("s/k") == (b"mine", tag)


# -------------------------------------------------------------------------------- errors


@pytest.mark.anyio
async def test_a_forbidden_request_is_one_line_and_not_retried(
    azure_container: AzureContainer, faults: FaultProxy
) -> None:
    async with proxied(faults, azure_container.name) as store:
        faults.inject("denied")
        with pytest.raises(StorageError) as info:
            await store.get("k")
        assert store.stats.retries == 0
    assert isinstance(info.value, AccessDeniedError)
    assert str(info.value) == (
        f"{store.uri_for('k')}: GET failed after 1 attempt(s): 403 AccessDenied: Access Denied"
    )


@pytest.mark.anyio
async def test_missing_container_names_it(azurite_server: str) -> None:
    async with make_store(azurite_server, "no-such-container") as store:
        with pytest.raises(StorageError) as info:
            await collect(store, "_delta_log/")
    assert str(info.value) == (
        f"abfss://no-such-container@{AZURITE_ACCOUNT}.dfs.core.windows.net/{PREFIX}/"
        "_delta_log/: LIST failed: container 'no-such-container' does not exist"
    )


@pytest.mark.anyio
async def test_a_wrong_account_key_is_one_line(azure_container: AzureContainer) -> None:
    wrong = "A" * 4 + AZURITE_KEY[4:]
    async with make_store(
        azure_container.endpoint, azure_container.name, azure_storage_account_key=wrong
    ) as store:
        with pytest.raises(StorageError) as info:
            await store.head("k")
    message = str(info.value)
    assert isinstance(info.value, AccessDeniedError)
    assert message.startswith(f"{store.uri_for('k')}: HEAD failed after 1 attempt(s): 403")
    assert "\n" not in message and wrong not in message


@pytest.mark.anyio
async def test_a_sas_token_authorises(azure_container: AzureContainer) -> None:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    azure_container.put(f"{PREFIX}/k", b"data")
    sas = generate_container_sas(
        AZURITE_ACCOUNT,
        azure_container.name,
        account_key=AZURITE_KEY,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )
    async with make_store(
        azure_container.endpoint, azure_container.name, azure_storage_sas_token="?" + sas
    ) as store:
        assert await store.get("k") == b"data"
        assert [m.key for m in await collect(store, "")] == ["k"]
        with pytest.raises(StorageError, match="PUT failed after 1 attempt"):
            await store.put("s/k", b"x")  # read and list only


# ------------------------------------------------------------------------- options, URIs


def test_option_names_and_aliases() -> None:
    for name in ("azure_storage_account_name", "AZURE_STORAGE_ACCOUNT_NAME", "account_name"):
        assert AzureOptions.from_storage_options({name: "Acct"}, {}).account_name == "acct"
    env = AzureOptions.from_storage_options(None, {"AZURE_STORAGE_ACCOUNT_NAME": "fromenv"})
    assert env.account_name == "fromenv"
    key = AzureOptions.from_storage_options({"azure_storage_account_key": "c2VjcmV0"}, {})
    sas = AzureOptions.from_storage_options({"azure_storage_sas_token": "?sv=1&sig=s"}, {})
    assert (key.account_key, sas.sas_token) == ("c2VjcmV0", "sv=1&sig=s")
    assert "c2VjcmV0" not in repr(key) and "sig=s" not in repr(sas)
    principal = AzureOptions.from_storage_options(
        {"azure_client_id": "i", "azure_client_secret": "hidden", "azure_tenant_id": "t"}, {}
    )
    assert principal.client_secret == "hidden" and "hidden" not in repr(principal)
    emulator = AzureOptions.from_storage_options({"azure_storage_use_emulator": "true"}, {})
    assert emulator.use_emulator and emulator.account_for("az://c/t", None) == AZURITE_ACCOUNT
    assert emulator.account_url(AZURITE_ACCOUNT, None).endswith(f":10000/{AZURITE_ACCOUNT}")
    common = AzureOptions.from_storage_options({"max_attempts": "2", "azure_allow_http": "1"}, {})
    assert common.max_attempts == 2
    assert {"azure_storage_account_name", "azure_storage_use_emulator"} <= STORAGE_OPTION_NAMES
    assert AzureOptions().account_url("acct", None) == "https://acct.blob.core.windows.net"


@pytest.mark.parametrize(
    ("uri", "options", "message"),
    [
        ("az://c/t", {"azure_storage_acount_name": "a"}, "unknown Azure storage option"),
        ("az://c/t", {}, "no storage account"),
        ("az://c/t", {"azure_client_secret": "s"}, "go together"),
        ("az://c/t", {"account_key": "k", "sas_token": "s", "account_name": "a"}, "give one"),
        ("az://c/t", {"azure_storage_use_emulator": "perhaps"}, "not true or false"),
        ("az://c/t", {"endpoint_url": "ftp://x", "account_name": "a"}, "not an http"),
        ("abfss://c@one.dfs.core.windows.net/t", {"account_name": "two"}, "is not the account"),
        ("abfss://one.dfs.core.windows.net/t", {}, "container@account"),
    ],
)
def test_bad_options_and_uris_are_errors(
    uri: str, options: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    with pytest.raises(InvalidArgumentError, match=message):
        open_store(uri, options)


@pytest.mark.parametrize(
    "uri",
    [
        "az://c/a%20b/t",
        "azure://c/a%20b/t/",
        "abfss://c@acct.dfs.core.windows.net/a%20b/t",
        "abfs://c@acct.dfs.core.windows.net/a%20b/t",
        "wasbs://c@acct.blob.core.windows.net/a%20b/t",
        "https://acct.blob.core.windows.net/c/a%20b/t",
    ],
)
def test_every_uri_form_has_one_root(uri: str) -> None:
    store = open_store(uri, {"azure_storage_account_name": "acct"})
    assert isinstance(store, AzureStore)
    assert (store.account, store.container, store.prefix) == ("acct", "c", "a b/t")
    assert store.root_uri == "abfss://c@acct.dfs.core.windows.net/a b/t"
    assert store._client is None  # opening a store touches no network


# --------------------------------------------------------------------------- lifecycle


@pytest.mark.anyio
async def test_the_client_is_lazy_and_closed(azure_container: AzureContainer) -> None:
    store = make_store(azure_container.endpoint, azure_container.name)
    assert store._client is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with store:
            await collect(store, "")
            assert store._client is not None
        assert store._client is None
        gc.collect()
    assert not [w for w in caught if "Unclosed" in str(w.message)]
    with pytest.raises(StorageError, match="store is closed"):
        await store.get("k")


@pytest.mark.anyio
async def test_another_container_is_read_through_a_store_at_its_root(
    azure_container: AzureContainer,
) -> None:
    from azure.storage.blob import ContainerClient

    other = f"other-{uuid.uuid4().hex[:8]}"
    with ContainerClient.from_connection_string(
        azurite_connection_string(azure_container.endpoint), other
    ) as client:
        client.create_container()
        client.upload_blob("x/y", b"there")
    async with make_store(azure_container.endpoint, azure_container.name) as store:
        store.external_paths = store.external_paths.of(True)
        foreign, key = store.resolve(f"az://{other}/x/y")
        assert foreign is not store and key == "x/y"
        assert foreign.root_uri == f"abfss://{other}@{AZURITE_ACCOUNT}.dfs.core.windows.net"
        assert await foreign.get(key) == b"there"
        assert foreign.stats is store.stats
        with pytest.raises(Exception, match="cannot read files from that location"):
            store.resolve("abfss://c@otheraccount.dfs.core.windows.net/x")
