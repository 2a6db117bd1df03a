"""The objects of a replica group's lease directory, and which shard a stream is in.

One directory (local or in an object store), listed in one request::

    group.json              the group's shard count (written once, by the first replica)
    member-<id>.json        one per running process: who it is, renewed every ttl/5
    shard-0007.json         who holds shard 7 (absent: nobody ever did)

A member writes only its own ``member-`` object, and only with a conditional write against
the tag it last wrote: that is its heartbeat. A ``shard-`` object changes hands only by a
conditional write against the tag its writer read, so of two replicas taking one shard
exactly one succeeds. Everything is JSON with a ``format`` field; an object that cannot be
read is reported naming it, never taken for a free shard.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from deltastream.errors import CorruptFileError

__all__ = [
    "GROUP_KEY",
    "GroupRecord",
    "MemberRecord",
    "ShardRecord",
    "member_key",
    "parse_key",
    "shard_key",
    "shard_of",
]

_FORMAT = 1
GROUP_KEY = "group.json"
_MEMBER = "member-"
_SHARD = "shard-"

Role = Literal["replica", "run-once"]


def member_key(member: str) -> str:
    return f"{_MEMBER}{member}.json"


def shard_key(shard: int) -> str:
    return f"{_SHARD}{shard:04d}.json"


def parse_key(key: str) -> tuple[str, str | int] | None:
    """``("member", id)`` or ``("shard", n)`` for a key of the lease directory, else None
    (``group.json``, a temporary file a killed local write left, anything foreign)."""
    if not key.endswith(".json"):
        return None
    stem = key[: -len(".json")]
    if stem.startswith(_MEMBER) and len(stem) > len(_MEMBER):
        return "member", stem[len(_MEMBER) :]
    if stem.startswith(_SHARD) and stem[len(_SHARD) :].isdigit():
        return "shard", int(stem[len(_SHARD) :])
    return None


def shard_of(stream: str, shards: int) -> int:
    """The shard stream ``stream`` belongs to: a stable hash of its name (the same in every
    process and version, unlike Python's ``hash``)."""
    digest = hashlib.sha256(stream.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % shards


def _load(source: str, raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise CorruptFileError(source, f"not valid JSON: {e}") from None
    if not isinstance(value, dict) or value.get("format") != _FORMAT:
        raise CorruptFileError(source, "not a deltastream lease record of a known format")
    return value


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps({"format": _FORMAT, **value}, sort_keys=True).encode()


@dataclass(frozen=True)
class GroupRecord:
    """``group.json``: the shard count, fixed for the group's life (a different count would
    move streams), and the lease ttl of the replica that created it (what a ``tail`` of one
    of its streams, which has no configuration of the group, waits with)."""

    shards: int
    lease_ttl: float = 15.0

    def to_bytes(self) -> bytes:
        return _dump({"shards": self.shards, "lease_ttl": self.lease_ttl})

    @classmethod
    def from_bytes(cls, source: str, raw: bytes) -> GroupRecord:
        value = _load(source, raw)
        shards = value.get("shards")
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise CorruptFileError(source, f"holds no valid shard count: {shards!r}")
        ttl = value.get("lease_ttl", 15.0)
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl >= 1:
            raise CorruptFileError(source, f"holds no valid lease ttl: {ttl!r}")
        return cls(shards, float(ttl))


@dataclass(frozen=True)
class MemberRecord:
    """``member-<id>.json``: a running process of the group. ``seq`` grows with each
    renewal, so that every renewal changes the object's tag (that change is the heartbeat
    the others watch); ``host``, ``boot_id``, ``pid_ns``, ``pid`` and ``started`` let a
    process on the same machine, in the same pid namespace, see at once that a member's
    process is gone (:mod:`~deltastream.daemon.replicas.liveness`)."""

    member: str
    role: Role
    host: str
    pid: int
    boot_id: str = ""
    #: The process's start time in clock ticks since boot (Linux), with ``pid`` its identity.
    started: int = 0
    seq: int = 0
    #: The inode of the pid namespace ``pid`` is in (0: unknown, as in records of versions
    #: before it was recorded: such a member is judged by its heartbeat alone).
    pid_ns: int = 0
    #: Set while the member stops: it is no longer counted when shards are shared out.
    leaving: bool = False
    #: Where its /healthz answers (informational).
    http: str = ""

    def to_bytes(self) -> bytes:
        return _dump(
            {
                "member": self.member,
                "role": self.role,
                "host": self.host,
                "pid": self.pid,
                "boot_id": self.boot_id,
                "started": self.started,
                "pid_ns": self.pid_ns,
                "seq": self.seq,
                "leaving": self.leaving,
                "http": self.http,
            }
        )

    @classmethod
    def from_bytes(cls, source: str, raw: bytes) -> MemberRecord:
        value = _load(source, raw)
        try:
            role = value["role"]
            if role not in ("replica", "run-once"):
                raise ValueError(f"unknown role {role!r}")
            return cls(
                member=str(value["member"]),
                role=role,
                host=str(value["host"]),
                pid=int(value["pid"]),
                boot_id=str(value.get("boot_id", "")),
                started=int(value.get("started", 0)),
                seq=int(value.get("seq", 0)),
                pid_ns=int(value.get("pid_ns", 0)),
                leaving=bool(value.get("leaving", False)),
                http=str(value.get("http", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptFileError(source, f"not a valid member record: {e}") from None


@dataclass(frozen=True)
class ShardRecord:
    """``shard-NNNN.json``: who holds the shard (``""``: released), and how often it changed
    hands (each take or release writes the next ``generation``)."""

    owner: str
    generation: int

    def to_bytes(self) -> bytes:
        return _dump({"owner": self.owner, "generation": self.generation})

    @classmethod
    def from_bytes(cls, source: str, raw: bytes) -> ShardRecord:
        value = _load(source, raw)
        try:
            return cls(str(value["owner"]), int(value["generation"]))
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptFileError(source, f"not a valid shard record: {e}") from None
