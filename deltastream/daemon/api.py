"""Following a table from Python.

::

    async def on_rows(delivery: deltastream.Delivery) -> None:
        for batch in delivery.batches: ...

    await deltastream.tail("s3://lake/orders", on_rows, state="/var/lib/ds/orders",
                           mode="follow", start="latest",
                           storage_options={"region": "eu-west-1"})

``tail`` runs until cancelled (or, in ``snapshot`` mode, until the snapshot is delivered).
Transient errors restart the stream after a backoff, as in the daemon; an error retrying
cannot fix is raised.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit

from deltastream.daemon.delivery import Delivery, Sink
from deltastream.daemon.reset import reset_stream
from deltastream.daemon.service import Service, single_stream
from deltastream.daemon.sinks import CallbackSink, parse_sink
from deltastream.daemon.tailer import (
    Mode,
    OnMissingFile,
    OnMissingVersions,
    OnSchemaChange,
    StartFrom,
    TailConfig,
)

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
    mode: str = "snapshot-and-follow",
    start: str | int = "latest",
    storage_options: Mapping[str, str] | None = None,
    state_storage_options: Mapping[str, str] | None = None,
    columns: Sequence[str] | None = None,
    poll_interval: float = 1.0,
    notifications: bool = True,
    on_schema_change: str = "stop",
    on_missing_versions: str = "fail",
    on_missing_file: str = "fail",
    infer_without_cdf: bool = False,
    max_rows_per_delivery: int = 100_000,
    http_address: str | None = None,
    reset: bool = False,
) -> None:
    """Follow the table at ``uri`` into ``sink``: a :class:`Sink`, a spec string
    (``jsonl:PATH``, ``parquet:DIR``, ``http://…``, ``exec:COMMAND``) or a function called
    with each :class:`Delivery` (sync or async; at-least-once). ``reset=True`` first
    discards what the stream wrote to the sink and its state, starting it over."""
    config = TailConfig(
        name=name or default_stream_name(uri),
        uri=uri,
        state=state,
        mode=Mode(mode),
        start=StartFrom.parse(str(start)),
        storage_options=dict(storage_options or {}),
        state_storage_options=None
        if state_storage_options is None
        else dict(state_storage_options),
        columns=None if columns is None else tuple(columns),
        poll_interval=poll_interval,
        notifications=notifications,
        on_schema_change=OnSchemaChange(on_schema_change),
        on_missing_versions=OnMissingVersions(on_missing_versions),
        on_missing_file=OnMissingFile(on_missing_file),
        infer_without_cdf=infer_without_cdf,
        max_rows_per_delivery=max_rows_per_delivery,
    )
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
    if reset:
        target = sinks.get(config.name) or parse_sink(spec, table=config.name)
        await reset_stream(config.name, target, config.state, config.resolved_state_options)
    service = Service(single_stream(config, spec, http_address=http_address), sinks=sinks)
    await service.run()
    for error in service.failures.values():
        raise error
