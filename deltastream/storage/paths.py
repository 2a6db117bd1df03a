"""The meaning of a file path found in a Delta log, relative to the table's root.

This module owns every rule about such paths, so that each exists once:

* which paths are absolute (:func:`is_absolute`, :data:`ABSOLUTE_PATTERN` for Arrow kernels),
  on :func:`~deltastream.storage.uri.split_uri` (how a URI splits into scheme, authority and
  path, re-exported here);
* the forms a table root takes (:class:`TableRoot`): a store's ``root_uri`` (a decoded
  local path or ``s3://bucket/prefix``) or a percent-encoded ``file:`` URI;
* the canonical form of a log path, which action reconciliation compares
  (:func:`canonical_path`, :func:`canonical_paths` for Arrow columns);
* where a log path is read from: the store root and key (:func:`resolve_path`);
* whether a log path lies under the table root (:func:`is_under`).

Log paths (``add``/``remove``/``cdc`` paths, ``p`` deletion vector locations) are URIs
(PROTOCOL.md, "Add File and Remove File"): percent-encoded, relative to the table root or
absolute (``s3://bucket/key``, ``file:/x``, ``file:///x``, or a bare ``/x``). ``s3a://`` names
the same objects as ``s3://`` (Hadoop's spelling, which Spark writes). The rules are pure:
nothing here touches a file or the network.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal, TypeAlias, cast
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

from deltastream.errors import InvalidArgumentError
from deltastream.storage.azure.uri import (
    AZURE_SCHEMES,
    AzureLocation,
    azure_root_uri,
    is_azure_host,
    parse_azure_uri,
)
from deltastream.storage.uri import UriParts, refuse_nul, split_uri

__all__ = [
    "ABSOLUTE_PATTERN",
    "S3_SCHEMES",
    "ExternalPaths",
    "ExternalPathsLike",
    "ResolvedPath",
    "TableRoot",
    "UriParts",
    "canonical_path",
    "canonical_paths",
    "is_absolute",
    "is_under",
    "resolve_path",
    "split_uri",
]

#: Either kind of Arrow column (annotation only: pyarrow's classes are not generic at runtime).
AnyArray: TypeAlias = "pa.ChunkedArray[Any] | pa.Array[Any]"

#: The schemes of S3 URIs. ``s3a`` is Hadoop's connector, whose URIs Spark writes into logs.
S3_SCHEMES = ("s3", "s3a")
#: The scheme of Google Cloud Storage URIs (``gs://bucket/key``).
GCS_SCHEMES = ("gs",)

#: What kind of store a URI names (:func:`store_kind`).
StoreKind: TypeAlias = Literal["file", "s3", "gs", "az"]

#: Buckets' schemes by kind: a bucket-and-key URI of any of them names the same object.
_BUCKET_SCHEMES: dict[str, tuple[str, ...]] = {"s3": S3_SCHEMES, "gs": GCS_SCHEMES}

#: Matches absolute paths: a bare ``/…`` path or a URI with a scheme (RFC 3986's scheme
#: syntax). Written for both Python's ``re`` and Arrow's RE2 (``match_substring_regex``).
ABSOLUTE_PATTERN = r"^(/|[A-Za-z][A-Za-z0-9+.\-]*:)"

_ABSOLUTE = re.compile(ABSOLUTE_PATTERN)
#: Hosts of ``file:`` URIs that name this machine.
_LOCAL_HOSTS = ("", "localhost")


def store_kind(uri: str) -> StoreKind:
    """The kind of store that holds ``uri`` (a table root, state directory or log path):
    ``"s3"``, ``"gs"``, ``"az"`` or, for local paths and ``file:`` URIs, ``"file"``.
    Other schemes are ``"file"`` too: :func:`~deltastream.storage.open_store` refuses them."""
    parts = split_uri(uri)
    scheme = parts.scheme
    if scheme in S3_SCHEMES:
        return "s3"
    if scheme in GCS_SCHEMES:
        return "gs"
    if scheme in AZURE_SCHEMES:
        return "az"
    if scheme == "https" and is_azure_host(parts.authority):
        return "az"
    return "file"


def is_absolute(path: str) -> bool:
    """Whether a log path is absolute (a URI with a scheme, or ``/…``) rather than relative
    to the table root."""
    return _ABSOLUTE.match(path) is not None


@dataclass(frozen=True, slots=True)
class TableRoot:
    """A table root, parsed (:meth:`parse`).

    Roots come as a store's ``root_uri`` (a local path, ``s3://bucket/prefix``,
    ``gs://bucket/prefix`` or ``abfss://container@account.dfs.core.windows.net/prefix``, all
    already decoded), as a ``file:`` URI (percent-encoded), or as an allowed external root
    (any spelling of those). A root with any other scheme is taken as a plain local path, as
    it is written.
    """

    #: The root as given.
    uri: str
    #: Its store's kind (:func:`store_kind`).
    scheme: StoreKind
    #: The bucket of an S3 or GCS root; ``container@account`` of an Azure root (``container``
    #: alone for ``az://container``, whose account is any); ``""`` for a local one (``file:``
    #: roots name this machine: ``open_store`` refuses other hosts).
    authority: str
    #: The decoded path of the root without a trailing ``/``: ``""`` for ``/`` or a bucket.
    path: str

    @classmethod
    def parse(cls, uri: str) -> TableRoot:
        return _parse_root(uri)

    @property
    def canonical_prefixes(self) -> tuple[str, ...]:
        """The prefixes that :func:`canonical_path` strips: canonical URIs ending in ``/``."""
        if self.scheme in _BUCKET_SCHEMES:
            schemes = _BUCKET_SCHEMES[self.scheme]
            return tuple(f"{s}://{self.authority}{self.path}/" for s in schemes)
        if self.scheme == "az":
            return (f"az://{self.authority}{self.path}/",)
        return (f"file:{self.path}/",)

    @property
    def azure_account(self) -> str | None:
        """The account of an Azure root (None for others, and for ``az://container``)."""
        if self.scheme != "az" or "@" not in self.authority:
            return None
        return self.authority.partition("@")[2]


@functools.lru_cache(maxsize=64)
def _parse_root(uri: str) -> TableRoot:
    kind = store_kind(uri)
    if kind == "az":
        location = parse_azure_uri(uri)
        return TableRoot(uri, "az", _azure_authority(location), _slashed(location.path))
    parts = split_uri(uri)
    if kind != "file":
        prefix = parts.path.strip("/")
        return TableRoot(uri, kind, parts.authority or "", _slashed(prefix))
    # A ``file:`` root is a URI, percent-encoded; a plain path is taken as it is.
    path = unquote(parts.path) if parts.scheme == "file" else uri
    return TableRoot(uri, "file", "", path.rstrip("/"))


def _slashed(path: str) -> str:
    return f"/{path}" if path else ""


def _azure_authority(location: AzureLocation) -> str:
    if location.account is None:
        return location.container
    return f"{location.container}@{location.account}"


# --- canonical form (reconciliation) ---------------------------------------------------------


def canonical_path(table_root: str | TableRoot, path: str) -> str:
    """The decoded, canonical form of a log path; relative when it lies under the table root.

    ``file:/x``, ``file:///x`` and ``/x`` are the same file (``file:/x``), and absolute paths
    under the root become relative to it, as Delta's reference implementation does, so that
    an ``add`` with a relative path and a ``remove`` with the equivalent absolute one (as
    Spark writes after qualifying paths) have the same canonical form. Every spelling of an
    Azure location becomes ``az://container@account/path`` (``az://container/path`` takes the
    account of an Azure table root). Other URIs keep their scheme (lower-cased) and
    authority. Only percent-decoding is done: ``.``/``..`` segments are kept as written.
    """
    root = table_root if isinstance(table_root, TableRoot) else TableRoot.parse(table_root)
    return _canonical(path, root, root.canonical_prefixes)


def _canonical(path: str, root: TableRoot, prefixes: tuple[str, ...]) -> str:
    parts = split_uri(path)
    if not parts.scheme and not path.startswith("/"):
        return unquote(path)
    if parts.scheme in ("", "file"):
        # The authority of a file: URI is dropped: a remove written as file://host/x has
        # always matched the add of /x here (see the module's tests).
        canonical = "file:" + unquote(parts.path)
    elif store_kind(path) == "az":
        canonical = _canonical_azure(path, root)
    else:
        canonical = f"{parts.scheme}://{parts.authority or ''}{unquote(parts.path)}"
    for prefix in prefixes:
        if canonical.startswith(prefix):
            return canonical[len(prefix) :]
    return canonical


def canonical_paths(table_root: str | TableRoot, paths: AnyArray) -> AnyArray:
    """:func:`canonical_path` of every path of a string column (nulls stay null).

    Only the rows whose canonical form can differ from the path as written (absolute paths
    and paths with a ``%``) go through Python; the others are kept as they are, uncopied.
    The result has the column's type and chunking.
    """
    root = table_root if isinstance(table_root, TableRoot) else TableRoot.parse(table_root)
    if isinstance(paths, pa.ChunkedArray):
        chunks = [_canonical_chunk(c, root) for c in paths.chunks]
        return pa.chunked_array(chunks, type=paths.type)
    return _canonical_chunk(paths, root)


def _canonical_azure(path: str, root: TableRoot) -> str:
    try:
        location = parse_azure_uri(path)
    except InvalidArgumentError:
        # Not a location (abfss://host-without-container…): compared as written.
        parts = split_uri(path)
        return f"{parts.scheme}://{parts.authority or ''}{unquote(parts.path)}"
    account = location.account or root.azure_account
    authority = f"{location.container}@{account}" if account else location.container
    return f"az://{authority}{_slashed(location.path)}"


def _canonical_chunk(paths: pa.Array[Any], root: TableRoot) -> pa.Array[Any]:
    # true_count counts no nulls: null paths are never special, and stay null.
    special = pc.or_kleene(
        pc.match_substring_regex(paths, ABSOLUTE_PATTERN), pc.match_substring(paths, "%")
    )
    if special.true_count == 0:
        return paths
    mask = cast("pa.Array[pa.BooleanScalar]", special.fill_null(False))
    rows = cast(list[str], paths.filter(mask).to_pylist())
    prefixes = root.canonical_prefixes
    canonical = pa.array([_canonical(p, root, prefixes) for p in rows], type=paths.type)
    return cast("pa.Array[Any]", pc.replace_with_mask(paths, mask, canonical))


# --- resolution (reading) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResolvedPath:
    """Where a log path is read from (:func:`resolve_path`)."""

    #: The table root the path was resolved against, as given.
    table_root: str
    #: The root of the store to read through, spelled as that store's ``root_uri``: the table
    #: root itself, or for a file elsewhere the root of its file system (``/``) or its
    #: bucket (``s3://bucket``). None when no store of the table's kind can read it (another
    #: scheme, or a ``file:`` URI naming another host).
    store_root: str | None
    #: The decoded key below ``store_root`` (``""`` when ``store_root`` is None).
    key: str
    #: Whether the file lies under the table root (:func:`is_under`).
    under_root: bool

    @property
    def in_table_store(self) -> bool:
        """Whether the table's own store reads it (``store_root`` is the table root)."""
        return self.store_root == self.table_root


def resolve_path(table_root: str, path: str) -> ResolvedPath:
    """Where the log path ``path`` is read from, for a table rooted at ``table_root``.

    Relative paths are decoded and read through the table's store. Absolute ones are read
    through it too when they are spelled under its root: a local path lexically below it
    (``.`` and empty segments dropped, ``..`` kept, as :class:`~pathlib.PurePosixPath`
    does), an S3 key that starts with the root's prefix and ``/``. Other local paths are
    read from ``/`` and other S3 keys from their bucket's root. Keys may hold ``..``
    segments: a local store refuses them, S3 reads them as part of the key's name. This
    decides where a file is read, not whether it may be: that is :attr:`ResolvedPath.under_root`.

    Raises :class:`~deltastream.errors.InvalidArgumentError` for a path with a NUL byte or
    an S3 URI without a bucket.
    """
    root = TableRoot.parse(table_root)
    under = _under(root, path)  # first: it refuses NUL bytes
    if not is_absolute(path):
        return ResolvedPath(table_root, table_root, unquote(path), under)
    if root.scheme != "file":
        found = _remote_location(root, path)
        if found is None:
            return ResolvedPath(table_root, None, "", False)
        authority, key = found
        prefix = root.path[1:]
        if authority == root.authority and (not prefix or key.startswith(prefix + "/")):
            relative = key[len(prefix) + 1 :] if prefix else key
            return ResolvedPath(table_root, table_root, relative, under)
        return ResolvedPath(table_root, _bucket_root(root.scheme, authority), key, under)
    parts = split_uri(path)
    local = _local_path(parts)
    if local is None:
        return ResolvedPath(table_root, None, "", False)
    target = PurePosixPath(unquote(local))
    try:
        key = target.relative_to(root.path or "/").as_posix()
        return ResolvedPath(table_root, table_root, key, under)
    except ValueError:
        return ResolvedPath(table_root, "/", target.as_posix().lstrip("/"), under)


def _remote_location(root: TableRoot, path: str) -> tuple[str, str] | None:
    """The bucket (``container@account`` on Azure) and decoded key of the absolute log path
    ``path``, if it names an object in a store of ``root``'s kind; else None. The key is as
    the store names the object: decoded, with no segment normalised away (``x/../y`` is a
    name there)."""
    if store_kind(path) != root.scheme:
        return None
    if root.scheme == "az":
        try:
            location = parse_azure_uri(path)
        except InvalidArgumentError:
            return None
        account = location.account or root.azure_account
        authority = f"{location.container}@{account}" if account else location.container
        return authority, location.key
    parts = split_uri(path)
    if parts.authority is None:
        return None
    if not parts.authority:
        if not parts.path:  # "s3://": nothing at all
            return None
        kind = "an S3" if root.scheme == "s3" else "a GCS"
        scheme = parts.scheme
        raise InvalidArgumentError(f"{path}: {kind} URI needs a bucket: {scheme}://bucket/key")
    return parts.authority, unquote(parts.path[1:])


def _bucket_root(kind: StoreKind, authority: str) -> str:
    """The ``root_uri`` of the store at the top of a bucket (container) of ``kind``."""
    if kind == "az":
        container, _, account = authority.partition("@")
        return azure_root_uri(account, container, "")
    return f"{kind}://{authority}"


def _local_path(parts: UriParts) -> str | None:
    """The (encoded) path of a bare path or ``file:`` URI on this machine; None for other
    schemes and hosts."""
    if not parts.scheme:
        # A bare path that starts with "//" has an authority, as it would after "file:"
        # (RFC 3986's network-path reference).
        parts = split_uri("file:" + parts.path)
    if parts.scheme != "file":
        return None
    if parts.authority is None:
        return parts.path
    if parts.authority not in _LOCAL_HOSTS:
        return None
    return "/" + parts.path[1:]  # "file://host" names the host's "/"


# --- confinement ------------------------------------------------------------------------------


def is_under(root_uri: str, uri: str) -> bool:
    """Whether the log path ``uri`` names a file strictly below the table root ``root_uri``.

    ``root_uri`` is a table root as :class:`TableRoot` takes it; ``uri`` a log path, relative
    or absolute, percent-encoded. It lies under the root when it has the root's scheme
    (``s3``/``s3a`` alike; a bare path or ``file:`` for a local root), its authority (the
    bucket; no host or ``localhost`` for ``file:``) and, percent-decoded:

    * it is spelled as the root's path, ``/`` and more (S3 reads a key as it is spelled:
      ``s3://b/x/../t/y`` is the object ``x/../t/y``, outside ``s3://b/t``), and
    * with ``.`` and ``..`` segments resolved, it is still below the root's path (a file
      system resolves them: ``/t/../x`` is ``/x``).

    A relative path is under the root when, decoded, it does not start with ``/`` and its
    ``..`` segments do not lead out. The root itself is not under the root. Symbolic links
    are not looked at: this is a rule about spellings.

    Raises :class:`~deltastream.errors.InvalidArgumentError` when either holds a NUL byte.
    """
    return _under(TableRoot.parse(root_uri), uri)


def _under(root: TableRoot, path: str) -> bool:
    refuse_nul(root.uri, root.uri + root.path)
    refuse_nul(path, unquote(path))
    if not is_absolute(path):
        decoded = unquote(path)
        # A relative path whose decoded form starts with "/" ("%2Fetc%2Fx") is absolute to
        # Delta's reference implementation (Hadoop's Path decodes, then sees "/etc/x").
        return not decoded.startswith("/") and _below(root.path, root.path + "/" + decoded)
    if root.scheme != "file":
        found = _remote_location(root, path)
        if found is None or not _same_bucket(root, found[0]):
            return False
        decoded = "/" + found[1]
    else:
        encoded = _local_path(split_uri(path))
        if encoded is None:
            return False
        decoded = unquote(encoded)
    return decoded.startswith(root.path + "/") and _below(root.path, decoded)


def _same_bucket(root: TableRoot, authority: str) -> bool:
    """Whether ``authority`` (a bucket, or ``container[@account]``) is ``root``'s; an Azure
    root that names no account (an allowed external root ``az://container``) matches the
    container in any account."""
    if root.scheme == "az" and "@" not in root.authority:
        return authority.partition("@")[0] == root.authority
    return authority == root.authority


def _below(root: str, path: str) -> bool:
    """Whether ``path``, its ``.``/``..`` segments resolved, is strictly below ``root``."""
    base = _resolved_segments(root)
    segments = _resolved_segments(path)
    return len(segments) > len(base) and segments[: len(base)] == base


def _resolved_segments(path: str) -> list[str]:
    out: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if out:  # as at "/": ".." of the top is the top
                out.pop()
        elif segment not in ("", "."):
            out.append(segment)
    return out


# --- what a table's log may name outside its root ---------------------------------------------

#: Log paths that may name a file outside the table root (for :meth:`ExternalPaths.refused`).
_MAY_LEAD_OUT = ABSOLUTE_PATTERN + r"|(^|/)\.\.(/|$)|%2[EeFf]"


@dataclass(frozen=True, slots=True)
class ExternalPaths:
    """Which files outside the table root a table's log may make deltastream read (data,
    change-data and deletion-vector files). By default none: a table's log is someone
    else's input, and the credentials reading it often reach further than the table.

    ``allow_all`` lets any path through (shallow clones, tables whose files were written
    under absolute paths elsewhere); ``roots`` only absolute paths under one of them.
    """

    allow_all: bool = False
    roots: tuple[str, ...] = ()

    @classmethod
    def of(cls, value: bool | str | Sequence[str] | ExternalPaths | None) -> ExternalPaths:
        """From an option's value: ``True`` or ``"true"`` (any path), ``False``, ``"false"``
        or ``None`` (none), a root or a comma-separated string of roots, or a sequence of
        roots."""
        if isinstance(value, ExternalPaths):
            return value
        if value is None or value is False:
            return cls()
        if value is True:
            return cls(allow_all=True)
        if isinstance(value, str) and value.strip().lower() in ("true", "false", ""):
            return cls(allow_all=value.strip().lower() == "true")
        items = value.split(",") if isinstance(value, str) else list(value)
        roots = tuple(r.strip().rstrip("/") for r in items if r.strip())
        for root in roots:
            if not isinstance(root, str) or not is_absolute(root):
                raise InvalidArgumentError(
                    f"allowed external root {root!r}: give an absolute path or a URI"
                )
            refuse_nul(root, unquote(root))
        if not roots:
            raise InvalidArgumentError("allowed external roots: none given")
        return cls(roots=roots)

    @property
    def confined(self) -> bool:
        return not self.allow_all and not self.roots

    def permits(self, table_root: str, path: str) -> bool:
        """Whether the log path ``path`` of the table at ``table_root`` may be read: under
        the table root, or allowed by this policy (a relative path leading out of the table
        only with ``allow_all``)."""
        if _under(TableRoot.parse(table_root), path) or self.allow_all:
            return True
        return is_absolute(path) and any(is_under(root, path) for root in self.roots)

    def refused(self, table_root: str, paths: AnyArray) -> str | None:
        """The first of ``paths`` (an Arrow array of log paths; nulls ignored) this policy
        does not let the table at ``table_root`` read, or None. Only paths that could lead
        out (absolute, with a ``..`` segment, or with an encoded ``.`` or ``/``) are looked
        at one by one: a checkpoint of a million relative paths costs one regex pass."""
        if self.allow_all or not len(paths):
            return None
        compute: Any = pc  # its stubs reject a regex match on a chunked array
        mask = compute.fill_null(compute.match_substring_regex(paths, _MAY_LEAD_OUT), False)
        if not compute.any(mask).as_py():
            return None
        seen: set[str] = set()
        for path in cast("list[str | None]", compute.filter(paths, mask).to_pylist()):
            if path is None or path in seen:
                continue
            seen.add(path)
            if not self.permits(table_root, path):
                return path
        return None

    def describe(self) -> str:
        if self.allow_all:
            return "any path"
        return ", ".join(self.roots) if self.roots else "none"


#: The default: a table's log may make deltastream read no file outside the table root.
CONFINED = ExternalPaths()

#: What an ``allow_external_paths`` option takes (:meth:`ExternalPaths.of`).
ExternalPathsLike: TypeAlias = "ExternalPaths | bool | str | Sequence[str] | None"
