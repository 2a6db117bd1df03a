"""systemd's service notifications (``sd_notify``), for a unit with ``Type=notify`` and
``WatchdogSec=``: a datagram to the unix socket systemd names in ``$NOTIFY_SOCKET``.

``READY=1`` once the service runs (systemd then counts the unit as started), ``STOPPING=1``
when it starts stopping, and, while systemd asks for a watchdog (``$WATCHDOG_USEC``, for this
process: ``$WATCHDOG_PID``), ``WATCHDOG=1`` every half period from the event loop that runs
the streams. A loop that stops turning (blocked, deadlocked) misses its pings, and systemd
kills and restarts the daemon. The pings say the process works, not that every stream is
healthy: restarting fixes no down sink (``/healthz`` reports those).

Without ``$NOTIFY_SOCKET`` (not under systemd, or another unit type) everything here does
nothing; a notification that cannot be sent is logged at DEBUG and dropped, since systemd
gets the next one, or acts on the missing ones.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

import anyio

__all__ = ["notify", "watchdog", "watchdog_interval"]

log = logging.getLogger(__name__)


def _address(value: str) -> str | None:
    """The socket address in ``$NOTIFY_SOCKET``: a path, or ``@name`` for the abstract
    namespace; ``None`` for anything else (``vsock:``, which is for virtual machines)."""
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def notify(state: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (``READY=1``, ``WATCHDOG=1``, ``STOPPING=1``, ``STATUS=…``, several
    separated by newlines) to systemd; whether it was sent (``False`` when not asked for)."""
    env = os.environ if environ is None else environ
    address = _address(env.get("NOTIFY_SOCKET", ""))
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(state.encode(), address)
    except OSError as e:
        log.debug("cannot notify systemd (%s) of %r: %s", env["NOTIFY_SOCKET"], state, e)
        return False
    return True


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between watchdog pings (half systemd's ``WatchdogSec=``), or ``None`` when
    systemd asks for none, or asks another process (``$WATCHDOG_PID``)."""
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1e6 / 2


async def watchdog(environ: Mapping[str, str] | None = None) -> None:
    """Ping systemd's watchdog every :func:`watchdog_interval` until cancelled; returns at
    once when there is no watchdog."""
    interval = watchdog_interval(environ)
    if interval is None:
        return
    while True:
        notify("WATCHDOG=1", environ)
        await anyio.sleep(interval)
