"""The summary line each stream logs at a steady rate (every ``log_summary_interval``
seconds, :data:`~deltastream.daemon.observability.logs.LOG_SUMMARY_INTERVAL` by default):
the versions it passed and the rows it delivered since its previous summary, where it is,
its status and its lag, so that a quiet log still shows every stream alive, and a busy one
shows the rate::

    orders: 3 versions, 1,200 rows delivered in the last 60s; at v16, following, 0 behind

(the line's structured fields: ``stream``, ``uri``, ``versions``, ``rows``,
``interval_s``, ``position``, ``status``, ``lag_versions``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import anyio

from deltastream.daemon.delivery import Position
from deltastream.daemon.observability.metrics import TableMetrics

__all__ = ["StreamSummaries"]

log = logging.getLogger("deltastream.daemon.summary")


@dataclass(frozen=True)
class _Mark:
    """A stream at its previous summary."""

    position: Position | None
    rows: int
    at: float


class StreamSummaries:
    """Logs one summary line per stream, at each call of :meth:`log` or every ``interval``
    seconds of :meth:`run`.

    ``positions(name)`` gives a stream's committed position and the one it started at in
    this process (``None``, ``None`` before it started), so that the versions of the first
    period count from where the stream began.
    """

    def __init__(
        self,
        metrics: Mapping[str, TableMetrics],
        positions: Callable[[str], tuple[Position | None, Position | None]],
    ) -> None:
        self._metrics = metrics
        self._positions = positions
        now = time.monotonic()
        self._marks = {name: _Mark(None, m.rows_delivered, now) for name, m in metrics.items()}

    async def run(self, interval: float) -> None:
        """Log the summaries every ``interval`` seconds until cancelled."""
        while True:
            await anyio.sleep(interval)
            self.log()

    def log(self) -> None:
        now = time.monotonic()
        for name, m in self._metrics.items():
            mark = self._marks[name]
            position, started = self._positions(name)
            since = mark.position or started
            versions = position.version - since.version if position and since else 0
            rows = m.rows_delivered - mark.rows
            seconds = now - mark.at
            where = f"at {position}, {m.status}" if position is not None else m.status
            log.info(
                "%s: %d versions, %s rows delivered in the last %.0fs; %s, %d behind",
                name,
                versions,
                f"{rows:,}",
                seconds,
                where,
                m.lag_versions,
                extra={
                    "stream": name,
                    "uri": m.uri,
                    "versions": versions,
                    "rows": rows,
                    "interval_s": round(seconds, 3),
                    "position": None if position is None else str(position),
                    "status": m.status,
                    "lag_versions": m.lag_versions,
                },
            )
            self._marks[name] = _Mark(position or mark.position, m.rows_delivered, now)
