"""How a replica group shares its shards: each replica's quota, and which shards it takes
or gives up. Pure: the coordinator feeds it what it saw.

Quotas: the live replicas (members not leaving, sorted by id) each get ``shards // n``, and
the first ``shards % n`` of them one more, so every replica is within one shard of its share
and the quotas add up to the shard count. A replica below its quota takes free shards (never
held, released, or held by a member gone); one above it gives up the excess, but only once
the group's membership has been stable for the rebalance delay (a replica restarting, or
several joining one after another, moves shards once, not at each step). Of the shards it
may take or give up, each replica prefers its own order (rendezvous hashing of its id and
the shard): replicas racing for free shards mostly reach for different ones, and which
shards a replica keeps does not depend on the order things happened in. A replica giving
shards up names who gets each (:func:`successors`): the replicas below their share, each up
to what it lacks, so they run them without a write of their own.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass

__all__ = ["Plan", "plan", "quota", "successors", "surplus"]


def quota(me: str, replicas: Collection[str], shards: int) -> int:
    """How many shards replica ``me`` should hold among ``replicas`` (which include it)."""
    ordered = sorted(replicas)
    if me not in ordered:
        return 0
    base, extra = divmod(shards, len(ordered))
    return base + (1 if ordered.index(me) < extra else 0)


def surplus(replicas: Collection[str], owners: Mapping[int, str], shards: int) -> dict[str, int]:
    """How many shards each of ``replicas`` holds over its share as ``owners`` records them
    (negative: how many it lacks)."""
    held = Counter(owners.values())
    return {r: held[r] - quota(r, replicas, shards) for r in replicas}


def _preference(me: str, shard: int) -> bytes:
    return hashlib.sha256(f"{me}/{shard}".encode()).digest()


@dataclass(frozen=True)
class Plan:
    claims: tuple[int, ...] = ()
    releases: tuple[int, ...] = ()


def plan(
    me: str,
    *,
    shards: int,
    replicas: Collection[str],
    owners: Mapping[int, str],
    live: Collection[str],
    held: Collection[int],
    shed: bool,
) -> Plan:
    """What replica ``me`` does now. ``owners``: the recorded owner of each shard (missing or
    ``""``: free); ``live``: the members alive (any role, leaving ones too: they still hold
    what they hold); ``held``: the shards ``me`` holds and runs; ``shed``: whether giving up
    excess shards is allowed (membership stable for the rebalance delay)."""
    target = quota(me, replicas, shards)
    held_set = set(held)
    if len(held_set) < target:
        free = [
            s
            for s in range(shards)
            if s not in held_set and (owners.get(s, "") in ("", me) or owners[s] not in live)
        ]
        # Those recorded as its own first (handed to it: run without a write).
        free.sort(key=lambda s: (owners.get(s, "") == me, _preference(me, s)), reverse=True)
        return Plan(claims=tuple(free[: target - len(held_set)]))
    if len(held_set) > target and shed:
        keep_order = sorted(held_set, key=lambda s: _preference(me, s))
        return Plan(releases=tuple(keep_order[: len(held_set) - target]))
    return Plan()


def successors(
    me: str,
    releases: Collection[int],
    *,
    shards: int,
    replicas: Collection[str],
    owners: Mapping[int, str],
    live: Collection[str],
    eligible: Collection[str],
) -> dict[int, str]:
    """Whom each of the shards ``me`` gives up goes to: the other ``replicas`` (``me``
    among them while it stays; not while it leaves) that are ``eligible`` and below their
    share as ``owners`` records it, in turn, each up to what it lacks; ``""`` (free, for
    whoever takes it first) for the shards none of them lacks. All free while any shard is
    free or held by a member not ``live``: whoever takes those is not known, so what each
    replica lacks is not either (a replica handed its lack that takes a free shard too
    would hold one over its share, and move it again)."""
    if any(owners.get(s, "") not in live for s in range(shards)):
        return dict.fromkeys(releases, "")
    over = surplus(replicas, owners, shards)
    lacking = {r: -over[r] for r in sorted(replicas) if r != me and r in eligible}
    out = dict.fromkeys(releases, "")
    # One at a time to each replica that still lacks some, in turn: members that give
    # shards up at once, from the same listing, fill two newcomers evenly, not the first
    # twice over (which would give the excess up again).
    for turn, shard in enumerate(sorted(releases)):
        waiting = [r for r, count in lacking.items() if count > 0]
        if not waiting:
            break
        heir = waiting[turn % len(waiting)]
        out[shard] = heir
        lacking[heir] -= 1
    return out
