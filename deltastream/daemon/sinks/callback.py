"""The Python API's sink: :class:`CallbackSink` calls a function per delivery;
at-least-once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from deltastream.daemon.crashpoints import crash_point
from deltastream.daemon.delivery import Delivery, Guarantee, Position, Sink, StreamRef


class CallbackSink(Sink):
    """Calls ``fn(delivery)`` for every delivery, for the Python API; an awaitable result
    is awaited. An exception from ``fn`` propagates (the delivery is not committed).

    A synchronous ``fn`` runs on the event loop: hand long work to a thread yourself.
    Deliveries with no rows are passed on too (they advance the position). At-least-once.
    """

    guarantee: Guarantee = "at-least-once"

    def __init__(self, fn: Callable[[Delivery], object], *, description: str | None = None) -> None:
        self.fn = fn
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        self._description = description or f"callback:{name}"

    @property
    def description(self) -> str:
        return self._description

    async def recover(
        self, stream: StreamRef, committed: Position | None, state: Mapping[str, Any]
    ) -> None:
        """Nothing to undo: the function may see rows again after a crash."""

    async def deliver(self, delivery: Delivery) -> Mapping[str, Any]:
        result = self.fn(delivery)
        if inspect.isawaitable(result):
            await result
        crash_point("sink.after-write")
        return {}
