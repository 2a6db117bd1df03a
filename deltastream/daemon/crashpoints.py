"""Named crash points of the delivery protocol, for tests that stop the process exactly there.

Random kills rarely land on the instants that matter (between a sink's write and its fsync,
between the fsync and the state commit, ...). Each such instant is a named point; the code
calls :func:`crash_point` as it passes one. Normally that does nothing. With the environment
variable ``DELTASTREAM_CRASH_AT`` set to ``POINT:N`` (several separated by commas), the process
exits at once, with :data:`CRASH_EXIT_STATUS` and without running any cleanup
(:func:`os._exit`), the ``N``-th time it passes ``POINT`` (``N`` defaults to 1). With
``POINT:N:stop`` the process freezes itself there instead (``SIGSTOP``), as a process paused
by its host would, until it is sent ``SIGCONT``: for tests of another process taking a
stream over from a frozen one.

The variable is read once, the first time any point is passed (so a test may set it in a
freshly forked child). An unknown point name is an error, so that a typo cannot make a test
pass without ever crashing.

The points, in the order a delivery passes them:

``sink.before-write``   the tailer is about to hand a delivery to the sink
``sink.after-write``    the sink wrote the rows (a file sink: not yet durable; other sinks:
                        the destination acknowledged them)
``sink.after-fsync``    a file sink made the rows durable (file and directory synced)
``state.before-commit`` the sink returned; the position is not committed yet
``state.after-commit``  the position was committed
``delivery.between``    between two deliveries of one version (after the first one's commit)
``snapshot.file``       in the snapshot phase, after each file's read was started
``state.snapshot-write`` the table-state snapshot is written; ``position.json`` does not
                        name it yet
``state.snapshot-prune`` ``position.json`` names the new snapshot; older ones not yet deleted

And the points a reset (:mod:`deltastream.daemon.stream.reset`) passes:

``reset.marked``        the reset is recorded in the state directory; nothing removed yet
``reset.output-file``   a file sink removed one file of the stream's output (passed per file)
``reset.state``         the stream's state is removed; the reset's record not yet
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Final

from deltastream.errors import InvalidArgumentError

__all__ = ["CRASH_ENV", "CRASH_EXIT_STATUS", "POINTS", "crash_point"]

CRASH_ENV: Final = "DELTASTREAM_CRASH_AT"
#: The exit status of a crash at a crash point (distinct from Python's 1 and the CLI's 2).
CRASH_EXIT_STATUS: Final = 86

POINTS: Final = frozenset(
    {
        "sink.before-write",
        "sink.after-write",
        "sink.after-fsync",
        "state.before-commit",
        "state.after-commit",
        "delivery.between",
        "snapshot.file",
        "state.snapshot-write",
        "state.snapshot-prune",
        "reset.marked",
        "reset.output-file",
        "reset.state",
    }
)

#: Point -> passes left before the crash, and whether it freezes rather than exits;
#: ``None`` until the variable was read.
_armed: dict[str, tuple[int, bool]] | None = None


def _parse(text: str) -> dict[str, tuple[int, bool]]:
    armed: dict[str, tuple[int, bool]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, rest = part.partition(":")
        count, _, action = rest.partition(":")
        if name not in POINTS:
            raise InvalidArgumentError(
                f"{CRASH_ENV}: unknown crash point {name!r}; known: {', '.join(sorted(POINTS))}"
            )
        if count and not (count.isdigit() and int(count) >= 1):
            raise InvalidArgumentError(f"{CRASH_ENV}: {part!r}: the count must be >= 1")
        if action not in ("", "stop"):
            raise InvalidArgumentError(f"{CRASH_ENV}: {part!r}: the action may only be 'stop'")
        armed[name] = (int(count) if count else 1, action == "stop")
    return armed


def crash_point(name: str) -> None:
    """Pass the crash point ``name``: exit abruptly if it is armed and its count is reached."""
    global _armed
    if _armed is None:
        _armed = _parse(os.environ.get(CRASH_ENV, ""))
    if not _armed:
        return
    assert name in POINTS, name
    armed = _armed.get(name)
    if armed is None:
        return
    left, freeze = armed
    if left > 1:
        _armed[name] = (left - 1, freeze)
        return
    if freeze:
        del _armed[name]
        sys.stderr.write(f"deltastream: crash point {name} reached: stopping (SIGSTOP)\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    sys.stderr.write(f"deltastream: crash point {name} reached: exiting\n")
    sys.stderr.flush()
    os._exit(CRASH_EXIT_STATUS)
