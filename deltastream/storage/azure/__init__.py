"""Azure Blob Storage and ADLS Gen2: tables under ``az://``, ``abfss://``, ``wasbs://`` and
``https://account.blob.core.windows.net`` URIs, through the official ``azure-storage-blob``
asyncio client with ``azure-identity`` (the ``deltastream[azure]`` extra).

:class:`AzureStore` (:mod:`.store`) serves the objects; :class:`AzureOptions`
(:mod:`.options`) holds its settings, parsed from storage options named as delta-rs names
them; :mod:`.uri` reads Azure's URI spellings; :func:`open_azure_store` puts the URI and the
options together. The store and its libraries are imported on first use: the options and
the URI rules are not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from deltastream.storage.azure.options import STORAGE_OPTION_NAMES, AzureOptions
from deltastream.storage.azure.uri import parse_azure_uri

if TYPE_CHECKING:
    from deltastream.storage.azure.store import AzureStore

__all__ = ["STORAGE_OPTION_NAMES", "AzureOptions", "AzureStore", "open_azure_store"]


def __getattr__(name: str) -> Any:
    if name == "AzureStore":
        from deltastream.storage.azure.store import AzureStore

        return AzureStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_azure_store(uri: str, storage_options: Mapping[str, str] | None) -> AzureStore:
    """The store rooted at an Azure URI (see :func:`.uri.parse_azure_uri` for the forms); its
    account is the URI's, or the options' for ``az://``."""
    from deltastream.storage.azure.store import AzureStore

    location = parse_azure_uri(uri)
    options = AzureOptions.from_storage_options(storage_options)
    account = options.account_for(uri, location.account)
    return AzureStore(account, location.container, location.path, options, location.suffix)
