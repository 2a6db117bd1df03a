"""How a URI splits into scheme, authority and path (:func:`split_uri`), the host of an
authority, and the refusal of names holding NUL: the ground rules under
:mod:`deltastream.storage.paths` (log paths, table roots) and
:mod:`deltastream.storage.azure.uri` (Azure's spellings), which both build on them. Pure:
nothing here touches a file or the network.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from deltastream.errors import InvalidArgumentError

__all__ = ["UriParts", "refuse_nul", "split_uri", "uri_host"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):(.*)$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class UriParts:
    """A URI split as RFC 3986 does, except that ``?`` and ``#`` stay in the path: raw ones
    appear in real file names, and log paths carry no queries or fragments."""

    #: Lower-cased; ``""`` when there is none (a relative path or a bare ``/…`` path).
    scheme: str
    #: What follows ``//``; None when the URI has no ``//`` (``file:/x``), which differs
    #: from an empty authority (``file:///x``).
    authority: str | None
    #: The rest, still percent-encoded: the whole string when there is no scheme.
    path: str


def split_uri(uri: str) -> UriParts:
    """``uri`` as scheme, authority and path (see :class:`UriParts`).

    A one-letter scheme is a scheme (``C:/x`` is not a local path here): Hadoop reads such
    log paths the same way.
    """
    m = _SCHEME.match(uri)
    if m is None:
        return UriParts("", None, uri)
    scheme, rest = m.group(1).lower(), m.group(2)
    if rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        return UriParts(scheme, authority, slash + path)
    return UriParts(scheme, None, rest)


def uri_host(authority: str | None) -> str:
    """The host of a URI's authority (no user, no port)."""
    return (authority or "").rpartition("@")[2].partition(":")[0]


def refuse_nul(name: str, decoded: str) -> None:
    """Raise if ``decoded`` (``name`` or a part of it, percent-decoded) holds a NUL byte."""
    # No file system or object store name can hold NUL (S3 keys cannot be listed with one,
    # POSIX paths end at it): such a path is an error, never a silently truncated name.
    if "\x00" in decoded:
        raise InvalidArgumentError(f"{name!r}: a path with a NUL byte cannot name a file")
