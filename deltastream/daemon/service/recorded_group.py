"""The replica group a stream's state names, for a ``tail`` of that stream.

A stream run by replicas records the group's lease directory in its state. ``tail`` has no
configuration of the group, so it reads that record (and the group's shard count and lease
ttl from ``group.json``) and takes the stream's lease as an exclusive member: refused while a
replica runs the stream, and holding it against the replicas while it runs.
"""

from __future__ import annotations

from deltastream.daemon.replicas.coordinator import GroupSettings
from deltastream.daemon.replicas.records import GROUP_KEY, GroupRecord
from deltastream.daemon.stream.config import TailConfig
from deltastream.daemon.stream.state import StateStore
from deltastream.errors import ObjectNotFoundError
from deltastream.storage import open_store

__all__ = ["recorded_group"]


async def recorded_group(tail: TailConfig) -> GroupSettings | None:
    """The group stream ``tail``'s state names, or ``None`` (no state, no group, or a group
    whose lease directory is gone)."""
    options = tail.resolved_state_options
    async with open_store(tail.state, options) as store:
        recorded = await StateStore(store).recorded()
    if recorded is None or not recorded.group:
        return None
    async with open_store(recorded.group, options) as store:
        try:
            raw = await store.get(GROUP_KEY)
        except ObjectNotFoundError:
            return None
        group = GroupRecord.from_bytes(store.uri_for(GROUP_KEY), raw)
    return GroupSettings(recorded.group, options, lease_ttl=group.lease_ttl, shards=group.shards)
