"""Whether another member of a group is alive, judged by this process's own clock.

No wall clock is compared across hosts (they may disagree by minutes). A member proves it is
alive by rewriting its ``member-`` object every ttl/5, which changes the object's tag. An
observer notes when it first saw each tag (on its monotonic clock, at the moment the
listing that showed it came back); a member whose tag it has seen unchanged for a whole
``lease_ttl`` renewed nothing in that time, and a member stops its streams by 0.8 ttl after
the last renewal it sent that succeeded (:mod:`~deltastream.daemon.replicas.coordinator`),
so it runs none of them any more. This is the observation a lease needs, as in the
DynamoDB lock client's lease by record version.

A process can also see at once that a member's process is gone, but only where it sees
that process's pid: on the same machine since the same boot *and in the same pid namespace*.
Containers that share a host's name (Docker ``--network host``, Kubernetes
``hostNetwork: true``, podman pods) each have a pid namespace of their own, in which the
other's pid is free or another process (often both are pid 1). So a member records its
host, boot id, pid namespace (the inode of ``/proc/self/ns/pid``), pid and the pid's start
time, and a pid is read only when all of host, boot and namespace are this process's own;
a member recorded without a namespace (an older version) or elsewhere is judged by its
heartbeat and lease alone.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from deltastream.daemon.replicas.records import MemberRecord

__all__ = [
    "Observer",
    "ProcessIdentity",
    "describe",
    "process_gone",
    "sees_pid_of",
    "this_process",
]


@dataclass(frozen=True)
class ProcessIdentity:
    host: str
    pid: int
    boot_id: str
    started: int
    #: The inode of the pid namespace whose pids ``/proc`` shows this process (0: unknown).
    pid_ns: int = 0


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


def _pid_namespace(pid: int) -> int:
    """The inode of the pid namespace whose pids this process's ``/proc`` shows, 0 if it
    cannot be told. ``/proc`` may be mounted from another namespace than the process's own
    (a container given the host's /proc): then ``/proc/self`` is not ``pid``, and the pids
    it shows are not the ones members record."""
    try:
        if os.readlink("/proc/self") != str(pid):
            return 0
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def this_process() -> ProcessIdentity:
    pid = os.getpid()
    return ProcessIdentity(
        socket.gethostname(), pid, _boot_id(), _start_ticks(pid) or 0, _pid_namespace(pid)
    )


def sees_pid_of(member: MemberRecord, here: ProcessIdentity) -> bool:
    """Whether ``member``'s pid means the same process here: it ran on this machine since
    its last boot (same host name and boot id) in this process's pid namespace."""
    return (
        bool(member.boot_id)
        and member.pid_ns != 0
        and (member.host, member.boot_id, member.pid_ns) == (here.host, here.boot_id, here.pid_ns)
    )


def describe(member: MemberRecord, here: ProcessIdentity) -> str:
    """``member`` named for a message of this process, on one line: role, id, host, pid and
    address (``replica 993d… (node-1 pid 13759, 10.0.0.5:9464)``). Its pid is said to be
    in another pid namespace unless this process sees it (:func:`sees_pid_of`): a
    replica in a container of its own is often pid 1 there, which next to the host's name
    would name the host's init."""
    where = f"{member.host} pid {member.pid}"
    if not sees_pid_of(member, here):
        known = member.pid_ns != 0 and here.pid_ns != 0
        where += " in another pid namespace" if known else " in a pid namespace unknown here"
    return f"{member.role} {member.member} ({where}{', ' + member.http if member.http else ''})"


def process_gone(member: MemberRecord, here: ProcessIdentity) -> bool:
    """Whether ``member``'s process certainly no longer runs: this process sees its pid
    (:func:`sees_pid_of`) and that pid is free or now another process (a container
    restarted in its pod reuses pid 1). Anything else is left to observation."""
    if not sees_pid_of(member, here):
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
