"""Following a table from Python.

::

    async def on_rows(delivery: deltastream.Delivery) -> None:
        for batch in delivery.batches: ...

    await deltastream.tail("s3://lake/orders", on_rows, state="/var/lib/ds/orders",
                           mode="follow", start="latest",
                           storage_options={"region": "eu-west-1"})

The keywords after ``state`` and ``name`` are the stream options, with the names, defaults
and checks of :mod:`deltastream.daemon.stream.config` (the ``tail`` command's options and the
``serve`` file's keys; ``from`` is ``start`` here): a wrong type or value raises
:class:`~deltastream.errors.InvalidArgumentError` naming the keyword and the value.

``tail`` runs until cancelled (or, in ``snapshot`` mode, until the snapshot is delivered).
Transient errors restart the stream after a backoff, as in the daemon; an error retrying
cannot fix is raised.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Unpack
from urllib.parse import urlsplit

import anyio

from deltastream.daemon.delivery import Delivery, Sink
from deltastream.daemon.service.preflight import check_service
from deltastream.daemon.service.recorded_group import recorded_group
from deltastream.daemon.service.supervisor import Service, single_stream
from deltastream.daemon.sinks import CallbackSink
from deltastream.daemon.stream.config import TailOptions, tail_config

__all__ = ["default_stream_name", "tail"]


def default_stream_name(uri: str) -> str:
    """A stream name from a table URI: its last path segment, reduced to safe characters."""
    path = urlsplit(uri).path if "://" in uri else uri
    last = path.rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", last).strip("._")
    return name or "table"


async def tail(
    uri: str,
    sink: Sink | str | Callable[[Delivery], object],
    *,
    state: str,
    name: str | None = None,
    http_address: str | None = None,
    reset: bool = False,
    **options: Unpack[TailOptions],
) -> None:
    """Follow the table at ``uri`` into ``sink``: a :class:`Sink`, a spec string
    (``jsonl:PATH``, ``parquet:DIR``, ``http://…``, ``exec:COMMAND``, ``delta:URI``,
    ``postgresql://…``; see :func:`~deltastream.daemon.sinks.parse_sink`) or a function called
    with each :class:`Delivery` (sync or async; at-least-once). ``reset=True`` first
    discards what the stream wrote to the sink and its state, starting it over. ``options``:
    ``mode``, ``start``, ``storage_options``, ``poll_interval``, … (see :class:`TailOptions`),
    each at :class:`~deltastream.daemon.stream.config.TailConfig`'s default if not given."""
    config = tail_config(name or default_stream_name(uri), uri, state, options)
    sinks: dict[str, Sink] = {}
    if isinstance(sink, Sink):
        sinks[config.name] = sink
        spec = sink.description
    elif isinstance(sink, str):
        spec = sink
    else:
        callback = CallbackSink(sink)
        sinks[config.name] = callback
        spec = callback.description
    service_config = single_stream(config, spec, http_address=http_address)
    # The CLI's start-up checks (address bindable, state and sink locations usable): a
    # clear InvalidArgumentError here rather than an ExceptionGroup from a running service.
    await anyio.to_thread.run_sync(check_service, service_config, sinks)
    # As the CLI's tail: a stream a replica group runs is taken as the group's exclusive
    # member (refused while a replica runs it), and a reset happens under that lease.
    group = await recorded_group(config.state, config.resolved_state_options)
    if group is not None:
        service_config = replace(service_config, group=group, exclusive=True)
    service = Service(service_config, sinks=sinks, reset=reset)
    await service.run()
    for error in service.failures.values():
        raise error
