"""Google Cloud Storage: ``gs://bucket/prefix`` tables over GCS's JSON API.

:class:`GcsStore` (:mod:`.store`) serves the objects, on aiohttp with credentials from
``gcloud-aio-auth`` (the ``deltastream[gcs]`` extra); :class:`GcsOptions` (:mod:`.options`)
holds its settings, parsed from storage options named as delta-rs names them. The store and
its libraries are imported on first use: the options are not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from deltastream.storage.gcs.options import STORAGE_OPTION_NAMES, GcsOptions

if TYPE_CHECKING:
    from deltastream.storage.gcs.store import GcsStore

__all__ = ["STORAGE_OPTION_NAMES", "GcsOptions", "GcsStore", "open_gcs_store"]


def __getattr__(name: str) -> Any:
    if name == "GcsStore":
        from deltastream.storage.gcs.store import GcsStore

        return GcsStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_gcs_store(uri: str, storage_options: Mapping[str, str] | None) -> GcsStore:
    """The store rooted at ``gs://bucket/prefix``."""
    from urllib.parse import unquote

    from deltastream.errors import InvalidArgumentError
    from deltastream.storage.gcs.store import GcsStore
    from deltastream.storage.paths import split_uri

    parts = split_uri(uri)
    if not parts.authority:
        raise InvalidArgumentError(f"{uri}: a GCS URI needs a bucket: gs://bucket/path")
    options = GcsOptions.from_storage_options(storage_options)
    return GcsStore(parts.authority, unquote(parts.path), options)
