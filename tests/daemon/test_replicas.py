"""Replica groups in one process: the lease records, the sharing rule, liveness by
observation, and coordinators driven step by step on a clock the test moves, against a real
local directory and every object store's emulator (the processes themselves:
test_replica_processes.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from conftest import OBJECT_STORES
from hypothesis import given, settings
from hypothesis import strategies as st

from deltastream.daemon.replicas.assignment import plan, quota, successors
from deltastream.daemon.replicas.coordinator import Coordinator, GroupSettings
from deltastream.daemon.replicas.liveness import (
    Observer,
    ProcessIdentity,
    describe,
    process_gone,
    this_process,
)
from deltastream.daemon.replicas.records import (
    GroupRecord,
    MemberRecord,
    ShardRecord,
    member_key,
    parse_key,
    shard_key,
    shard_of,
)
from deltastream.errors import (
    CorruptFileError,
    InvalidArgumentError,
    StorageError,
    StreamHeldError,
)
from deltastream.storage import open_store
from deltastream.storage.base import ObjectStore

# ---------------------------------------------------------------------- records


def test_records_round_trip_and_refuse_what_they_cannot_read() -> None:
    member = MemberRecord("m1", "replica", "h", 12, "boot", 99, seq=3, leaving=True, http="x:1")
    assert MemberRecord.from_bytes("f", member.to_bytes()) == member
    assert ShardRecord.from_bytes("f", ShardRecord("m1", 4).to_bytes()) == ShardRecord("m1", 4)
    assert GroupRecord.from_bytes("f", GroupRecord(64).to_bytes()) == GroupRecord(64)
    for raw in (b"{", b'{"format": 2, "owner": "a", "generation": 1}', b'{"format": 1}'):
        with pytest.raises(CorruptFileError) as info:
            ShardRecord.from_bytes("/g/shard-0001.json", raw)
        assert info.value.path == "/g/shard-0001.json"
    with pytest.raises(CorruptFileError, match="shard count"):
        GroupRecord.from_bytes("/g/group.json", b'{"format": 1, "shards": 0}')


def test_keys_and_shards() -> None:
    assert parse_key(member_key("abc")) == ("member", "abc")
    assert parse_key(shard_key(7)) == ("shard", 7)
    for foreign in ("group.json", "shard-x.json", "member-.json", ".shard-0001.json.tmp1"):
        assert parse_key(foreign) is None
    # Stable across processes and versions: a fixed hash, not Python's.
    assert shard_of("orders", 64) == shard_of("orders", 64)
    script = (
        "from deltastream.daemon.replicas.records import shard_of; print(shard_of('orders', 64))"
    )
    other = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    )
    assert int(other.stdout) == shard_of("orders", 64)
    counts = [0] * 16
    for i in range(1600):
        counts[shard_of(f"table_{i}", 16)] += 1
    assert min(counts) > 60 and max(counts) < 140


# ---------------------------------------------------------------------- sharing


@given(st.integers(1, 300), st.sets(st.text("abcdef", min_size=1, max_size=4), min_size=1))
def test_quotas_add_up_and_differ_by_at_most_one(shards: int, replicas: set[str]) -> None:
    quotas = [quota(r, replicas, shards) for r in replicas]
    assert sum(quotas) == shards
    assert max(quotas) - min(quotas) <= 1
    assert quota("not-a-member", replicas, shards) == 0


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 40),
    st.lists(st.sampled_from(["join", "leave", "die"]), min_size=1, max_size=12),
    st.randoms(use_true_random=False),
)
def test_shards_converge_to_one_live_holder_each_balanced(
    shards: int, events: list[str], rnd: object
) -> None:
    """Members acting on their own plans in any order, with joins, clean leaves and deaths
    between rounds: after a few rounds each shard has exactly one live holder, and every
    replica holds its quota."""
    import random

    assert isinstance(rnd, random.Random)
    owners: dict[int, str] = {}
    live: list[str] = ["r0"]
    serial = 1

    def settle() -> None:
        for _ in range(6):
            order = live[:]
            rnd.shuffle(order)
            for me in order:
                held = {s for s, o in owners.items() if o == me}
                todo = plan(
                    me,
                    shards=shards,
                    replicas=live,
                    owners=owners,
                    live=live,
                    held=held,
                    shed=True,
                )
                for s in todo.releases:
                    owners[s] = ""
                for s in todo.claims:
                    # A conditional write: only over the owner the plan was made from.
                    owners[s] = me

    for event in events:
        settle()
        if event == "join":
            live.append(f"r{serial}")
            serial += 1
        elif len(live) > 1:
            gone = live.pop(rnd.randrange(len(live)))
            if event == "leave":
                for s, o in owners.items():
                    if o == gone:
                        owners[s] = ""
    settle()
    assert sorted(owners) == list(range(shards))
    assert all(o in live for o in owners.values())
    for me in live:
        assert sum(1 for o in owners.values() if o == me) == quota(me, live, shards)


def test_a_replica_gives_up_shards_only_when_allowed_and_takes_only_free_ones() -> None:
    owners = {0: "a", 1: "a", 2: "a", 3: "b", 4: "dead", 5: ""}
    common = {"shards": 6, "owners": owners, "live": {"a", "b"}}
    # a holds 3 of a quota of 3 (a, b): nothing to do; b holds 1 of 3: takes 4 and 5.
    assert plan("a", replicas={"a", "b"}, held={0, 1, 2}, shed=True, **common).claims == ()
    assert set(plan("b", replicas={"a", "b"}, held={3}, shed=True, **common).claims) == {4, 5}
    # c joins: a (3 of 2) gives one up, but only once shedding is allowed.
    three = {"a", "b", "c"}
    assert plan("a", replicas=three, held={0, 1, 2}, shed=False, **common).releases == ()
    assert len(plan("a", replicas=three, held={0, 1, 2}, shed=True, **common).releases) == 1
    # A shard recorded as its own (handed to it) comes first of those it may take, whatever
    # its preference order says of the others.
    for me in ("b", "c", "e", "f", "g", "h"):
        owners = {0: "a", 1: "a", 2: "a", 7: me}
        todo = plan(
            me, shards=8, replicas={"a", me}, owners=owners, live={"a", me}, held=(), shed=True
        )
        assert len(todo.claims) == 4 and todo.claims[0] == 7, todo


def test_shards_given_up_go_to_the_replicas_below_their_share_or_free() -> None:
    owners = {0: "a", 1: "a", 2: "a", 3: "a", 4: "b", 5: "b"}
    common = {"shards": 6, "owners": owners, "live": {"a", "b", "c"}}
    # c joins a and b: a gives up 2 (of 4, share 2); c lacks 2, b none.
    three = {"a", "b", "c"}
    assert successors("a", [1, 3], replicas=three, eligible={"b", "c"}, **common) == {
        1: "c",
        3: "c",
    }
    # a leaves: b (share 6, holds 2) lacks 4: all four go to it.
    left = successors("a", [0, 1, 2, 3], replicas={"b"}, eligible={"b"}, **common)
    assert left == {0: "b", 1: "b", 2: "b", 3: "b"}
    # Nobody eligible (silent for long, maybe gone): free, for whoever takes them first.
    assert successors("a", [1, 3], replicas=three, eligible=set(), **common) == {1: "", 3: ""}
    # More given up than anyone lacks: the rest free.
    assert successors("a", [0, 1, 2], replicas={"a", "b"}, eligible={"b"}, **common) == {
        0: "b",
        2: "",
        1: "",
    }
    # Two newcomers (c, d: a share of 2 each of 8) lacking at once: each gets its turn, so
    # a and b giving up theirs from the same listing fill both.
    four = {"a", "b", "c", "d"}
    split = dict.fromkeys(range(4), "a") | dict.fromkeys(range(4, 8), "b")
    assert successors(
        "a", [0, 1], shards=8, replicas=four, owners=split, live=four, eligible=four
    ) == {0: "c", 1: "d"}
    # A shard free, or held by a member gone: who takes it is not known, so all go free.
    for other in ("", "gone"):
        owners_now = {**owners, 5: other}
        given = successors(
            "a", [1, 3], replicas=three, eligible={"b", "c"}, **{**common, "owners": owners_now}
        )
        assert given == {1: "", 3: ""}


# ---------------------------------------------------------------------- liveness


def test_a_member_is_gone_only_after_a_whole_ttl_without_a_new_tag() -> None:
    observer = Observer(ttl=10)
    observer.observe("m", "t1", received=100)
    assert not observer.expired("m", 109.9)
    observer.observe("m", "t2", received=105)  # renewed: the wait starts over
    assert not observer.expired("m", 114.9)
    observer.observe("m", "t2", received=112)  # the same tag again changes nothing
    assert observer.expired("m", 115)
    observer.forget_absent(set())
    assert not observer.expired("m", 1000)


def test_a_process_gone_from_this_machine_is_seen_at_once() -> None:
    here = this_process()
    me = MemberRecord(
        "m", "replica", here.host, here.pid, here.boot_id, here.started, pid_ns=here.pid_ns
    )
    assert here.pid_ns != 0
    assert not process_gone(me, here)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = replace(me, pid=child.pid, started=1)
    assert process_gone(dead, here)
    # Its pid reused by another process: started differs.
    assert process_gone(replace(me, started=here.started + 1), here)
    # Another machine, or one rebooted since: left to observation.
    assert not process_gone(replace(dead, host="elsewhere"), here)
    assert not process_gone(replace(dead, boot_id="other-boot"), here)
    # Another pid namespace on this machine (a container with the host's name), or one not
    # recorded (a record of an older version): its pid means nothing here.
    assert not process_gone(replace(dead, pid_ns=here.pid_ns + 1), here)
    assert not process_gone(replace(dead, pid_ns=0), here)


def test_a_process_in_a_pid_namespace_of_its_own_is_never_judged_by_its_pid() -> None:
    """Both ways: a process that is pid 1 in a namespace of its own records that namespace,
    and neither it nor this process takes the other's pid for its own."""
    here = this_process()
    script = (
        "import dataclasses, json; from deltastream.daemon.replicas.liveness import this_process; "
        "print(json.dumps(dataclasses.asdict(this_process())))"
    )
    inside = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
    )
    there = ProcessIdentity(**json.loads(inside.stdout))
    assert there.pid == 1 and there.pid_ns not in (0, here.pid_ns)
    assert (there.host, there.boot_id) == (here.host, here.boot_id)
    theirs = MemberRecord(
        "x", "replica", there.host, 1, there.boot_id, there.started, pid_ns=there.pid_ns
    )
    ours = MemberRecord(
        "y", "replica", here.host, here.pid, here.boot_id, here.started, pid_ns=here.pid_ns
    )
    assert not process_gone(theirs, here)  # pid 1 here is another process
    assert not process_gone(ours, there)  # this pid is free (or another process) there
    # The same record read back from its JSON, and an older one without the namespace.
    assert MemberRecord.from_bytes("m", theirs.to_bytes()) == theirs
    old = json.loads(theirs.to_bytes())
    del old["pid_ns"]
    assert MemberRecord.from_bytes("m", json.dumps(old).encode()).pid_ns == 0


def test_a_member_is_described_with_its_pid_where_this_process_sees_it() -> None:
    """On one line: role, id, host, pid, address; a pid this process cannot see (another pid
    namespace, another machine, or a namespace not recorded) is said to be so, since a
    containerised replica's pid 1 next to the host's name would name the host's init."""
    here = this_process()
    ours = MemberRecord(
        "m", "replica", here.host, here.pid, here.boot_id, here.started, pid_ns=here.pid_ns
    )
    address = ", 127.0.0.1:9464"
    assert describe(replace(ours, http="127.0.0.1:9464"), here) == (
        f"replica m ({here.host} pid {here.pid}{address})"
    )
    container = replace(ours, pid=1, pid_ns=here.pid_ns + 1)
    assert describe(container, here) == f"replica m ({here.host} pid 1 in another pid namespace)"
    elsewhere = replace(ours, host="node-2", boot_id="other", role="run-once")
    assert describe(elsewhere, here) == (
        f"run-once m (node-2 pid {here.pid} in another pid namespace)"
    )
    older = replace(ours, pid_ns=0)
    assert describe(older, here) == (
        f"replica m ({here.host} pid {here.pid} in a pid namespace unknown here)"
    )
    assert describe(ours, replace(here, pid_ns=0)).endswith("in a pid namespace unknown here)")


# ---------------------------------------------------------------------- coordinators


@dataclass
class Host:
    """Records which shards a coordinator runs (start and stop are instant)."""

    running: set[int] = field(default_factory=set)
    starts: int = 0

    def start_shard(self, shard: int) -> None:
        assert shard not in self.running
        self.running.add(shard)
        self.starts += 1

    async def stop_shard(self, shard: int, deadline: float) -> None:
        self.running.discard(shard)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Flaky(ObjectStore):
    """A store that can be cut off: every request fails while ``cut`` is set."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__()
        self.inner = inner
        #: Cut off: ``True`` (refused, a StorageError) or ``"timeout"`` (a bare TimeoutError).
        self.cut: bool | str = False
        #: Keys whose writes fail (a local writer frozen inside its write holds their lock).
        self.stuck: set[str] = set()
        #: The keys written, in order.
        self.puts: list[str] = []

    @property
    def root_uri(self) -> str:
        return self.inner.root_uri

    def _check(self) -> None:
        if self.cut == "timeout":
            raise TimeoutError
        if self.cut:
            raise StorageError(self.root_uri, "connection refused (cut off by the test)")

    async def list_from(self, directory: str, start_after: str | None = None):  # type: ignore[no-untyped-def, override]
        self._check()
        async for meta in self.inner.list_from(directory, start_after):
            yield meta

    async def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        self._check()
        return await self.inner.get(key, byte_range)

    async def get_tagged(self, key: str) -> tuple[bytes, str]:
        self._check()
        return await self.inner.get_tagged(key)

    async def head(self, key: str):  # type: ignore[no-untyped-def]
        self._check()
        return await self.inner.head(key)

    async def put(self, key: str, data: bytes, *, if_match: str | None = None) -> str:
        self._check()
        if key in self.stuck:
            raise StorageError(self.uri_for(key), "another writer held its lock for 2s")
        self.puts.append(key)
        return await self.inner.put(key, data, if_match=if_match)

    async def delete(self, key: str) -> None:
        self._check()
        await self.inner.delete(key)


SETTINGS = GroupSettings("unused", lease_ttl=10, shards=12, rebalance_delay=5)


@dataclass
class Member:
    coordinator: Coordinator
    host: Host
    store: Flaky


@pytest.fixture(params=["local", *OBJECT_STORES])
def group_uri(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """The lease directory on each store: its conditional writes (atomic create and rename
    locally; S3's If-None-Match and If-Match; Azure's and GCS's preconditions) are the
    leases."""
    if request.param == "local":
        return str(tmp_path / "group"), {}
    bucket = request.getfixturevalue(OBJECT_STORES[request.param])
    return bucket.uri("group"), bucket.storage_options


@pytest.fixture
async def group(
    group_uri: tuple[str, dict[str, str]],
) -> AsyncIterator[Callable[..., Member]]:
    uri, options = group_uri
    clock = Clock()
    stores: list[ObjectStore] = []
    async with anyio.create_task_group() as tg:

        def member(role: str = "replica", needed: dict[int, str] | None = None) -> Member:
            inner = open_store(uri, options)
            stores.append(inner)
            store = Flaky(inner)
            host = Host()
            coordinator = Coordinator(
                store,
                replace(SETTINGS, uri=uri),
                host,
                role=role,  # type: ignore[arg-type]
                needed=needed,
                clock=clock,
            )
            coordinator.bind(tg)
            return Member(coordinator, host, store)

        member.clock = clock  # type: ignore[attr-defined]
        yield member
        tg.cancel_scope.cancel()
    for store in stores:
        await store.aclose()


async def steps(*members: Member, clock: Clock, seconds: float = 0.0, rounds: int = 3) -> None:
    """Each member steps ``rounds`` times, the clock moving ``seconds`` before each round;
    after every step no shard runs on two members."""
    for _ in range(rounds):
        clock.now += seconds
        for m in members:
            m.coordinator.check_lapse()
            if not m.store.cut:
                await m.coordinator.step()
            await anyio.lowlevel.checkpoint()  # the stops the step started
            running = [s for other in members for s in other.host.running]
            assert len(running) == len(set(running)), running


@pytest.mark.anyio
async def test_replicas_share_rebalance_and_hand_over(group: Callable[..., Member]) -> None:
    clock: Clock = group.clock  # type: ignore[attr-defined]
    a = group()
    await a.coordinator.join()
    await steps(a, clock=clock)
    assert a.host.running == set(range(12))
    b = group()
    await b.coordinator.join()
    # b takes nothing held; a gives up half only after the rebalance delay.
    await steps(a, b, clock=clock, seconds=1)
    assert len(a.host.running) == 12 and not b.host.running
    await steps(a, b, clock=clock, seconds=1, rounds=6)
    assert {len(a.host.running), len(b.host.running)} == {6}
    # a leaves cleanly, recording its shards as b's: b runs everything at its next step,
    # without writing a shard record.
    await a.coordinator.leave(grace=0)
    b.store.puts.clear()
    await steps(b, clock=clock, rounds=1)
    assert b.host.running == set(range(12)) and not a.host.running
    assert not [key for key in b.store.puts if key.startswith("shard-")], b.store.puts


@pytest.mark.anyio
async def test_a_newcomer_gets_its_share_rebalance_delay_after_the_listing_before_it(
    group: Callable[..., Member],
) -> None:
    """The member giving shards up counts the rebalance delay from its listing before the
    one that first showed the newcomer (the arrival came after it), lists again the moment
    the delay ends and records the shards as the newcomer's, which runs them at its next
    listing without a write; the newcomer lists every 0.1 s from a poll interval before the
    delay ends (its own count) until two after, and at the poll interval otherwise."""
    clock: Clock = group.clock  # type: ignore[attr-defined]
    poll, delay = SETTINGS.poll_interval, SETTINGS.rebalance_delay
    a = group()
    await a.coordinator.join()
    await steps(a, clock=clock, rounds=1)
    listed = clock.now  # a's last listing that did not show b
    assert len(a.host.running) == 12 and a.coordinator.poll_delay() == poll
    clock.now += 0.4
    b = group()
    await b.coordinator.join()
    await steps(b, clock=clock, rounds=1)
    arrived = clock.now  # b's own first listing
    assert not b.host.running and b.coordinator.poll_delay() == poll
    clock.now = listed + poll
    await steps(a, clock=clock, rounds=1)  # a sees b
    due = listed + delay
    assert a.coordinator.poll_delay() == poll
    for at in (arrived + 2, due - 2):  # both renew on time
        clock.now = at
        await steps(b, a, clock=clock, rounds=1)
    clock.now = arrived + delay - poll - 0.01
    assert b.coordinator.poll_delay() == poll
    clock.now = arrived + delay - poll
    assert b.coordinator.poll_delay() == 0.1
    await steps(b, clock=clock, rounds=1)
    clock.now = due - 0.3
    assert a.coordinator.poll_delay() == pytest.approx(0.3)  # woken as the delay ends
    await steps(a, clock=clock, rounds=1)
    assert len(a.host.running) == 12
    clock.now = due
    await steps(a, clock=clock, rounds=1)
    assert len(a.host.running) == 6
    with anyio.fail_after(10):  # its six release writes (in the background) landed
        while a.coordinator.stats.released < 6:  # noqa: ASYNC110 (no event to wait on)
            await anyio.sleep(0.01)
    # b lists fast until two poll intervals after the delay (its own count), then slowly.
    clock.now = arrived + delay + 2 * poll - 0.01
    assert b.coordinator.poll_delay() == 0.1
    clock.now = arrived + delay + 2 * poll
    assert b.coordinator.poll_delay() == poll
    # The six records name b already: it runs them without writing one.
    b.store.puts.clear()
    await steps(b, clock=clock, rounds=1)
    assert len(b.host.running) == 6
    assert not [key for key in b.store.puts if key.startswith("shard-")], b.store.puts
    # Balanced: both at the poll interval.
    await steps(a, b, clock=clock, rounds=1)
    assert a.coordinator.poll_delay() == b.coordinator.poll_delay() == poll


@pytest.mark.anyio
async def test_a_dead_member_is_replaced_after_a_ttl_and_a_thawed_one_gives_up(
    group: Callable[..., Member],
) -> None:
    clock: Clock = group.clock  # type: ignore[attr-defined]
    a, b = group(), group()
    await a.coordinator.join()
    await b.coordinator.join()
    await steps(a, b, clock=clock, seconds=1, rounds=8)
    assert len(a.host.running) == 6
    # a freezes: b sees its heartbeat unchanged, and waits a whole ttl before taking.
    await steps(b, clock=clock, seconds=1, rounds=9)
    assert len(b.host.running) == 6
    await steps(b, clock=clock, seconds=1, rounds=2)
    assert b.host.running == set(range(12))
    # a thaws: its lease lapsed long ago, so it runs nothing any more (even before it
    # lists), and what it then sees held by b it leaves alone.
    assert not a.coordinator.check_lapse()
    await anyio.lowlevel.checkpoint()
    assert not a.host.running
    await steps(a, b, clock=clock, seconds=1, rounds=3)
    assert b.host.running == set(range(12))
    assert a.coordinator.stats.lost == 6 and a.coordinator.stats.lapses == 1


@pytest.mark.anyio
async def test_a_member_cut_off_from_the_store_stops_before_anyone_takes_over(
    group: Callable[..., Member], caplog: pytest.LogCaptureFixture
) -> None:
    clock: Clock = group.clock  # type: ignore[attr-defined]
    a, b = group(), group()
    # Cut off by refusals on the object stores, by a bare TimeoutError (no text of its
    # own) on the local one.
    local = "://" not in a.store.root_uri or a.store.root_uri.startswith("file:")
    cut: bool | str = "timeout" if local else True
    why = (
        "TimeoutError"
        if local
        else r"StorageError: \S+: connection refused \(cut off by the test\)"
    )
    await a.coordinator.join()
    await b.coordinator.join()
    await steps(a, b, clock=clock, seconds=1, rounds=8)
    a.store.cut = cut
    last_ok = clock.now
    stopped_at = None
    while len(b.host.running) < 12:
        await steps(a, b, clock=clock, seconds=0.5, rounds=1)
        with contextlib.suppress(StorageError, TimeoutError):
            await a.coordinator.step()  # its renewals fail, once due
        if stopped_at is None and not a.host.running:
            stopped_at = clock.now
            # Not ready from then on, saying why and how long; b (reaching it) is.
            reason, silence = a.coordinator.unreachable() or ("", 0.0)
            assert re.fullmatch(why, reason) and silence >= 0.6 * 10 - 1, (reason, silence)
            assert b.coordinator.unreachable() is None
    took_over_at = clock.now
    assert stopped_at is not None
    # a stopped within 0.6 ttl of its last renewal, b took over a whole ttl after it.
    assert stopped_at - last_ok <= 0.6 * 10 + 3.5
    assert took_over_at - stopped_at >= 3
    # The log names the exception's type (a bare TimeoutError has no text of its own).
    warned = [r.getMessage() for r in caplog.records if "cannot renew its lease" in r.getMessage()]
    assert warned and all(re.search(f"cannot renew its lease: {why}$", w) for w in warned), warned
    assert a.coordinator.unreachable() is not None
    a.store.cut = False
    await steps(a, b, clock=clock, seconds=1, rounds=8)
    assert a.coordinator.unreachable() is None
    assert len(a.host.running) + len(b.host.running) == 12


@pytest.mark.anyio
async def test_a_run_once_member_takes_free_shards_and_is_refused_a_live_ones(
    group: Callable[..., Member],
) -> None:
    clock: Clock = group.clock  # type: ignore[attr-defined]
    job = group("exclusive", {0: "orders", 5: "users"})
    await job.coordinator.join()
    await job.coordinator._take_needed(anyio.Event())
    assert job.host.running == {0, 5}
    await job.coordinator.leave(grace=0)
    assert not job.host.running

    replica = group()
    await replica.coordinator.join()
    await steps(replica, clock=clock)
    refused = group("exclusive", {5: "users"})
    await refused.coordinator.join()

    async def renew_replica() -> None:
        while True:
            clock.now += 1
            await replica.coordinator.step()
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        tg.start_soon(renew_replica)
        with pytest.raises(StreamHeldError) as info:
            await refused.coordinator._take_needed(anyio.Event())
        tg.cancel_scope.cancel()
    assert "stream 'users' is run by replica" in str(info.value)
    assert info.value.uri.endswith("shard-0005.json")
    assert not refused.host.running


@pytest.mark.anyio
async def test_a_refusal_names_a_holder_in_another_pid_namespace_as_such(
    group: Callable[..., Member],
) -> None:
    """The holder's heartbeat as a replica in a container of its own writes it (pid 1, its
    own pid namespace, this host's name): the refusal says the pid is in another pid
    namespace, on one line."""
    here = this_process()
    job = group("exclusive", {5: "users"})
    store = job.store.inner
    holder = MemberRecord(
        "c0ffee", "replica", here.host, 1, here.boot_id, 7, pid_ns=here.pid_ns + 1, http="h:1"
    )
    tag = await store.put(member_key("c0ffee"), holder.to_bytes())
    await store.put(shard_key(5), ShardRecord("c0ffee", 1).to_bytes())
    await job.coordinator.join()

    async def renew_holder() -> None:
        nonlocal holder, tag
        while True:
            await anyio.sleep(0.2)
            holder = replace(holder, seq=holder.seq + 1)
            tag = await store.put(member_key("c0ffee"), holder.to_bytes(), if_match=tag)

    async with anyio.create_task_group() as tg:
        tg.start_soon(renew_holder)
        with pytest.raises(StreamHeldError) as info:
            await job.coordinator._take_needed(anyio.Event())
        tg.cancel_scope.cancel()
    message = str(info.value)
    assert "\n" not in message
    assert (
        f"stream 'users' is run by replica c0ffee ({here.host} pid 1 in another pid "
        "namespace, h:1) of the group at "
    ) in message, message
    assert not job.host.running


@pytest.mark.anyio
async def test_a_group_keeps_its_shard_count(group: Callable[..., Member]) -> None:
    first = group()
    await first.coordinator.join()
    other = group()
    other.coordinator.settings = replace(other.coordinator.settings, shards=8)
    with pytest.raises(InvalidArgumentError, match="created with 12 shards") as info:
        await other.coordinator.join()
    assert "group.json" in str(info.value)


@pytest.mark.anyio
async def test_a_replica_started_while_the_store_is_down_joins_when_it_is_back(
    tmp_path: Path,
) -> None:
    """On the real clock: joining is retried (no crash), then the lone replica takes every
    shard; stopping releases them and removes its heartbeat."""
    store = Flaky(open_store(str(tmp_path / "group")))
    store.cut = True
    host = Host()
    settings = GroupSettings(str(tmp_path / "group"), lease_ttl=1, shards=4)
    coordinator = Coordinator(store, settings, host)
    stopping = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(coordinator.run, stopping, 1.0)
        await anyio.sleep(0.6)
        assert not host.running and not (tmp_path / "group").exists()
        store.cut = False
        with anyio.fail_after(10):
            while host.running != {0, 1, 2, 3}:  # noqa: ASYNC110 (the host has no event)
                await anyio.sleep(0.05)
        stopping.set()
    assert not host.running
    assert coordinator.stats.released == 4
    names = sorted(p.name for p in (tmp_path / "group").iterdir() if p.suffix == ".json")
    assert names == ["group.json", *(shard_key(s) for s in range(4))]
    await store.inner.aclose()


@pytest.mark.anyio
async def test_a_shard_that_cannot_be_written_now_does_not_hold_up_the_others(
    group: Callable[..., Member],
) -> None:
    clock: Clock = group.clock  # type: ignore[attr-defined]
    a = group()
    a.store.stuck.add(shard_key(3))
    await a.coordinator.join()
    await steps(a, clock=clock, rounds=1)
    assert a.host.running == set(range(12)) - {3}
    a.store.stuck.clear()
    await steps(a, clock=clock, rounds=1)
    assert a.host.running == set(range(12))


@pytest.mark.anyio
async def test_a_release_whose_write_failed_is_written_again_not_left_held(
    group: Callable[..., Member],
) -> None:
    """a gives shards up to b, but the store refuses a's writes meanwhile: a stops their
    streams all the same, and its next steps record them free, so b gets its share (a
    record naming a live member that does not run the shard would block it for good)."""
    clock: Clock = group.clock  # type: ignore[attr-defined]
    a, b = group(), group()
    await a.coordinator.join()
    await steps(a, clock=clock, rounds=1)
    await b.coordinator.join()
    await steps(a, b, clock=clock, seconds=1, rounds=1)
    a.store.stuck.update(shard_key(s) for s in range(12))
    # Past the rebalance delay: a releases six shards (their writes fail).
    await steps(a, b, clock=clock, seconds=1, rounds=6)
    assert len(a.host.running) == 6 and not b.host.running
    a.store.stuck.clear()
    await steps(a, b, clock=clock, seconds=1, rounds=3)
    assert len(a.host.running) == 6 and len(b.host.running) == 6
