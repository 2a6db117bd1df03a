"""Starting a stream over, on the user's explicit request: discard its output and its state.

A stream never removes output it cannot prove it wrote after its committed position (see
:mod:`deltastream.daemon.sinks`), so a stream whose state is lost, or older than its output,
refuses to start. :func:`reset_stream` is the knowing way out (``deltastream reset``, or
``tail --reset``): it removes what the stream wrote to its sink, then its state, so the next
run starts the stream afresh. A running stream holds its sink's lock, so a reset refuses to
touch a stream that is running.

A reset can be killed half way, with some of the output gone and the state still there;
resuming from that would lose rows without a word. So the reset first records itself in the
state directory (``reset.json``, :meth:`StateStore.begin_reset`), and removes that record
last: until then the stream refuses to start
(:class:`~deltastream.errors.ResetIncompleteError`), and running the reset again finishes it
(output or state already gone is no obstacle).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from deltastream.daemon.delivery import Sink, StreamRef
from deltastream.daemon.stream.state import StateStore
from deltastream.errors import InvalidArgumentError
from deltastream.storage import open_store

__all__ = ["reset_stream"]

log = logging.getLogger(__name__)


async def reset_stream(
    name: str,
    sink: Sink,
    state: str,
    state_storage_options: Mapping[str, str] | None = None,
) -> list[str]:
    """Discard what stream ``name`` wrote to ``sink`` and its state at ``state``; returns
    what was removed. It fails, touching nothing, while the stream runs, when the state is
    another stream's (``position.json`` records another name) or the output is; once under
    way it is recorded, and finished by running it again."""
    async with open_store(state, dict(state_storage_options or {})) as store:
        states = StateStore(store)
        stream = StreamRef(name, states.uri)
        recorded = await states.recorded()
        if recorded is not None and recorded.stream and recorded.stream != name:
            owner = StreamRef(recorded.stream, states.uri)
            raise InvalidArgumentError(
                f"{states.uri} holds the state of stream {recorded.stream!r}, not of "
                f"{name!r}: a reset of {name!r} leaves it alone; nothing was touched. To start "
                f"{recorded.stream!r} over: "
                f"{owner.reset_command(recorded.sink_spec or sink.description)}"
            )
        async with sink.reset_lock(stream):
            await states.begin_reset(name, sink.description)
            removed = await sink.reset(stream)
        removed += await states.reset()
    for what in removed:
        log.warning("%s: reset: removed %s", name, what, extra={"stream": name})
    return removed
