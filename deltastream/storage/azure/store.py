"""The Azure store (:class:`AzureStore`): Blob Storage (and ADLS Gen2, whose files are blobs)
through ``azure-storage-blob``'s asyncio client.

The client's own retries are off (``retry_total=0``): every request goes through
:func:`~deltastream.storage.retry.call_with_retries`, which retries 408, 429 and 5xx answers
(``503 ServerBusy``, ``500 OperationTimedOut``…) and connection errors. Version tags are
ETags: ``put(if_match="")`` sends ``If-None-Match: *``, ``put(if_match=etag)`` ``If-Match``.
Listings pass the List Blobs ``startFrom`` parameter and also drop keys up to
``start_after`` themselves (``startFrom`` is inclusive, and Azurite ignores it).

The client and the credential are created on the first request and closed by
:meth:`AzureStore.aclose`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import pyarrow as pa
from azure.core import MatchConditions
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    IncompleteReadError,
    ServiceRequestError,
    ServiceResponseError,
)

from deltastream.errors import (
    AccessDeniedError,
    InvalidArgumentError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
)
from deltastream.storage.azure.options import EMULATOR_ACCOUNT, EMULATOR_KEY, AzureOptions
from deltastream.storage.azure.uri import azure_root_uri, parse_azure_uri
from deltastream.storage.base import ObjectMeta, ObjectStore, check_byte_range
from deltastream.storage.paths import store_kind
from deltastream.storage.ranged import open_remote_file

__all__ = ["AzureStore"]

T = TypeVar("T")
log = logging.getLogger("deltastream.storage.azure")

_RETRY_STATUSES = frozenset({408, 429})
_CONNECTION_ERRORS = (ServiceRequestError, ServiceResponseError, IncompleteReadError)
#: Blobs per listing page (the service's maximum).
PAGE_SIZE = 5000


def _code(error: HttpResponseError) -> str:
    code = getattr(error, "error_code", None)  # set by the storage SDK's error mapping
    return str(getattr(code, "value", code) or "")


def _summary(error: HttpResponseError) -> str:
    """``403 AuthorizationFailure: Server failed to authenticate…``: one line."""
    message = (error.reason or "") if error.message is None else error.message
    first = message.strip().splitlines()[0] if message and message.strip() else ""
    first = first.removeprefix("Operation returned an invalid status ").strip("'")
    code = _code(error)
    head = f"{error.status_code} {code}".strip() if error.status_code else code
    return f"{head}: {first}" if first else head


def _transient(error: BaseException) -> str | None:
    if isinstance(error, HttpResponseError) and not isinstance(error, ClientAuthenticationError):
        status = error.status_code or 0
        if status in _RETRY_STATUSES or status >= 500:
            return _summary(error)
        return None
    if isinstance(error, _CONNECTION_ERRORS):
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return None


class AzureStore(ObjectStore):
    """Blobs under one container and prefix of a storage account. Polling is the only watch
    mechanism (docs/object-stores.md, "Watching", says how Event Grid notifications could be
    relayed)."""

    def __init__(
        self,
        account: str,
        container: str,
        prefix: str = "",
        options: AzureOptions | None = None,
        suffix: str | None = None,
    ) -> None:
        super().__init__()
        if not account or not container:
            raise InvalidArgumentError("an Azure location needs an account and a container")
        self.account = account
        self.container = container
        self.prefix = prefix.strip("/")
        self.suffix = suffix
        self.options = options or AzureOptions()
        self.max_concurrency = self.options.max_concurrency
        self._client: Any = None
        self._container_client: Any = None
        self._credential: Any = None
        self._lock = anyio.Lock()
        self._closed = False
        #: Blobs per listing page asked for (tests make it small to see several pages).
        self.list_page_size = PAGE_SIZE

    def __repr__(self) -> str:
        return f"AzureStore({self.root_uri!r})"

    @property
    def root_uri(self) -> str:
        return azure_root_uri(self.account, self.container, self.prefix, self.suffix)

    def _name(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    # --- the client ---------------------------------------------------------------------

    async def _container(self) -> Any:
        if self._container_client is not None:
            return self._container_client
        async with self._lock:
            if self._closed:
                raise StorageError(self.root_uri, "store is closed")
            if self._container_client is None:
                from azure.storage.blob.aio import BlobServiceClient

                # The SDK logs every request and response at INFO: quiet unless asked for.
                http_log = logging.getLogger("azure.core.pipeline.policies.http_logging_policy")
                if http_log.level == logging.NOTSET:
                    http_log.setLevel(logging.WARNING)
                opts = self.options
                self._credential = self._new_credential()
                self._client = BlobServiceClient(
                    opts.account_url(self.account, self.suffix),
                    credential=self._credential,
                    retry_total=0,
                    connection_timeout=opts.connect_timeout,
                    read_timeout=opts.read_timeout,
                )
                self._container_client = self._client.get_container_client(self.container)
        return self._container_client

    def _new_credential(self) -> Any:
        opts = self.options
        if opts.sas_token:
            return opts.sas_token
        if opts.account_key:
            return {"account_name": self.account, "account_key": opts.account_key}
        if opts.client_secret:
            from azure.identity.aio import ClientSecretCredential

            assert opts.tenant_id is not None and opts.client_id is not None
            return ClientSecretCredential(opts.tenant_id, opts.client_id, opts.client_secret)
        if opts.use_emulator or (opts.endpoint_url and self.account == EMULATOR_ACCOUNT):
            return {"account_name": self.account, "account_key": EMULATOR_KEY}
        from azure.identity.aio import DefaultAzureCredential

        return DefaultAzureCredential(managed_identity_client_id=opts.client_id)

    async def aclose(self) -> None:
        async with self._lock:
            self._closed = True
            client, self._client = self._client, None
            self._container_client = None
            credential, self._credential = self._credential, None
        if client is not None:
            await client.close()
        if credential is not None and hasattr(credential, "close"):
            await credential.close()
        await self._close_foreign()

    async def _call(self, uri: str, operation: str, op: Callable[[Any], Awaitable[T]]) -> T:
        container = await self._container()

        async def attempt() -> T:
            return await op(container)

        try:
            return await self._with_retries(
                attempt,
                operation=operation,
                target=uri,
                policy=self.options.retry_policy,
                transient=_transient,
                logger=log,
            )
        except HttpResponseError as e:
            code = _code(e)
            if code == "ContainerNotFound":
                raise StorageError(
                    uri, f"{operation} failed: container {self.container!r} does not exist"
                ) from e
            if e.status_code == 404:
                raise ObjectNotFoundError(uri) from e
            if e.status_code == 412 or code == "BlobAlreadyExists":
                raise PreconditionFailedError(uri) from e
            if e.status_code in (401, 403):
                raise AccessDeniedError(
                    uri, f"{operation} failed after 1 attempt(s): {_summary(e)}"
                ) from e
            raise StorageError(uri, f"{operation} failed after 1 attempt(s): {_summary(e)}") from e
        except ClientAuthenticationError as e:  # a credential could not get a token
            raise StorageError(uri, f"{operation} failed: no Azure credentials: {e}") from e

    # --- reads --------------------------------------------------------------------------

    async def list_from(
        self, directory: str, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        prefix = directory if not directory or directory.endswith("/") else directory + "/"
        full_prefix = self._name(prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        uri = self.uri_for(prefix)
        floor = self._name(start_after) if start_after is not None else None
        container = await self._container()
        kwargs: dict[str, Any] = {"delimiter": "/", "results_per_page": self.list_page_size}
        if floor is not None:
            kwargs["start_from"] = floor
        pages = container.walk_blobs(name_starts_with=full_prefix, **kwargs).by_page()

        async def next_page(_: Any) -> list[Any] | None:
            self.stats.list_requests += 1
            try:
                page = await pages.__anext__()
            except StopAsyncIteration:
                return None
            return [item async for item in page]

        while True:
            # A page fetched again after a failure continues where it stopped: the pager
            # keeps its continuation marker until a page has come back whole.
            items = await self._call(uri, "LIST", next_page)
            if items is None:
                self.stats.list_requests -= 1  # the pager knew it was done: no request made
                return
            for item in items:
                size = getattr(item, "size", None)
                if size is None:  # a BlobPrefix: a "subdirectory"
                    continue
                name = item.name
                if floor is not None and name <= floor:
                    continue
                key = name[len(self.prefix) + 1 :] if self.prefix else name
                if key == prefix:  # a "directory marker" blob
                    continue
                yield ObjectMeta(
                    key=key,
                    size=int(size),
                    last_modified_ms=int(item.last_modified.timestamp() * 1000),
                    tag=_quoted(str(item.etag or "")),
                )

    async def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        uri = self.uri_for(key)
        check_byte_range(uri, byte_range)
        if byte_range is not None and byte_range[0] == byte_range[1]:
            return b""

        async def fetch(container: Any) -> bytes:
            self.stats.get_requests += 1
            blob = container.get_blob_client(self._name(key))
            if byte_range is None:
                downloader = await blob.download_blob()
            else:
                start, end = byte_range
                downloader = await blob.download_blob(offset=start, length=end - start)
            data: bytes = await downloader.readall()
            return data

        try:
            return await self._call(uri, "GET", fetch)
        except StorageError as e:
            cause = e.__cause__
            if isinstance(cause, HttpResponseError) and cause.status_code == 416:
                return b""  # the range starts past the end: nothing there, as for local files
            raise

    async def get_tagged(self, key: str) -> tuple[bytes, str]:
        async def fetch(container: Any) -> tuple[bytes, str]:
            self.stats.get_requests += 1
            downloader = await container.get_blob_client(self._name(key)).download_blob()
            # The SDK reads a large blob in parts, each conditional on the first part's ETag.
            data: bytes = await downloader.readall()
            return data, str(downloader.properties.etag)

        return await self._call(self.uri_for(key), "GET", fetch)

    async def head(self, key: str) -> ObjectMeta:
        async def properties(container: Any) -> Any:
            self.stats.head_requests += 1
            return await container.get_blob_client(self._name(key)).get_blob_properties()

        props = await self._call(self.uri_for(key), "HEAD", properties)
        return ObjectMeta(
            key=key,
            size=int(props.size),
            last_modified_ms=int(props.last_modified.timestamp() * 1000),
            tag=str(props.etag),
        )

    async def open_file(self, key: str, size: int | None = None) -> pa.NativeFile:
        return await open_remote_file(self, key, size)

    # --- writes -------------------------------------------------------------------------

    async def put(self, key: str, data: bytes, *, if_match: str | None = None) -> str:
        uri = self.uri_for(key)
        kwargs: dict[str, Any] = {"overwrite": True}
        if if_match == "":
            kwargs["if_none_match"] = "*"
        elif if_match is not None:
            kwargs["etag"] = if_match
            kwargs["match_condition"] = MatchConditions.IfNotModified

        async def upload(container: Any) -> str:
            self.stats.put_requests += 1
            blob = container.get_blob_client(self._name(key))
            answer = await blob.upload_blob(data, **kwargs)
            return str(answer["etag"])

        try:
            return await self._call(uri, "PUT", upload)
        except PreconditionFailedError:
            # A retried upload whose first attempt landed (its answer was lost) fails its
            # own precondition; the blob then holds exactly these bytes. (The retry may be
            # aiohttp's own, on a closed connection, unseen by the retry policy: so compare
            # the bytes whatever the count of retries says.)
            landed = None if if_match is None else await self._put_landed(key, data)
            if landed is None:
                raise
            return landed

    async def delete(self, key: str) -> None:
        async def remove(container: Any) -> None:
            await container.get_blob_client(self._name(key)).delete_blob()

        with contextlib.suppress(ObjectNotFoundError):  # gone already: what was asked
            await self._call(self.uri_for(key), "DELETE", remove)

    def _store_at(self, root_uri: str) -> ObjectStore | None:
        # Another container of this account is read through a store at its root, with this
        # store's options and counters; other accounts need credentials of their own.
        if store_kind(root_uri) != "az":
            return None
        location = parse_azure_uri(root_uri)
        if location.account not in (None, self.account):
            return None
        container = location.container
        return self._foreign_store(
            container,
            lambda: AzureStore(self.account, container, "", self.options, self.suffix),
        )


def _quoted(etag: str) -> str:
    """An ETag as writes and ``head`` give it (quoted): listings give it bare."""
    return f'"{etag}"' if etag and not etag.startswith('"') else etag
