"""One process's membership of a replica group: its heartbeat, the shards it holds, and
the streams it starts and stops as shards change hands.

The protocol (objects: :mod:`~deltastream.daemon.replicas.records`; liveness:
:mod:`~deltastream.daemon.replicas.liveness`; sharing:
:mod:`~deltastream.daemon.replicas.assignment`):

* **Join**: create ``member-<id>.json`` (a new random id per process).
* **Renew** every ``lease_ttl / 5``: rewrite it, conditional on the tag last written. The
  send time of the last renewal that succeeded bounds everything this process may do:
* **Self-fencing**: ``0.6 ttl`` after that send time without a newer success, the member
  stops its streams at their next delivery boundary and gives up every shard it holds
  (*lapses*); at ``0.8 ttl`` the ones still running are cancelled. Nobody takes a shard
  from a member before seeing its heartbeat unchanged for a whole ttl, which is later than
  that. A member that lapsed holds nothing until it has taken each shard again with a
  conditional write, which a replica that took it meanwhile makes fail.
* **Watch**: every poll interval (at most 1 s; sooner where shards are about to change
  hands: :meth:`Coordinator.poll_delay`), one LIST of the directory gives every
  heartbeat's and shard record's tag; records are read again only when their tag changed,
  up to 16 at once. A held shard whose record changed was lost: its streams are cancelled
  at once.
* **Share**: :func:`~deltastream.daemon.replicas.assignment.plan`, acted on with
  conditional writes (up to 16 at once): a take writes the shard record over the tag read;
  a release (the streams stopped first; each shard's on its own, at once) writes it over
  the tag this member wrote, naming the replica it goes to
  (:func:`~deltastream.daemon.replicas.assignment.successors`: one below its share whose
  heartbeat was renewed within half a ttl), or ``owner=""`` (free) when none lacks it or
  some shard is free or held by a member gone. A replica named so runs the shard at its
  next listing without a write (no one else writes a record naming a live member); one
  that does not want it records it free.
* **Rebalance** (a replica joins): the rebalance delay counts from the listing before the
  one that first showed the change (the change came after it; at most a poll interval
  back), and a member over its share lists again the moment it ends; the newcomer lists
  every 0.1 s from a poll interval before then until two after, so it runs what it is
  handed at once. The newcomer runs its share within about ``rebalance_delay`` after its
  heartbeat plus the moved streams' stop and start: within ``rebalance_delay + 2 s`` on an
  object store, measured in ``tests/benchmarks/bench_replicas.py handover``.
* **Leave** (SIGTERM): the heartbeat says ``leaving`` (the others share out without it, and
  list every 0.1 s from when they see it), the streams stop at their delivery boundaries,
  each shard is handed to a replica below its share (or released) as soon as its streams
  stopped, the heartbeat deleted: that replica runs each shard within about 0.1 s plus a
  round trip of its release, so the streams run again within the poll interval (the
  others' next listing) plus the streams' stop and start: within 2 s on an object store,
  measured in ``tests/benchmarks/bench_replicas.py handover``.

A stream that changes hands is still protected by its epoch: the new holder takes the next
one in the stream's state, so anything a frozen process still tries to commit is fenced.

An *exclusive* member (``tail``, ``--available-now``) takes only the shards of its own
streams, only ones that are free or whose holder is gone, and keeps them until it ends; a
shard a live replica holds is refused (:class:`~deltastream.errors.StreamHeldError`) as soon
as that replica's heartbeat is seen to change, and waited for (at most ``lease_ttl``) while
it does not.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, TypeVar

import anyio
import anyio.abc

from deltastream.daemon.replicas.assignment import plan, quota, successors, surplus
from deltastream.daemon.replicas.liveness import Observer, describe, process_gone, this_process
from deltastream.daemon.replicas.records import (
    GROUP_KEY,
    GroupRecord,
    MemberRecord,
    ShardRecord,
    member_key,
    parse_key,
    shard_key,
)
from deltastream.errors import (
    CorruptFileError,
    DeltaStreamError,
    InvalidArgumentError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
    StreamHeldError,
)
from deltastream.storage.base import ObjectStore

__all__ = ["Coordinator", "GroupSettings", "LeaseStats", "ShardHost"]

log = logging.getLogger(__name__)

R = TypeVar("R")

#: Of a ttl after the send time of the last renewal that succeeded: when a member stops its
#: streams at their next boundary and gives up its shards, and when it cancels the rest.
_LAPSE_AT = 0.6
_CANCEL_AT = 0.8
#: A member takes shards only while this fraction of its ttl has not passed since its last
#: renewal's send time (a take just before a lapse would be given up at once).
_TAKE_BEFORE = 0.5
#: Heartbeats of members gone for this many ttls are deleted (by any replica).
_FORGET_AFTER = 4.0
#: Requests a member has in flight at once when it reads the records a listing showed
#: changed, or takes shards: a hand-over of many shards costs a few round trips, not one
#: per shard, and a store is not flooded.
_AT_ONCE = 16
#: Seconds between listings while another member is leaving (it releases its shards
#: within its stop): its shards are taken as soon as they are released, not up to a poll
#: interval later.
_HANDOVER_POLL = 0.1


@dataclass(frozen=True)
class GroupSettings:
    """Where a group's leases live and how they behave (``[server]`` keys)."""

    uri: str
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)
    lease_ttl: float = 15.0
    shards: int = 64
    rebalance_delay: float = 10.0

    def __post_init__(self) -> None:
        if not self.lease_ttl >= 1.0:
            raise InvalidArgumentError(
                f"lease_ttl must be at least 1 second, not {self.lease_ttl!r}"
            )
        if isinstance(self.shards, bool) or not 1 <= self.shards <= 4096:
            raise InvalidArgumentError(
                f"shards must be a whole number 1..4096, not {self.shards!r}"
            )
        if not self.rebalance_delay >= 0:
            raise InvalidArgumentError(
                f"rebalance_delay must be a number >= 0, not {self.rebalance_delay!r}"
            )

    @property
    def renew_interval(self) -> float:
        """Seconds between heartbeats: two may fail before the lease lapses (at 0.6 ttl)."""
        return self.lease_ttl / 5

    @property
    def poll_interval(self) -> float:
        """Seconds between listings of the lease directory."""
        return min(1.0, self.lease_ttl / 5)

    @property
    def request_timeout(self) -> float:
        """A lease request that has not answered by then is abandoned (and retried)."""
        return max(1.0, self.lease_ttl / 5)


class ShardHost(Protocol):
    """What runs the streams of the shards a member holds (the service)."""

    def start_shard(self, shard: int) -> None:
        """Start the shard's streams (returns at once)."""

    async def stop_shard(self, shard: int, deadline: float) -> None:
        """Stop the shard's streams at their next delivery boundary, cancelling those still
        running at ``deadline`` (monotonic; now or past: at once); return once stopped."""


def _why(error: BaseException) -> str:
    """An exception for a log line: its type, and its text where it has one (a bare
    ``TimeoutError`` has none, and is still always truthy)."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


@dataclass
class LeaseStats:
    """Counters for ``/metrics``."""

    acquired: int = 0
    released: int = 0
    lost: int = 0
    lapses: int = 0
    requests: int = 0


@dataclass(frozen=True)
class MemberView:
    record: MemberRecord
    alive: bool
    unchanged_for: float


Role = Literal["replica", "exclusive"]


class _Waiting(Exception):
    """An exclusive member must wait for a shard (its holder may be gone)."""


class Coordinator:
    """One process's membership of a group (see the module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        settings: GroupSettings,
        host: ShardHost,
        *,
        role: Role = "replica",
        needed: Mapping[int, str] | None = None,
        http: str = "",
        remedy: str = "it was left alone. Stop that process, or let it run the stream",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``needed``: an exclusive member's shards, each with a stream of it (for messages);
        ``remedy``: what its refusal says after naming the holder."""
        self.remedy = remedy
        self.store = store
        self.settings = settings
        self.host = host
        self.role = role
        self.needed = dict(needed or {})
        self.clock = clock
        self.member = uuid.uuid4().hex[:16]
        self.identity = this_process()
        self.stats = LeaseStats()
        #: The shards this member holds and runs, with the tag of the record it wrote.
        self.held: dict[int, str] = {}
        self._releasing: set[int] = set()
        self._record = MemberRecord(
            member=self.member,
            role="replica" if role == "replica" else "run-once",
            host=self.identity.host,
            pid=self.identity.pid,
            boot_id=self.identity.boot_id,
            started=self.identity.started,
            pid_ns=self.identity.pid_ns,
            http=http,
        )
        self._member_tag: str | None = None
        self._renew_lock = anyio.Lock()
        self._last_ok_send: float | None = None
        self._lapsed = True  # nothing held until the first renewal
        self._next_renew = 0.0
        self._observer = Observer(settings.lease_ttl)
        self._cache: dict[str, tuple[str, object]] = {}
        #: From the last listing: members, and each shard's recorded owner and tag.
        self.members: dict[str, MemberView] = {}
        self.owners: dict[int, str] = {}
        self._shard_tags: dict[int, str] = {}
        self._membership: frozenset[str] = frozenset()
        #: When the membership last changed, as far as this member's listings tell (see
        #: :meth:`observe`), and when the last listing that came back was sent.
        self._stable_since = clock()
        self._listed: float | None = None
        self._warned = False
        #: Why the last renewal failed to reach the store (``None``: it did not fail).
        self._store_problem: str | None = None
        #: The lease lapsed for want of a renewal (until one succeeds again).
        self._silent = False
        #: When this member began (its silence counts from here until a first renewal).
        self._began = clock()
        self._tg: anyio.abc.TaskGroup | None = None

    # ------------------------------------------------------------------ properties

    @property
    def uri(self) -> str:
        return self.store.root_uri

    @property
    def valid(self) -> bool:
        """Whether this member may run its shards now."""
        return not self._lapsed

    def quota(self) -> int:
        return quota(self.member, self._replicas(), self.settings.shards)

    def _replicas(self) -> list[str]:
        return [
            m
            for m, view in self.members.items()
            if view.alive and view.record.role == "replica" and not view.record.leaving
        ]

    # ------------------------------------------------------------------ requests

    async def _put(self, key: str, data: bytes, if_match: str | None) -> str:
        self.stats.requests += 1
        with anyio.fail_after(self.settings.request_timeout):
            return await self.store.put(key, data, if_match=if_match)

    async def _get(self, key: str) -> tuple[bytes, str]:
        self.stats.requests += 1
        with anyio.fail_after(self.settings.request_timeout):
            return await self.store.get_tagged(key)

    async def _list(self) -> dict[str, str]:
        self.stats.requests += 1
        with anyio.fail_after(self.settings.request_timeout):
            return {meta.key: meta.tag async for meta in self.store.list_from("")}

    async def _delete(self, key: str) -> None:
        self.stats.requests += 1
        with anyio.fail_after(self.settings.request_timeout):
            await self.store.delete(key)

    # ------------------------------------------------------------------ joining

    async def join(self) -> None:
        """Check the group's shard count (recording it if this is the first member) and
        write this member's heartbeat."""
        group = GroupRecord(self.settings.shards, self.settings.lease_ttl)
        source = self.store.uri_for(GROUP_KEY)
        try:
            raw, _ = await self._get(GROUP_KEY)
        except ObjectNotFoundError:
            try:
                await self._put(GROUP_KEY, group.to_bytes(), "")
            except PreconditionFailedError:
                raw, _ = await self._get(GROUP_KEY)
            else:
                raw = group.to_bytes()
        recorded = GroupRecord.from_bytes(source, raw)
        if recorded.shards != group.shards:
            raise InvalidArgumentError(
                f"{source}: the group was created with {recorded.shards} shards, this "
                f"configuration says {group.shards}; every replica of a group must use the "
                "same [server] shards (to change it, stop every replica and remove the "
                "lease directory)"
            )
        await self._renew()

    async def _renew(self) -> bool:
        """Write the heartbeat (the next ``seq``); whether it succeeded. One at a time: two
        writes over one tag would fail each other's precondition."""
        async with self._renew_lock:
            return await self._renew_now()

    async def _renew_now(self) -> bool:
        sent = self.clock()
        record = replace(self._record, seq=self._record.seq + 1)
        data = record.to_bytes()
        try:
            tag = await self._put(member_key(self.member), data, self._member_tag or "")
        except PreconditionFailedError:
            # Deleted as gone (this process was frozen or cut off for long) or, after a
            # timed-out write that did land, our own newer record: take it back either way
            # (it is ours), having given up every shard first.
            self._lapse("its heartbeat was changed or removed by another member")
            try:
                _, current = await self._get(member_key(self.member))
            except ObjectNotFoundError:
                current = ""
            self._member_tag = current
            return False
        except (DeltaStreamError, TimeoutError, OSError) as e:
            self._store_problem = _why(e)
            self._warn(f"cannot renew its lease: {self._store_problem}")
            return False
        self._store_problem, self._silent = None, False
        self._record, self._member_tag = record, tag
        # Its own record is known: the next listing need not read it back.
        self._cache[member_key(self.member)] = (tag, record)
        received = self.clock()
        if self._last_ok_send is not None and received >= self._last_ok_send + (
            _LAPSE_AT * self.settings.lease_ttl
        ):
            # The answer came after the lapse was due: the shards are given up (they may be
            # taken by now); the renewal only lets this member take shards again.
            self._lapse("its lease renewal answered too late")
        self._last_ok_send = sent
        self._next_renew = sent + self.settings.renew_interval
        if self._lapsed:
            self._lapsed = False
            log.info("replica %s: lease held (group %s)", self.member, self.uri)
        if self._warned:
            self._warned = False
            log.info("replica %s: lease renewed again", self.member)
        return True

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("replica %s: %s", self.member, message, extra={"group": self.uri})

    # ------------------------------------------------------------------ losing

    def _lapse(self, why: str) -> None:
        """Give up every shard at once (their streams stop at their next boundary, and are
        cancelled by 0.8 ttl after the last good renewal)."""
        if not self._lapsed:
            self.stats.lapses += 1
            log.warning(
                "replica %s: %s; stopping its %d shard(s)' streams",
                self.member,
                why,
                len(self.held),
                extra={"group": self.uri},
            )
        self._lapsed = True
        deadline = self._cancel_deadline()
        for shard in list(self.held):
            self._drop(shard, deadline, lost=True)

    def _cancel_deadline(self) -> float:
        if self._last_ok_send is None:
            return self.clock()
        return self._last_ok_send + _CANCEL_AT * self.settings.lease_ttl

    def _drop(self, shard: int, deadline: float, *, lost: bool) -> None:
        """Stop shard ``shard``'s streams (in the background) and forget holding it."""
        self.held.pop(shard, None)
        if lost:
            self.stats.lost += 1
        assert self._tg is not None
        self._tg.start_soon(self.host.stop_shard, shard, deadline)

    def check_lapse(self) -> bool:
        """Lapse if the last good renewal is too old; whether this member holds its lease."""
        ttl = self.settings.lease_ttl
        last = self._last_ok_send
        now = self.clock()
        if last is not None and not self._lapsed and now >= last + _LAPSE_AT * ttl:
            # The silence itself (a process frozen for 12 s says 12 s, not the threshold).
            self._lapse(f"could not renew its lease for {now - last:.1f}s")
            self._silent = True
        return not self._lapsed

    def unreachable(self) -> tuple[str, float] | None:
        """Why this member cannot reach its lease store and for how long (seconds since its
        last renewal was sent, or since it began), once that is long enough for its lease
        to lapse (0.6 ``lease_ttl``); ``None`` while it reaches the store, whether it holds
        shards or stands by."""
        silence = self.clock() - (self._last_ok_send or self._began)
        if self._silent or (
            self._store_problem is not None and silence >= _LAPSE_AT * self.settings.lease_ttl
        ):
            # A renewal that hangs (no timeout yet) lapses the lease without an error.
            return self._store_problem or "its lease renewals get no answer", silence
        return None

    async def watchdog(self) -> None:
        """:meth:`check_lapse` on time even while a request hangs."""
        while True:
            self.check_lapse()
            await anyio.sleep(self.settings.poll_interval / 4)

    def bind(self, tg: anyio.abc.TaskGroup) -> None:
        """Run the streams' stops and the releases in ``tg`` (:meth:`run` binds its own)."""
        self._tg = tg

    # ------------------------------------------------------------------ watching

    async def _read(self, key: str, tag: str, parse: Callable[[str, bytes], R]) -> R | None:
        """The record at ``key`` (tag ``tag`` in the listing), read again only if changed;
        None if it vanished meanwhile."""
        cached = self._cache.get(key)
        if cached is not None and cached[0] == tag:
            return cached[1]  # type: ignore[return-value]
        try:
            raw, current = await self._get(key)
        except ObjectNotFoundError:
            return None
        value = parse(self.store.uri_for(key), raw)
        self._cache[key] = (current, value)
        return value

    async def _read_changed(self, listing: Mapping[str, str]) -> None:
        """Read the records ``listing`` shows changed since last read, up to
        :data:`_AT_ONCE` at a time, into the cache. Whatever fails here is read again (and
        reported) by :meth:`observe`, one at a time as before."""
        limiter = anyio.CapacityLimiter(_AT_ONCE)
        parsers: dict[str, Callable[[str, bytes], object]] = {
            "member": MemberRecord.from_bytes,
            "shard": ShardRecord.from_bytes,
        }

        async def read(key: str, tag: str, parse: Callable[[str, bytes], object]) -> None:
            async with limiter:
                with contextlib.suppress(DeltaStreamError, TimeoutError, OSError):
                    await self._read(key, tag, parse)

        async with anyio.create_task_group() as tg:
            for key, tag in listing.items():
                parsed = parse_key(key)
                cached = self._cache.get(key)
                if parsed is None or (cached is not None and cached[0] == tag):
                    continue
                kind, ident = parsed
                if kind == "member" or (isinstance(ident, int) and ident < self.settings.shards):
                    tg.start_soon(read, key, tag, parsers[kind])

    async def observe(self) -> None:
        """List the directory and bring :attr:`members` and :attr:`owners` up to date."""
        sent = self.clock()
        listing = await self._list()
        received = self.clock()
        await self._read_changed(listing)
        members: dict[str, MemberView] = {}
        owners: dict[int, str] = {}
        tags: dict[int, str] = {}
        for key, tag in listing.items():
            parsed = parse_key(key)
            if parsed is None:
                continue
            kind, ident = parsed
            if kind == "member":
                assert isinstance(ident, str)
                try:
                    record = await self._read(key, tag, MemberRecord.from_bytes)
                except CorruptFileError as e:
                    self._warn(f"ignores an unreadable heartbeat: {e}")
                    continue
                if record is None:
                    continue
                self._observer.observe(ident, tag, received)
                # Judged as of the listing, which is all the evidence there is: reads after it
                # (slow, or many) must not age a heartbeat the listing showed.
                alive = ident == self.member or not (
                    self._observer.expired(ident, received) or process_gone(record, self.identity)
                )
                unchanged = self._observer.unchanged_for(ident, received)
                members[ident] = MemberView(record, alive, unchanged)
            elif isinstance(ident, int) and ident < self.settings.shards:
                shard_record = await self._read(key, tag, ShardRecord.from_bytes)
                if shard_record is not None:
                    owners[ident] = shard_record.owner
                    tags[ident] = tag
        self._observer.forget_absent(set(members))
        for key in list(self._cache):
            if key not in listing:
                del self._cache[key]
        self.members, self.owners, self._shard_tags = members, owners, tags
        membership = frozenset(self._replicas())
        if membership != self._membership:
            # The change came after the previous listing was sent (that one did not show
            # it): the rebalance delay counts from then, so a newcomer gets its share at
            # most rebalance_delay after it arrived, not up to a poll interval later. Never
            # from more than a poll interval back (a listing that failed in between leaves
            # a longer gap): the delay is shortened by at most that.
            since = sent
            if self._listed is not None:
                since = max(self._listed, sent - self.settings.poll_interval)
            self._membership, self._stable_since = membership, since
        self._listed = sent
        # A shard whose record is not the one this member wrote changed hands.
        for shard, mine in list(self.held.items()):
            if shard in self._releasing:
                continue
            if tags.get(shard) != mine:
                log.warning(
                    "replica %s: shard %d was taken by %s; stopping its streams",
                    self.member,
                    shard,
                    self._name(owners.get(shard, "")),
                    extra={"group": self.uri, "shard": shard},
                )
                self._drop(shard, self.clock(), lost=True)

    def _name(self, member: str) -> str:
        """A member named for a log line: described from its heartbeat where the last
        listing showed one (host, pid, address), else its id."""
        view = self.members.get(member)
        if view is not None:
            return describe(view.record, self.identity)
        return f"member {member}" if member else "nobody"

    # ------------------------------------------------------------------ taking, giving up

    def _next_record(self, shard: int, owner: str) -> ShardRecord:
        """Shard ``shard``'s record naming ``owner`` ("": free), one generation on from the
        one last read or written."""
        cached = self._cache.get(shard_key(shard))
        last = cached[1] if cached is not None else None
        generation = last.generation if isinstance(last, ShardRecord) else 0
        return ShardRecord(owner, generation + 1)

    async def _take(self, shard: int, *, start: bool = True) -> bool:
        """Write shard ``shard``'s record naming this member over the tag last listed. A
        record that names this member already is held as listed, without a write: it was
        written by this member (a take whose answer was lost) or handed over by the member
        that held it, which stopped its streams first and holds it no more; and no member
        takes a shard recorded as a live member's."""
        owner = self.owners.get(shard, "")
        tag = self._shard_tags.get(shard, "")
        cached = self._cache.get(shard_key(shard))
        if owner == self.member and tag and cached is not None and cached[0] == tag:
            if self._lapsed:
                return False
            self.held[shard] = tag
            self.stats.acquired += 1
            log.info(
                "replica %s: took shard %d (handed over)",
                self.member,
                shard,
                extra={"group": self.uri, "shard": shard},
            )
            if start:
                self.host.start_shard(shard)
            return True
        record = self._next_record(shard, self.member)
        try:
            new_tag = await self._put(shard_key(shard), record.to_bytes(), tag)
        except PreconditionFailedError:
            return False  # another member was quicker
        if self._lapsed:
            # Lapsed while the write was in flight: what it took must be given up again.
            self.held[shard] = new_tag
            self._drop(shard, self.clock(), lost=True)
            return False
        self.held[shard] = new_tag
        self._cache[shard_key(shard)] = (new_tag, record)
        self.stats.acquired += 1
        was = f"from {self._name(owner)} (gone)" if owner and owner != self.member else "(free)"
        log.info(
            "replica %s: took shard %d %s",
            self.member,
            shard,
            was,
            extra={"group": self.uri, "shard": shard},
        )
        if start:
            self.host.start_shard(shard)
        return True

    async def _release(self, shard: int, deadline: float, to: str = "") -> None:
        """Stop shard ``shard``'s streams, then record it as ``to``'s (a live replica below
        its share: it runs it at its next listing, without a write) or free (``""``), over
        this member's tag."""
        self._releasing.add(shard)
        try:
            await self.host.stop_shard(shard, deadline)
            tag = self.held.pop(shard, None)
            if tag is None:
                return  # lost meanwhile
            record = self._next_record(shard, to)
            try:
                new_tag = await self._put(shard_key(shard), record.to_bytes(), tag)
            except PreconditionFailedError:
                return
            self._cache[shard_key(shard)] = (new_tag, record)
            self.stats.released += 1
            log.info(
                "replica %s: released shard %d%s",
                self.member,
                shard,
                f" to {self._name(to)}" if to else "",
                extra={"group": self.uri, "shard": shard},
            )
        finally:
            self._releasing.discard(shard)

    async def _free_stale_records(self, claims: tuple[int, ...]) -> None:
        """Record as free the shards whose record names this member although it does not
        run them (a release whose write failed, a take whose answer was lost, shards given
        up in a lapse) and that it is not taking back now: the others would wait on them
        for as long as this member lives."""
        for shard, owner in sorted(self.owners.items()):
            if owner != self.member or shard in self.held or shard in self._releasing:
                continue
            if shard in claims:
                continue
            record = self._next_record(shard, "")
            try:
                tag = await self._put(shard_key(shard), record.to_bytes(), self._shard_tags[shard])
            except PreconditionFailedError:
                continue  # changed meanwhile: whoever wrote it decides
            except (StorageError, TimeoutError) as e:
                self._warn(f"cannot free shard {shard} now: {_why(e)}")
                continue
            self._cache[shard_key(shard)] = (tag, record)
            self.owners[shard] = ""
            log.info(
                "replica %s: freed shard %d (recorded as its own, not run here)",
                self.member,
                shard,
                extra={"group": self.uri, "shard": shard},
            )

    async def _forget_gone(self) -> None:
        """Delete the heartbeats of members gone for long (each restart leaves one)."""
        limit = _FORGET_AFTER * self.settings.lease_ttl
        for member, view in self.members.items():
            if not view.alive and member != self.member and view.unchanged_for >= limit:
                await self._delete(member_key(member))

    async def heartbeat(self) -> None:
        """Renew on time, whatever the listings and takes are doing (:meth:`run` runs this
        beside them: a slow LIST must not delay a renewal into a lapse)."""
        while True:
            if self.clock() >= self._next_renew:
                await self._renew()
            delay = self._next_renew - self.clock()
            await anyio.sleep(max(0.0, min(delay, self.settings.poll_interval)))

    async def step(self, *, renew: bool = True) -> None:
        """One round: renew when due (unless :meth:`heartbeat` does), list, then take or
        give up shards."""
        if renew and self.clock() >= self._next_renew:
            await self._renew()
        await self.observe()
        if self._lapsed or self._last_ok_send is None:
            return
        if self.clock() >= self._last_ok_send + _TAKE_BEFORE * self.settings.lease_ttl:
            return
        if self.role == "exclusive":
            return
        shed = self.clock() - self._stable_since >= self.settings.rebalance_delay
        live = {m for m, v in self.members.items() if v.alive}
        todo = plan(
            self.member,
            shards=self.settings.shards,
            replicas=self._replicas(),
            owners=self.owners,
            live=live,
            held=set(self.held) - self._releasing,
            shed=shed and not self._releasing,
        )
        limiter = anyio.CapacityLimiter(_AT_ONCE)

        async def take(shard: int) -> None:
            async with limiter:
                try:
                    await self._take(shard)
                except (DeltaStreamError, TimeoutError, OSError) as e:
                    # One shard's record may be unwritable for now (a local writer frozen
                    # inside its write holds the file's lock): the others are taken meanwhile.
                    self._warn(f"cannot take shard {shard} now: {_why(e)}")

        async with anyio.create_task_group() as tg:
            for shard in todo.claims:
                tg.start_soon(take, shard)
        await self._free_stale_records(todo.claims)
        heirs = self._successors(todo.releases, self._replicas())
        for shard in todo.releases:
            assert self._tg is not None
            self._tg.start_soon(
                self._release_quietly, shard, self.clock() + self.settings.lease_ttl, heirs[shard]
            )
        await self._forget_gone()

    # ------------------------------------------------------------------ running

    async def run(
        self,
        stopping: anyio.Event,
        grace: float,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Be a member until ``stopping`` is set, then leave (streams get ``grace`` seconds
        to reach a delivery boundary)."""
        async with anyio.create_task_group() as tg:
            self.bind(tg)
            # A store that does not answer yet is waited for (a replica starting while the
            # store is down joins when it is back); a wrong group is an error at once.
            while not stopping.is_set():
                try:
                    await self.join()
                    break
                except (StorageError, TimeoutError) as e:
                    self._store_problem = _why(e)
                    self._warn(f"cannot join the group yet: {self._store_problem}")
                    with anyio.move_on_after(self.settings.poll_interval):
                        await stopping.wait()
            else:
                tg.cancel_scope.cancel()
                return
            tg.start_soon(self.watchdog)
            tg.start_soon(self.heartbeat)
            if self.role == "exclusive":
                await self._take_needed(stopping)
            task_status.started()
            while not stopping.is_set():
                try:
                    await self.step(renew=False)
                except (DeltaStreamError, TimeoutError, OSError) as e:
                    self._warn(f"cannot read the group's leases: {_why(e)}")
                with anyio.move_on_after(self.poll_delay()):
                    await stopping.wait()
            with anyio.CancelScope(shield=True):
                await self.leave(grace)
            tg.cancel_scope.cancel()

    def poll_delay(self) -> float:
        """Seconds until the next listing: the poll interval, but sooner where shards are
        about to change hands (a replica only; :data:`_HANDOVER_POLL` at the fastest):

        * every :data:`_HANDOVER_POLL` while another member that is alive says it is
          leaving: it releases its shards within its stop, and they are taken at once (a
          member that dies while leaving stops counting after ``lease_ttl``);
        * holding more than its share: at the moment the rebalance delay ends, when it gives
          the excess up, not at the next poll after;
        * holding less than its share while another replica holds more: every
          :data:`_HANDOVER_POLL` from a poll interval before the rebalance delay ends (the
          others count it from their listing before the one that showed the change, up to
          a poll interval before this member's) until two poll intervals after (their
          streams' stops), so a released shard is taken at once. That is at most
          ``3 * poll_interval / _HANDOVER_POLL`` listings (30 at the defaults, against 3)
          for each change of membership, and none while the group is balanced.
        """
        poll = self.settings.poll_interval
        if self.role != "replica":
            return poll
        fast = min(_HANDOVER_POLL, poll)
        if any(
            view.alive and view.record.leaving and member != self.member
            for member, view in self.members.items()
        ):
            return fast
        if self._lapsed:
            return poll
        now = self.clock()
        due = self._stable_since + self.settings.rebalance_delay
        held, share = len(self.held), self.quota()
        if held > share and now < due:
            return max(0.0, min(poll, due - now))
        if held < share and due - poll <= now < due + 2 * poll and self._others_over_share():
            return fast
        return poll

    def _others_over_share(self) -> bool:
        """Whether another live replica holds more shards than its share (per the records
        of the last listing): it is to give some up."""
        over = surplus(self._replicas(), self.owners, self.settings.shards)
        return any(count > 0 for r, count in over.items() if r != self.member)

    async def leave(self, grace: float) -> None:
        """Stop every held shard's streams (``grace`` seconds to reach a boundary), release
        the shards, delete the heartbeat. Bounded: a store that does not answer leaves the
        shards to expire."""
        deadline = self.clock() + grace
        self._record = replace(self._record, leaving=True)
        if self.held:
            await self._renew()  # best effort: a failure only leaves the shards to expire
        leaving = [shard for shard in self.held if shard not in self._releasing]
        # The others without this member: the shards go to those below their share then.
        others = [r for r in self._replicas() if r != self.member]
        heirs = self._successors(leaving, others)
        async with anyio.create_task_group() as tg:
            for shard in leaving:
                tg.start_soon(self._release_quietly, shard, deadline, heirs[shard])
        # Shards still being released by a rebalance are waited for too.
        with anyio.move_on_after(grace + self.settings.request_timeout):
            while self._releasing:  # noqa: ASYNC110 (a few polls while stopping)
                await anyio.sleep(0.05)
        try:
            await self._delete(member_key(self.member))
        except (DeltaStreamError, TimeoutError, OSError) as e:
            log.warning("replica %s: could not remove its heartbeat: %s", self.member, e)

    def _successors(self, releases: Collection[int], replicas: list[str]) -> dict[int, str]:
        """Whom each shard given up goes to (:func:`successors`; ``replicas``: the live
        ones of the last listing that share the shards). Only to a replica whose heartbeat
        the last listing showed renewed within half a ttl: one silent for longer may be
        gone, and a shard handed to it would wait for its expiry, while one given up free
        is taken by any replica at once."""
        fresh = [
            r
            for r in replicas
            if self.members[r].unchanged_for < _TAKE_BEFORE * self.settings.lease_ttl
        ]
        return successors(
            self.member,
            releases,
            shards=self.settings.shards,
            replicas=replicas,
            owners=self.owners,
            live={m for m, view in self.members.items() if view.alive},
            eligible=fresh,
        )

    async def _release_quietly(self, shard: int, deadline: float, to: str = "") -> None:
        try:
            await self._release(shard, deadline, to)
        except (DeltaStreamError, TimeoutError, OSError) as e:
            log.warning(
                "replica %s: could not release shard %d (it expires after lease_ttl): %s",
                self.member,
                shard,
                e,
            )

    async def _take_needed(self, stopping: anyio.Event) -> None:
        """An exclusive member: take every needed shard, or refuse (StreamHeldError) as soon
        as one's holder is seen alive (its heartbeat changed); a holder that looks gone is
        waited for at most ``lease_ttl``."""
        seen_seq: dict[str, int] = {}
        while not stopping.is_set():
            try:
                await self._take_needed_step(seen_seq)
                return
            except (StorageError, TimeoutError) as e:
                self._warn(f"cannot read the group's leases: {_why(e)}")
            except _Waiting:
                pass
            await anyio.sleep(self.settings.poll_interval)

    async def _take_needed_step(self, seen_seq: dict[str, int]) -> None:
        """One attempt of :meth:`_take_needed`: returns once every needed shard is held,
        raises :class:`_Waiting` to be called again."""
        if self._lapsed:
            await self._renew()  # (the heartbeat renews on time otherwise)
        await self.observe()
        if self._lapsed:
            raise _Waiting
        waiting = False
        for shard, stream in sorted(self.needed.items()):
            if shard in self.held:
                continue
            owner = self.owners.get(shard, "")
            view = self.members.get(owner)
            if owner and owner != self.member and view is not None and view.alive:
                # Alive as far as seen: refused once its heartbeat is seen to move.
                if view.record.seq != seen_seq.setdefault(owner, view.record.seq):
                    with anyio.CancelScope(shield=True):
                        await self.leave(0)  # gives back what it took (nothing ran)
                    raise StreamHeldError(
                        self.store.uri_for(shard_key(shard)),
                        f"stream {stream!r} is run by {self._name(owner)} of the group at "
                        f"{self.uri}; {self.remedy}",
                    )
                waiting = True
                continue
            if not await self._take(shard, start=False):
                waiting = True
        if waiting:
            raise _Waiting
        for shard in sorted(self.held):
            self.host.start_shard(shard)
