"""Whether another member of a group is alive, judged by this process's own clock.

No wall clock is compared across hosts (they may disagree by minutes). A member proves it is
alive by rewriting its ``member-`` object every ttl/5, which changes the object's tag. An
observer notes when it first saw each tag (on its monotonic clock, at the moment the
listing that showed it came back); a member whose tag it has seen unchanged for a whole
``lease_ttl`` renewed nothing in that time, and a member stops its streams by 0.8 ttl after
the last renewal it sent that succeeded (:mod:`~deltastream.daemon.replicas.coordinator`),
so it runs none of them any more. This is the observation a lease needs, as in the
DynamoDB lock client's lease by record version.

A process on the same machine can also see at once that a member's process is gone: the
member records its host, boot id, pid and the pid's start time.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from deltastream.daemon.replicas.records import MemberRecord

__all__ = ["Observer", "ProcessIdentity", "process_gone", "this_process"]


@dataclass(frozen=True)
class ProcessIdentity:
    host: str
    pid: int
    boot_id: str
    started: int


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot; None if there is no
    such process (or only its zombie) or it cannot be told (not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count after the last ")".
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields and fields[0] in ("Z", "X"):
        return None  # a zombie (killed, not yet reaped) runs nothing
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def this_process() -> ProcessIdentity:
    pid = os.getpid()
    return ProcessIdentity(socket.gethostname(), pid, _boot_id(), _start_ticks(pid) or 0)


def process_gone(member: MemberRecord, here: ProcessIdentity) -> bool:
    """Whether ``member``'s process certainly no longer runs: it ran on this machine since
    its last boot (same host name and boot id) and its pid is free or now another process
    (a container restarted in its pod reuses pid 1). Anything else is left to observation."""
    if not member.boot_id or member.host != here.host or member.boot_id != here.boot_id:
        return False
    if member.pid == here.pid and member.started == here.started:
        return False  # this process itself
    started = _start_ticks(member.pid)
    if started is None:
        return Path("/proc").is_dir()  # no such process (where /proc tells)
    return member.started != 0 and started != member.started


@dataclass
class Observer:
    """When this process first saw each member's current tag."""

    ttl: float
    _seen: dict[str, tuple[str, float]] = field(default_factory=dict)

    def observe(self, member: str, tag: str, received: float) -> None:
        """A listing that came back at ``received`` (monotonic) showed ``member`` at
        ``tag``."""
        seen = self._seen.get(member)
        if seen is None or seen[0] != tag:
            self._seen[member] = (tag, received)

    def forget_absent(self, present: set[str]) -> None:
        for member in list(self._seen):
            if member not in present:
                del self._seen[member]

    def unchanged_for(self, member: str, now: float) -> float:
        seen = self._seen.get(member)
        return 0.0 if seen is None else now - seen[1]

    def expired(self, member: str, now: float) -> bool:
        """Whether ``member`` renewed nothing for a whole ttl, as this process saw it."""
        seen = self._seen.get(member)
        return seen is not None and now - seen[1] >= self.ttl
