"""Async object stores: the only layer that touches files or the network.

:func:`open_store` turns a table URI (a local path, ``file://`` URI, ``s3://bucket/prefix``,
``gs://bucket/prefix`` or an Azure URI such as ``az://container/prefix`` or
``abfss://container@account.dfs.core.windows.net/prefix``) into an :class:`ObjectStore`
rooted at that location; :meth:`ObjectStore.watch` may offer a :class:`ChangeFeed` that
wakes a follower when objects appear in a directory.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from deltastream.errors import InvalidArgumentError
from deltastream.storage.base import ChangeFeed, ObjectMeta, ObjectStore, StoreStats
from deltastream.storage.local import LocalStore
from deltastream.storage.paths import ExternalPaths, ExternalPathsLike, StoreKind, store_kind

if TYPE_CHECKING:
    from deltastream.storage.azure import AzureOptions, AzureStore
    from deltastream.storage.gcs import GcsOptions, GcsStore
    from deltastream.storage.s3 import S3Options, S3Store

__all__ = [
    "OBJECT_STORES",
    "AzureOptions",
    "AzureStore",
    "ChangeFeed",
    "ExternalPaths",
    "GcsOptions",
    "GcsStore",
    "LocalStore",
    "ObjectMeta",
    "ObjectStore",
    "ObjectStoreKind",
    "S3Options",
    "S3Store",
    "StoreStats",
    "open_store",
    "require_extra",
    "storage_locations",
    "storage_option_help",
    "storage_option_names",
]


def __getattr__(name: str) -> Any:
    # aiobotocore is heavy to import (tens of MB, a noticeable fraction of a second), so
    # the S3 store is imported only when someone asks for it.
    if name in ("S3Options", "S3Store"):
        from deltastream.storage import s3

        return getattr(s3, name)
    if name in ("AzureOptions", "AzureStore"):
        from deltastream.storage import azure

        return getattr(azure, name)
    if name in ("GcsOptions", "GcsStore"):
        from deltastream.storage import gcs

        return getattr(gcs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class ObjectStoreKind:
    """An object store :func:`open_store` opens, as users name it: what help texts and
    messages list (:func:`storage_option_help`, :func:`storage_locations`)."""

    kind: StoreKind
    #: Its name for users.
    name: str
    #: Its URIs, as help texts show them.
    uris: str
    #: The module whose ``STORAGE_OPTION_NAMES`` lists every storage option it accepts.
    options_module: str
    #: A few of those options, for help texts.
    examples: tuple[str, ...]


#: Every object store, in the order help texts list them (a test keeps it in step with
#: :data:`~deltastream.storage.paths.StoreKind` and the stores' option names).
OBJECT_STORES: tuple[ObjectStoreKind, ...] = (
    ObjectStoreKind(
        "s3",
        "S3",
        "s3://bucket/prefix",
        "deltastream.storage.s3.options",
        ("endpoint_url", "region", "access_key_id"),
    ),
    ObjectStoreKind(
        "gs",
        "GCS",
        "gs://bucket/prefix",
        "deltastream.storage.gcs.options",
        ("google_service_account",),
    ),
    ObjectStoreKind(
        "az",
        "Azure",
        "an Azure URI (az://container/prefix, "
        "abfss://container@account.dfs.core.windows.net/prefix)",
        "deltastream.storage.azure.options",
        ("azure_storage_account_name",),
    ),
)


def storage_option_help() -> str:
    """Each object store with a few of its options: ``S3: endpoint_url, region, …; …``."""
    return "; ".join(f"{s.name}: {', '.join(s.examples)}, …" for s in OBJECT_STORES)


def storage_locations() -> str:
    """Where a table (or a state directory) may be: a local path or each object store's
    URIs."""
    uris = ["a local path", *(s.uris for s in OBJECT_STORES)]
    return f"{', '.join(uris[:-1])} or {uris[-1]}"


@functools.cache
def storage_option_names() -> frozenset[str]:
    """Every storage option name (lower case) some object store accepts: what a consumer
    whose options mix its own settings with the store's (the Spark source) passes to the
    store. Loads no client library."""
    names: frozenset[str] = frozenset()
    for store in OBJECT_STORES:
        names |= importlib.import_module(store.options_module).STORAGE_OPTION_NAMES
    return names


def require_extra(uri: str, extra: str, *modules: str, what: str = "store") -> None:
    """Refuse, in one line, a URI whose store (or sink: ``what``) needs an extra that is not
    installed."""
    import importlib.util

    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package is missing
            found = False
        if not found:
            raise InvalidArgumentError(
                f"{uri}: this {what} needs the {extra} extra: pip install "
                f"'deltastream[{extra}]' (missing: {module})"
            )


def open_store(
    uri: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    external_paths: ExternalPathsLike = None,
) -> ObjectStore:
    """Open a store rooted at ``uri``.

    Local paths may be relative; ``file:`` URIs are percent-decoded. ``storage_options`` only
    apply to object stores (endpoint, region, credentials, retry settings: each store's own
    names, an unknown name is an error); passing them for a local path is an error, so that
    a typo cannot silently read a different location. The clients of object stores are
    imported and created on first use: opening a store touches no network.
    ``external_paths`` says which files outside ``uri`` a table's log there may make the
    store read (:meth:`ExternalPaths.of`; default none).
    """
    store = _open(uri, storage_options)
    store.external_paths = ExternalPaths.of(external_paths)
    return store


def _open(uri: str, storage_options: Mapping[str, str] | None) -> ObjectStore:
    if not uri:
        raise InvalidArgumentError("empty table URI")
    kind = store_kind(uri)
    parts = urlsplit(uri)
    if kind == "s3":
        from deltastream.storage.s3 import S3Options, S3Store

        return S3Store(
            parts.netloc, unquote(parts.path), S3Options.from_storage_options(storage_options)
        )
    if kind == "gs":
        require_extra(uri, "gcs", "gcloud.aio.auth")
        from deltastream.storage.gcs import open_gcs_store

        return open_gcs_store(uri, storage_options)
    if kind == "az":
        require_extra(uri, "azure", "azure.storage.blob", "azure.identity")
        from deltastream.storage.azure import open_azure_store

        return open_azure_store(uri, storage_options)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidArgumentError(f"{uri}: file URIs must not name a host")
        path = unquote(parts.path)
    elif scheme and len(scheme) > 1:
        raise InvalidArgumentError(
            f"{uri}: unsupported URI scheme {scheme!r} (use a path, s3://, gs://, az://, "
            "abfss:// or https://account.blob.core.windows.net/)"
        )
    else:
        path = uri  # a plain path (a one-letter "scheme" is a Windows drive)
    if storage_options:
        raise InvalidArgumentError(
            f"{uri}: storage options {sorted(storage_options)} only apply to tables in object "
            "stores (s3://, gs://, Azure)"
        )
    return LocalStore(path)
