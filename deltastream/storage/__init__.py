"""Async object stores: the only layer that touches files or the network.

:func:`open_store` turns a table URI (a local path, ``file://`` URI or ``s3://bucket/prefix``)
into an :class:`ObjectStore` rooted at that location; :meth:`ObjectStore.watch` may offer a
:class:`ChangeFeed` that wakes a follower when objects appear in a directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from deltastream.errors import InvalidArgumentError
from deltastream.storage.base import ChangeFeed, ObjectMeta, ObjectStore, StoreStats
from deltastream.storage.local import LocalStore
from deltastream.storage.paths import S3_SCHEMES, ExternalPaths, ExternalPathsLike

if TYPE_CHECKING:
    from deltastream.storage.s3 import S3Options, S3Store

__all__ = [
    "ChangeFeed",
    "ExternalPaths",
    "LocalStore",
    "ObjectMeta",
    "ObjectStore",
    "S3Options",
    "S3Store",
    "StoreStats",
    "open_store",
]


def __getattr__(name: str) -> Any:
    # aiobotocore is heavy to import (tens of MB, a noticeable fraction of a second), so
    # the S3 store is imported only when someone asks for it.
    if name in ("S3Options", "S3Store"):
        from deltastream.storage import s3

        return getattr(s3, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_store(
    uri: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    external_paths: ExternalPathsLike = None,
) -> ObjectStore:
    """Open a store rooted at ``uri``.

    Local paths may be relative; ``file:`` URIs are percent-decoded. ``storage_options`` only
    apply to S3 (endpoint, region, credentials, retry settings); passing them for a local
    path is an error, so that a typo cannot silently read a different location.
    ``external_paths`` says which files outside ``uri`` a table's log there may make the
    store read (:meth:`ExternalPaths.of`; default none).
    """
    store = _open(uri, storage_options)
    store.external_paths = ExternalPaths.of(external_paths)
    return store


def _open(uri: str, storage_options: Mapping[str, str] | None) -> ObjectStore:
    if not uri:
        raise InvalidArgumentError("empty table URI")
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in S3_SCHEMES:
        from deltastream.storage.s3 import S3Options, S3Store

        return S3Store(
            parts.netloc, unquote(parts.path), S3Options.from_storage_options(storage_options)
        )
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidArgumentError(f"{uri}: file URIs must not name a host")
        path = unquote(parts.path)
    elif scheme and len(scheme) > 1:
        raise InvalidArgumentError(
            f"{uri}: unsupported URI scheme {scheme!r} (use a path or s3://)"
        )
    else:
        path = uri  # a plain path (a one-letter "scheme" is a Windows drive)
    if storage_options:
        raise InvalidArgumentError(
            f"{uri}: storage options {sorted(storage_options)} only apply to s3:// tables"
        )
    return LocalStore(path)
