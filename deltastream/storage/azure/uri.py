"""Azure's URI spellings: which URIs name Azure Blob Storage / ADLS Gen2
(:data:`AZURE_SCHEMES`, :func:`is_azure_host`), where one points (:func:`parse_azure_uri`)
and the one spelling of a location (:func:`azure_root_uri`). Pure, and free of the Azure
libraries: :mod:`deltastream.storage.paths` uses it for every table, whatever its store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from deltastream.errors import InvalidArgumentError
from deltastream.storage.uri import refuse_nul, split_uri, uri_host

__all__ = ["AZURE_SCHEMES", "AzureLocation", "azure_root_uri", "is_azure_host", "parse_azure_uri"]

#: The schemes of Azure Blob Storage / ADLS Gen2 URIs: ``az://container/path`` (and
#: ``azure://``: the account comes from the options), ``abfs[s]://container@account.dfs…/path``
#: (Hadoop's ADLS Gen2 driver, which Spark writes) and ``wasb[s]://container@account.blob…``
#: (its legacy Blob driver). ``https://account.blob.core.windows.net/container/path`` URIs
#: are Azure too (:func:`is_azure_host`).
AZURE_SCHEMES = ("az", "azure", "abfs", "abfss", "wasb", "wasbs")

#: ``<account>.<service>.<suffix>`` hosts of Azure storage endpoints (public and sovereign
#: clouds, Microsoft Fabric's OneLake).
_AZURE_HOST = re.compile(
    r"^(?P<account>[a-z0-9-]+)\.(?P<service>blob|dfs)\.(?P<suffix>core\.windows\.net|"
    r"core\.chinacloudapi\.cn|core\.usgovcloudapi\.net|fabric\.microsoft\.com)$",
    re.IGNORECASE,
)


def is_azure_host(authority: str | None) -> bool:
    """Whether an ``https://`` URI's authority is an Azure storage endpoint."""
    return _AZURE_HOST.match(uri_host(authority)) is not None


@dataclass(frozen=True, slots=True)
class AzureLocation:
    """Where an Azure URI points (:func:`parse_azure_uri`)."""

    #: The storage account; None for ``az://container/path``, whose account the options name.
    account: str | None
    container: str
    #: The decoded path inside the container, without leading or trailing ``/``.
    path: str
    #: The endpoint's DNS suffix (``core.windows.net``); None when the URI names none.
    suffix: str | None = None
    #: The blob name as the URI spells it: decoded, one leading ``/`` dropped, nothing else.
    key: str = ""


def parse_azure_uri(uri: str) -> AzureLocation:
    """The account, container and path of an Azure URI: ``az://container/path``,
    ``azure://container/path``, ``abfs[s]://container@account.dfs.core.windows.net/path``,
    ``wasb[s]://container@account.blob.core.windows.net/path`` or
    ``https://account.(blob|dfs).core.windows.net/container/path``.

    Raises :class:`~deltastream.errors.InvalidArgumentError` for any other URI, or one
    without a container.
    """
    parts = split_uri(uri)
    scheme = parts.scheme
    authority = parts.authority or ""
    if scheme in ("az", "azure"):
        container, path = authority, parts.path
        if "@" in container:  # object_store also takes az://container@account.dfs…/path
            return _azure_with_account(uri, authority, path)
        location = AzureLocation(None, unquote(container), _inner(path), None, _key(path))
    elif scheme in ("abfs", "abfss", "wasb", "wasbs"):
        if "@" not in authority:
            raise InvalidArgumentError(
                f"{uri}: an {scheme}:// URI names container@account.dfs.core.windows.net"
            )
        location = _azure_with_account(uri, authority, parts.path)
    elif scheme == "https":
        host = _AZURE_HOST.match(uri_host(authority))
        if host is None:
            raise InvalidArgumentError(f"{uri}: not an Azure storage URL")
        container, _, path = parts.path.lstrip("/").partition("/")
        account, suffix = host.group("account").lower(), host.group("suffix")
        location = AzureLocation(account, unquote(container), _inner(path), suffix, unquote(path))
    else:
        raise InvalidArgumentError(f"{uri}: not an Azure URI")
    if not location.container:
        raise InvalidArgumentError(f"{uri}: an Azure URI needs a container")
    refuse_nul(uri, location.container + location.path)
    return location


def _azure_with_account(uri: str, authority: str, path: str) -> AzureLocation:
    container, _, host = authority.partition("@")
    match = _AZURE_HOST.match(host)
    if match is None:
        raise InvalidArgumentError(
            f"{uri}: {host!r} is not an Azure storage host (account.dfs.core.windows.net)"
        )
    account, suffix = match.group("account").lower(), match.group("suffix")
    return AzureLocation(account, unquote(container), _inner(path), suffix, _key(path))


def _inner(path: str) -> str:
    return unquote(path).strip("/")


def _key(path: str) -> str:
    return unquote(path[1:] if path.startswith("/") else path)


def azure_root_uri(account: str, container: str, path: str, suffix: str | None = None) -> str:
    """The one spelling of an Azure location (a store's ``root_uri``):
    ``abfss://container@account.dfs.core.windows.net/path``, decoded, with no trailing ``/``.
    Every other spelling of the location (``az://``, ``https://``, ``wasbs://``…) parses to it."""
    root = f"abfss://{container}@{account}.dfs.{suffix or 'core.windows.net'}"
    path = path.strip("/")
    return f"{root}/{path}" if path else root
