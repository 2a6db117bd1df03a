"""The sinks a stream's rows can go to, and what each promises across crashes.

A sink is named by a spec string (:func:`parse_sink`):

=====================  =============  ====================================================
spec                   guarantee      what it does per delivery
=====================  =============  ====================================================
``jsonl:PATH``         exactly-once   appends one JSON object per row, flushes and fsyncs;
                                      the file's size is committed with the position
``jsonl:-``            at-least-once  the same on standard output (which cannot be undone)
``parquet:DIR``        exactly-once   writes one parquet file per delivery, atomically
``http://URL``         at-least-once  POSTs one JSON document (``https://`` too)
``exec:COMMAND``       at-least-once  writes a parquet file and runs ``/bin/sh -c COMMAND``
``delta:URI``          exactly-once   appends the rows to a Delta table in one commit whose
                                      ``txn`` action holds the position
``delta:URI?mode=      exactly-once   keeps a mirror of the source table in a Delta table:
merge&key=K``                         one ``MERGE`` per delivery, with the ``txn`` too
``postgresql://...``   exactly-once   appends the change rows to a table (``?table=NAME``),
                                      or mirrors the source table into it
                                      (``&mode=merge&key=id``), the stream's position
                                      committed in the same transaction
(Python API)           at-least-once  :class:`CallbackSink` calls a function
=====================  =============  ====================================================

An http sink's headers (``Authorization``: ``${NAME}`` reads an environment variable), timeout
and TLS verification are the stream's ``http_*`` settings, and an exec sink's timeout its
``exec_timeout`` (:mod:`~deltastream.daemon.stream.config`), and a delta sink's store settings
the stream's ``sink_options`` (default: the table's ``storage_options`` when both are in
object stores of one kind), given to :func:`parse_sink` as ``stream``; without one, each
sink takes the settings' defaults.

Each sink says how many rows per delivery it works best with
(:attr:`~deltastream.daemon.delivery.Sink.rows_per_delivery`): the delta and PostgreSQL
sinks, whose every delivery is one commit with a large fixed cost, 1,000,000, the others
100,000; a stream's ``max_rows_per_delivery`` overrides it, and its
``max_bytes_per_delivery`` bounds every delivery's memory.

How exactly-once works. The tailer commits a delivery's end position together with the state
``deliver`` returned, atomically, only after ``deliver`` returned. A crash can come at any
instant, so the destination may hold rows past the committed position: the one delivery in
flight, whole or torn (deliveries are sequential, each starting at the committed position).
:meth:`Sink.recover` removes exactly that, and nothing it cannot prove is that:

* Each file sink owns its output through a hidden marker beside it
  (:mod:`~deltastream.daemon.sinks.marker`): locked while a stream writes (a second stream
  gets :class:`~deltastream.errors.SinkInUseError`), and recording durably, before a
  delivery's first row is written, where that delivery starts.
* ``jsonl:PATH`` commits ``{"bytes": size, "tail": digest}`` (the size, and a fingerprint of
  the 4 KiB before it). ``recover`` checks that the file is the one committed (not shorter,
  same fingerprint), and truncates it to the committed size only if the marker shows that the
  bytes past it are the delivery that started at the committed position and size. The file is
  open only then and while a delivery is appended: each delivery first checks that the file
  at the path is still the one recovered, its committed bytes intact, and one removed,
  replaced or truncated meanwhile raises :class:`~deltastream.errors.SinkRecoveryError`.
* ``parquet:DIR`` names each file by the stream's name, its version range and its start
  position (``{table}-{from:020d}-{to:020d}-{start token}.parquet``; the name sorts in stream
  order) and writes it to a hidden temporary file that is fsynced and renamed into place.
  ``recover`` deletes this stream's leftover temporary files, and its one file starting at
  the committed position if the marker shows that delivery was in flight; files of other
  streams in the same directory are left alone. The state is ``{"table": name}`` and a
  bounded summary of the files so far (count, bytes, a digest of names and sizes, the last
  one), which ``recover`` checks the files before the committed position against: a file
  missing or of another size is named (each file's footer names the one before it). Readers
  should ignore names starting with ``.`` (pyarrow, Spark and most tools do).
* ``delta:URI`` commits the stream's position in the target's own transaction: each commit
  carries a ``txn`` action (:mod:`~deltastream.daemon.sinks.delta`), and ``recover`` returns
  it as a :class:`~deltastream.daemon.delivery.HeldPosition`, where the stream resumes.
  Nothing is ever undone in recovery. A reset removes every row of a target holding the
  stream's ``txn`` and releases the ``txn`` (version -1), in one Delta commit; an existing
  table holding rows that no stream's ``txn`` accounts for is refused.
* ``postgresql://...`` commits the rows and the stream's position in one transaction of the
  target database (its offsets table), and ``recover`` returns that position
  (:class:`~deltastream.daemon.delivery.HeldPosition`): the stream resumes where the
  database is, whatever the state says (see :mod:`~deltastream.daemon.sinks.postgresql`).
* Anything else (output when the state has no position, output past the committed position
  that no in-flight delivery explains, a file shorter or other than the one committed) raises
  :class:`~deltastream.errors.SinkRecoveryError` and touches nothing: the state may have been
  lost or restored from an older copy. :meth:`Sink.reset` (``deltastream reset``) discards a
  stream's output when the user decides to start over (never another stream's: a jsonl file
  whose marker names another stream is refused).

One writer per target. Each process that starts a stream takes it over with the next epoch
(:attr:`~deltastream.daemon.delivery.Delivery.epoch`, raised by a conditional write of the
state). The delta and PostgreSQL sinks fence in their own transaction (a newer epoch, or the
stream's position moved, commits nothing: :class:`~deltastream.errors.SinkFencedError`); the
file sinks' lock holds on one host, so their outputs are refused on network filesystems
(:func:`~deltastream.daemon.sinks.marker.refuse_network_filesystem`); the http and exec sinks
pass the epoch on (``Deltastream-Epoch``, ``DELTASTREAM_EPOCH``) for the receiver to fence.

At-least-once sinks may see rows again after a crash. The tailer makes the repeat identical:
it commits where a round of deliveries ends before the round's first delivery, and a restart
ends its first round there, so the repeated rows come in the same deliveries with the same
``Idempotency-Key`` (``table_id:start-end``), as long as the stream's delivery bounds
(``max_rows_per_delivery``, ``max_bytes_per_delivery``) are unchanged. A receiver that drops
keys it has acknowledged gets every row exactly once; the ``start``/``end`` positions in each
request say the same.
The exec sink passes the key as ``DELTASTREAM_IDEMPOTENCY_KEY``.

Deliveries with no rows (a version that changed no data still advances the position) write
nothing, POST nothing and run nothing; :class:`CallbackSink` still calls its function.

The HTTP and exec sinks retry transient failures (connection errors, timeouts, HTTP 5xx, 408,
409 and 429; a non-zero exit) through the project's retry loop
(:func:`~deltastream.storage.retry.call_with_retries`): exponential backoff and full jitter,
by default forever: a daemon should ride out an outage of its destination. Each retry goes
to the sink's ``retry_listener`` (the tailer's, which counts it and logs it with the
stream's name) or, without one, is logged at WARNING by the sink. A failure retrying cannot
fix (HTTP 4xx, a redirect) raises :class:`SinkError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from deltastream.daemon.delivery import Sink
from deltastream.daemon.sinks.callback import CallbackSink
from deltastream.daemon.sinks.common import SPEC_FORMS as SPEC_FORMS
from deltastream.daemon.sinks.delta import DeltaSink
from deltastream.daemon.sinks.exec import ExecSink
from deltastream.daemon.sinks.http import HttpSink
from deltastream.daemon.sinks.jsonl import JsonlSink
from deltastream.daemon.sinks.parquet import ParquetFileName as ParquetFileName
from deltastream.daemon.sinks.parquet import (
    ParquetSink,
    parquet_file_name,
    parse_parquet_file_name,
)
from deltastream.daemon.sinks.postgresql import SCHEMES as POSTGRESQL_SCHEMES
from deltastream.daemon.sinks.postgresql import PostgresSink
from deltastream.errors import InvalidArgumentError

__all__ = [
    "CallbackSink",
    "DeltaSink",
    "ExecSink",
    "HttpSink",
    "JsonlSink",
    "ParquetSink",
    "PostgresSink",
    "parquet_file_name",
    "parse_parquet_file_name",
    "parse_sink",
]

#: The kinds of sink a spec may name (the part before the first ``:``), for messages.
SINK_KINDS = ("jsonl", "parquet", "http", "https", "exec", "delta", *POSTGRESQL_SCHEMES)


class SinkSettings(Protocol):
    """What a stream's settings (:class:`~deltastream.daemon.stream.config.TailConfig`) tell
    :func:`parse_sink`; spelt out here so that the sinks need not know the stream."""

    @property
    def http_timeout(self) -> float: ...
    @property
    def http_verify(self) -> bool: ...
    @property
    def http_ca_bundle(self) -> str | None: ...
    @property
    def resolved_http_headers(self) -> dict[str, str]: ...
    @property
    def exec_timeout(self) -> float: ...
    def resolved_sink_options(self, target: str) -> Mapping[str, str]: ...


def parse_sink(
    spec: str,
    *,
    work_dir: Path | None = None,
    table: str | None = None,
    stream: SinkSettings | None = None,
    sink_options: Mapping[str, str] | None = None,
) -> Sink:
    """The sink a spec string names: ``jsonl:PATH``, ``jsonl:-``, ``parquet:DIRECTORY``,
    ``http://URL``, ``https://URL`` (also spelt ``http:URL``), ``exec:COMMAND``,
    ``delta:URI[?mode=merge&key=…]`` or
    ``postgresql://USER@HOST:PORT/DB?table=NAME[&mode=merge&key=COLUMN,...]`` (also
    ``postgres://``) (``work_dir``: where the exec sink writes its batch files; default a
    temporary directory;
    ``table``: the stream's name, which lets the parquet sink clean up after a crash already
    in ``recover``; ``stream``: the stream's settings, whose ``http_*`` ones configure an http
    sink, the environment variables in its headers read now, ``exec_timeout`` an exec
    sink, and ``sink_options`` a delta sink's store; other sinks ignore them;
    ``sink_options``: a delta sink's store options where there are no stream settings, as
    for ``deltastream reset``)."""
    scheme, sep, rest = spec.partition(":")
    kind = scheme.strip().lower()
    if sep and rest:
        if kind == "jsonl":
            return JsonlSink(rest)
        if kind == "parquet":
            return ParquetSink(rest, table=table)
        if kind == "http" and rest.lower().startswith(("http://", "https://")):
            return _http_sink(rest, stream)  # the ``http:URL`` spelling
        if kind in ("http", "https"):
            return _http_sink(spec, stream)
        if kind == "delta":
            options = sink_options if stream is None else stream.resolved_sink_options(rest)
            return DeltaSink(rest, storage_options=options)
        if kind == "exec" and rest.strip():
            if stream is None:
                return ExecSink(rest, work_dir=work_dir)
            return ExecSink(rest, work_dir=work_dir, timeout=stream.exec_timeout)
        if kind in POSTGRESQL_SCHEMES and rest.startswith("//"):
            return PostgresSink(spec.strip())
    if kind in SINK_KINDS:
        problem = "is incomplete"
    else:
        problem = f"is not a sink (known kinds: {', '.join(SINK_KINDS)})"
    raise InvalidArgumentError(f"sink {spec!r} {problem}: accepted forms are {SPEC_FORMS}")


def _http_sink(url: str, stream: SinkSettings | None) -> HttpSink:
    if stream is None:
        return HttpSink(url)
    return HttpSink(
        url,
        headers=stream.resolved_http_headers,
        timeout=stream.http_timeout,
        verify=stream.http_verify,
        ca_bundle=stream.http_ca_bundle,
    )
