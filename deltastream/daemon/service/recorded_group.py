"""The replica group a stream's state names, for the commands that write the stream's
target or state outside the group: ``tail`` (with or without ``--reset``,
``--available-now``) and ``reset``.

A stream run by replicas records the group's lease directory beside its state
(:meth:`~deltastream.daemon.stream.state.StateStore.record_group`, kept by a reset). These
commands have no configuration of the group, so they read that record (and the group's
shard count and lease ttl from its ``group.json``) and take the stream's lease as an
exclusive member before they touch anything: refused, naming the holder (host, pid,
address), while a live replica holds the stream, and holding it against the replicas while
they run. ``tail`` does so through its service (``exclusive``; ``tail --reset`` resets the
stream under that lease, before it runs); ``reset`` through :func:`holding`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import anyio
import anyio.abc

from deltastream.daemon.replicas.coordinator import Coordinator, GroupSettings
from deltastream.daemon.replicas.records import GROUP_KEY, GroupRecord, shard_of
from deltastream.daemon.stream.state import StateStore
from deltastream.errors import DeltaStreamError, ObjectNotFoundError, ResetIncompleteError
from deltastream.storage import open_store

__all__ = ["holding", "recorded_group"]

T = TypeVar("T")


async def recorded_group(state: str, options: Mapping[str, str]) -> GroupSettings | None:
    """The group the stream state at ``state`` names, or ``None`` (no state, no group, or a
    group whose lease directory is gone: no replica can hold the stream)."""
    async with open_store(state, dict(options)) as store:
        uri = await StateStore(store).recorded_group()
    if not uri:
        return None
    async with open_store(uri, dict(options)) as store:
        try:
            raw = await store.get(GROUP_KEY)
        except ObjectNotFoundError:
            return None
        group = GroupRecord.from_bytes(store.uri_for(GROUP_KEY), raw)
    return GroupSettings(uri, options, lease_ttl=group.lease_ttl, shards=group.shards)


class _Holder:
    """The shard host of :func:`holding`: runs no stream; a shard given up (the lease lost:
    the store did not answer in time) cancels what runs under the lease."""

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()

    def start_shard(self, shard: int) -> None:
        pass

    async def stop_shard(self, shard: int, deadline: float) -> None:
        self.scope.cancel()  # (a release as the member leaves, once done: nothing runs)


async def holding(group: GroupSettings, stream: str, body: Callable[[], Awaitable[T]]) -> T:
    """Run ``body`` (a reset of stream ``stream``) holding the stream's lease in ``group``
    as an exclusive member: :class:`~deltastream.errors.StreamHeldError` naming the holder,
    nothing run, while a live replica holds it; a holder that looks gone is waited for (at
    most ``lease_ttl``). If the lease is lost meanwhile (the store stopped answering),
    ``body`` is cancelled and :class:`~deltastream.errors.ResetIncompleteError` says so."""
    host = _Holder()
    shard = shard_of(stream, group.shards)
    async with open_store(group.uri, group.storage_options) as store:
        coordinator = Coordinator(
            store,
            group,
            host,
            role="exclusive",
            needed={shard: stream},
            remedy="nothing was reset. Stop the group's replicas first, or reset it anyway "
            "with --force (that replica starts the stream over at its next commit; what it "
            "delivers until then is delivered again)",
        )
        stopping = anyio.Event()
        result: list[T] = []
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(coordinator.run, stopping, 0.0)
                try:
                    with host.scope:
                        result.append(await body())
                finally:
                    stopping.set()
        except* DeltaStreamError as errors:
            # The coordinator's refusal (or the body's error), as if raised alone.
            raise errors.exceptions[0] from None
        if not result:  # cancelled by the lease's loss
            raise ResetIncompleteError(
                coordinator.uri,
                f"a reset of stream {stream!r} lost the stream's lease in the group at "
                f"{coordinator.uri} (its store did not answer in time) and was cut short; "
                "run it again to finish it",
            )
        return result[0]
