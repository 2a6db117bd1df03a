"""The ``deltastream`` command line.

Every subcommand prints JSON to stdout. Any error deltastream recognises is printed as one
line on stderr (``deltastream: error: …``) with exit status 2; warnings (e.g. a corrupt
``_last_checkpoint`` that was worked around) go to stderr too. When the reader of stdout
goes away (``deltastream files T | head -1``) the command ends quietly with status 141
(128 + SIGPIPE, as ``cat`` or ``grep`` would).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn, TextIO

import anyio
import anyio.abc
import pyarrow as pa

from deltastream._version import __version__
from deltastream.changes.api import read_changes
from deltastream.daemon.api import default_stream_name
from deltastream.daemon.delivery import Sink
from deltastream.daemon.observability.logs import (
    LOG_FORMATS,
    LOG_LEVELS,
    LOG_SUMMARY_INTERVAL,
    configure_logging,
)
from deltastream.daemon.observability.progress import PROGRESS_MODES, progress_bar
from deltastream.daemon.observability.redaction import Redactor
from deltastream.daemon.service import sd_notify
from deltastream.daemon.service.address import parse_address
from deltastream.daemon.service.config import load_config
from deltastream.daemon.service.preflight import check_service
from deltastream.daemon.service.recorded_group import holding, recorded_group
from deltastream.daemon.service.supervisor import Service, ServiceConfig, single_stream
from deltastream.daemon.sinks import SPEC_FORMS, parse_sink
from deltastream.daemon.stream.config import (
    OPTIONS,
    add_cli_options,
    cli_options,
    parse_key_values,
    tail_config,
)
from deltastream.daemon.stream.reset import reset_stream
from deltastream.demo import run_demo
from deltastream.errors import (
    DeltaStreamError,
    InvalidArgumentError,
    OutputClosedError,
    StreamHeldError,
)
from deltastream.log.actions import AddFile
from deltastream.output import write_json_lines, write_parquet
from deltastream.read.api import read_rows
from deltastream.runtime import keep_pandas_out_of_pyarrow, use_fast_allocator
from deltastream.snapshot.snapshot import Snapshot
from deltastream.snapshot.table import Table
from deltastream.storage import storage_locations
from deltastream.storage.paths import CONFINED, ExternalPaths

__all__ = ["main"]

EXIT_ERROR = 2
#: The status when stdout's reader went away: what a program killed by SIGPIPE reports.
EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE


def _storage_options(pairs: Sequence[str]) -> dict[str, str]:
    return parse_key_values(pairs, "--storage-option")


_URI_HELP = f"table location: {storage_locations()}"


def _add_table_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("uri", help=_URI_HELP)
    # The same help as tail's option of that name (defined once there).
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=OPTIONS["storage_options"].help,
    )


def _add_external_paths_arg(p: argparse.ArgumentParser) -> None:
    # The same flag, help and meaning as tail's option of that name (defined once there).
    option = OPTIONS["allow_external_paths"]
    p.add_argument(
        option.flag,
        dest="allow_external_paths",
        nargs="*",
        default=None,
        metavar=option.metavar,
        help=option.help,
    )


def _external_paths(args: argparse.Namespace) -> ExternalPaths:
    roots = args.allow_external_paths
    return CONFINED if roots is None else ExternalPaths.of(list(roots) or True)


def _add_output_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="a .parquet file to write, or - for JSON lines on stdout",
    )


def _columns(text: str | None) -> list[str] | None:
    if not text:
        return None
    return [c.strip() for c in text.split(",") if c.strip()]


def _check_output(output: str) -> None:
    """Refuse an output the reader cannot write before any table is opened."""
    if output != "-" and not output.endswith(".parquet"):
        raise InvalidArgumentError(f"output must be a .parquet file or -, not {output!r}")


def _write(reader: pa.RecordBatchReader, output: str, out: TextIO) -> None:
    if output == "-":
        write_json_lines(reader, out)
        return
    rows = write_parquet(reader.schema, reader, output)
    out.write(json.dumps({"output": output, "rows": rows}) + "\n")


_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors suggest what was meant: a misspelt option (``--form``:
    did you mean ``--from``?) or command. A subcommand's parser reports the options after the
    command itself, with its own usage. (argparse's own ``suggest_on_error``, Python 3.14,
    suggests choices only, and this runs on 3.11.)"""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._given = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:  # the subcommand's parser, not the top-level one, says so
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        hints = [f"{word}: did you mean {match}?" for word, match in self._suggestions(message)]
        super().error("; ".join([message, *hints]))

    def _suggestions(self, message: str) -> list[tuple[str, str]]:
        """(what was given, what was probably meant) for each unknown option given to this
        parser, and for a value that is not one of an argument's choices (a command)."""
        options = [o for o in self._option_string_actions if o.startswith("--")]
        found: list[tuple[str, str]] = []
        takes_value = False
        for arg in getattr(self, "_given", []):
            if arg == "--":
                break
            if takes_value:
                takes_value = False
                continue
            if not arg.startswith("-") or len(arg) == 1 or _NEGATIVE_NUMBER.match(arg):
                if self._subparsers is not None:
                    break  # the command: what follows it is its parser's
                continue
            name, eq, _ = arg.partition("=")
            action = self._option_string_actions.get(name)
            takes_value = action is not None and action.nargs != 0 and not eq
            known = action is not None or (
                name.startswith("--") and any(o.startswith(name) for o in options)
            )
            close = difflib.get_close_matches(name.lower(), options, n=1)
            if not known and close:
                found.append((name, close[0]))
        invalid = _INVALID_CHOICE.match(message)
        if invalid is not None:
            choices = [
                str(choice)
                for action in self._actions
                if _action_name(action) == invalid["argument"]
                for choice in action.choices or ()
            ]
            close = difflib.get_close_matches(invalid["value"], choices, n=1)
            if close:
                found.append((repr(invalid["value"]), repr(close[0])))
        return found


#: argparse's words for a value not among an argument's choices.
_INVALID_CHOICE = re.compile(r"argument (?P<argument>\S+): invalid choice: '(?P<value>[^']*)'")


def _action_name(action: argparse.Action) -> str:
    """How argparse names an argument in its errors (``argument NAME: …``)."""
    if action.option_strings:
        return "/".join(action.option_strings)
    return str(action.metavar or action.dest)


def _add_logging_args(p: argparse.ArgumentParser, *, top: bool) -> None:
    """``-v`` and ``--log-level``, before the command (``top``) or after it: the same
    options, with the same meaning. After it they default to nothing, so that a value given
    before it stands."""
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="log debug information to stderr (as --log-level debug)",
    )
    p.add_argument(
        "--log-level",
        choices=list(LOG_LEVELS),
        default=None if top else argparse.SUPPRESS,
        help="log this level and above to stderr (default: info for tail and serve, where "
        "serve's [server] log_level applies; warning for the other commands)",
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="deltastream", description="Follow a Delta Lake table as it changes.")
    _add_logging_args(parser, top=True)
    parser.add_argument("--version", action="version", version=f"deltastream {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    snap = sub.add_parser("snapshot", help="print a table's version, protocol and metadata")
    _add_table_args(snap)
    when = snap.add_mutually_exclusive_group()
    when.add_argument("--version", type=int, help="time travel to this version")
    when.add_argument("--timestamp", help="time travel to this ISO-8601 time (UTC if no offset)")
    snap.add_argument(
        "--validate-checksum",
        action="store_true",
        help="compare the snapshot with the writer's version checksum (.crc) file",
    )

    files = sub.add_parser("files", help="print one JSON object per live file")
    _add_table_args(files)
    files_when = files.add_mutually_exclusive_group()
    files_when.add_argument("--version", type=int, help="time travel to this version")
    files_when.add_argument("--timestamp", help="time travel to this ISO-8601 time")

    read = sub.add_parser("read", help="read the table's rows to a parquet file or JSON lines")
    _add_table_args(read)
    read_when = read.add_mutually_exclusive_group()
    read_when.add_argument("--version", type=int, help="time travel to this version")
    read_when.add_argument("--timestamp", help="time travel to this ISO-8601 time")
    read.add_argument("--columns", help="comma-separated columns to return (default: all)")
    read.add_argument(
        "--where",
        help="row filter, e.g. \"country = 'NL' AND amount >= 10\" (=, <>, <, <=, "
        ">, >=, IN, IS [NOT] NULL, AND, OR, NOT)",
    )
    read.add_argument(
        "--row-ids",
        action="store_true",
        help="add each row's _row_id and _row_commit_version (a table with row tracking)",
    )
    _add_external_paths_arg(read)
    _add_output_arg(read)

    changes = sub.add_parser("changes", help="read the change data feed of a range of versions")
    _add_table_args(changes)
    start = changes.add_mutually_exclusive_group()
    start.add_argument("--from", dest="start", type=int, help="first version (default 0)")
    start.add_argument("--from-timestamp", help="first version committed at or after this time")
    end = changes.add_mutually_exclusive_group()
    end.add_argument("--to", dest="end", type=int, help="last version (default: the latest)")
    end.add_argument("--to-timestamp", help="last version committed at or before this time")
    changes.add_argument("--columns", help="comma-separated data columns (default: all)")
    changes.add_argument(
        "--where",
        metavar="EXPR",
        help="only the change rows matching this predicate (the language of read --where; "
        "it may name _change_type, _commit_version and _commit_timestamp)",
    )
    changes.add_argument(
        "--infer-without-cdf",
        action="store_true",
        help="read versions written while the change data feed was off as whole-file "
        "deletes and inserts instead of failing",
    )
    changes.add_argument(
        "--allow-empty-range",
        action="store_true",
        help="an empty result instead of an error when the range lies outside the table",
    )
    changes.add_argument(
        "--row-ids",
        action="store_true",
        help="add each row's _row_id and _row_commit_version (a table with row tracking); "
        "every version's changes then come from its add/remove actions, exact by row id",
    )
    _add_external_paths_arg(changes)
    _add_output_arg(changes)

    tail = sub.add_parser(
        "tail", help="follow a table: deliver its snapshot and/or changes to a sink, durably"
    )
    tail.add_argument("uri", help=_URI_HELP)
    tail.add_argument(
        "--sink",
        required=True,
        help=SPEC_FORMS,
    )
    tail.add_argument(
        "--state",
        required=True,
        help="the stream's state directory (a local path, s3://, gs:// or an Azure URI)",
    )
    tail.add_argument("--name", help="the stream's name (default: from the table's path)")
    # --mode, --from, --storage-option, --poll-interval, …: the stream options, with their
    # defaults and checks, as defined in deltastream.daemon.stream.config.
    add_cli_options(tail)
    tail.add_argument(
        "--http",
        default="",
        metavar="HOST:PORT",
        help="serve /healthz and /metrics there (e.g. 127.0.0.1:9464; default: off)",
    )
    tail.add_argument(
        "--reset",
        action="store_true",
        help="start the stream over: first discard its sink output and its state (see reset)",
    )
    _add_available_now_arg(tail)
    _add_daemon_args(tail)

    reset = sub.add_parser(
        "reset",
        help="start a stream over: discard what it wrote to its sink, then its state",
        description="Discards what the stream wrote to its sink (a jsonl file, its parquet "
        "files, the rows of a PostgreSQL or Delta target table; nothing for http, exec and "
        "jsonl:-) and then its state (position and saved "
        "snapshots), so that its next run starts afresh. It is refused while a live replica "
        "of the group its state names holds the stream (unless --force). On a file sink "
        "(jsonl, parquet) it refuses while the stream runs (the stream holds the output's "
        "lock); a Delta or PostgreSQL target has no such lock: the reset goes ahead, and a "
        "stream still running on it stops at its next delivery, committing nothing. It "
        "records itself in the state directory first: a reset cut short blocks the stream "
        "until it is run again.",
    )
    reset.add_argument("--state", required=True, help="the stream's state directory")
    reset.add_argument("--sink", required=True, help="the stream's sink, as given to tail")
    reset.add_argument("--name", required=True, help="the stream's name")
    reset.add_argument(
        "--sink-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="store setting for a delta sink's target in an object store, as given to tail; "
        "may repeat",
    )
    reset.add_argument(
        "--force",
        action="store_true",
        help="reset even while a live replica of the stream's group runs it (that replica "
        "starts the stream over at its next commit; what it delivers until then is "
        "delivered again)",
    )
    reset.add_argument(
        "--state-storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="object store setting for the state directory",
    )

    serve = sub.add_parser("serve", help="follow the tables of a TOML configuration file")
    serve.add_argument("--config", required=True, metavar="FILE.toml", help="the configuration")
    serve.add_argument(
        "--http",
        default=None,
        metavar="HOST:PORT",
        help="override [server] http (default 127.0.0.1:9464; '' turns it off)",
    )
    _add_available_now_arg(serve)
    _add_daemon_args(serve, defaults=False)

    demo = sub.add_parser(
        "demo", help="create a local table, keep writing to it, and tail it (Ctrl-C stops)"
    )
    demo.add_argument(
        "--path",
        default="deltastream-demo",
        help="the demo's directory: its table/ and state/ are replaced on each run; a "
        "non-empty directory the demo did not create is refused",
    )
    demo.add_argument(
        "--force",
        action="store_true",
        help="use --path even though the demo did not create it (it still deletes nothing "
        "it did not create)",
    )
    demo.add_argument("--duration", type=float, help="stop after this many seconds")
    demo.add_argument(
        "--interval", type=float, default=1.0, help="seconds between the writer's commits"
    )
    for command in sub.choices.values():
        _add_logging_args(command, top=False)
    return parser


def _add_available_now_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--available-now",
        action="store_true",
        help="deliver what each table holds up to its latest version when the run starts, "
        "exactly once, then exit 0 (for cron, Airflow, CronJobs); the next run goes on from "
        "there. A stream a running replica holds is refused (exit 2)",
    )


def _add_daemon_args(p: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    p.add_argument(
        "--log-format",
        choices=list(LOG_FORMATS),
        default="text" if defaults else None,
        help="log lines as text or JSON (default: text)",
    )
    p.add_argument(
        "--log-summary-every",
        dest="log_summary_interval",
        type=float,
        default=LOG_SUMMARY_INTERVAL if defaults else None,
        metavar="SECONDS",
        help=f"log each stream's versions and rows delivered every SECONDS (default "
        f"{LOG_SUMMARY_INTERVAL:g}; 0: never)",
    )
    p.add_argument(
        "--progress",
        choices=list(PROGRESS_MODES),
        default="auto",
        help="a progress bar on stderr while catching up, with text logs only (auto: when "
        "stderr is a terminal; always: even when not; refused with JSON logs)",
    )


def _file_json(f: AddFile) -> dict[str, Any]:
    return {
        "path": f.path,
        "size": f.size,
        "partitionValues": dict(f.partition_values),
        "modificationTime": f.modification_time,
        "deletionVector": None if f.deletion_vector is None else f.deletion_vector.to_json(),
    }


async def _load(args: argparse.Namespace) -> Snapshot:
    async with Table(args.uri, _storage_options(args.storage_option)) as table:
        return await table.snapshot(
            args.version,
            timestamp=args.timestamp,
            validate_checksum=getattr(args, "validate_checksum", False),
        )


def _print_files(snapshot: Snapshot, out: TextIO) -> None:
    for f in snapshot.iter_files():
        out.write(json.dumps(_file_json(f)) + "\n")


async def _load_path(uri: str) -> Snapshot:
    async with Table(uri) as table:
        return await table.snapshot(validate_checksum=True)


def run(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status instead of exiting (for tests and embedding)."""
    out = out or sys.stdout
    parser = _build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level="DEBUG" if args.verbose else (args.log_level or "warning").upper(),
        format="deltastream: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    for handler in logging.getLogger().handlers:
        # -v shows botocore's request dumps: never with the credentials in them.
        handler.addFilter(Redactor())
    try:
        if args.command == "snapshot":
            out.write(json.dumps(anyio.run(_load, args).summary()) + "\n")
        elif args.command == "files":
            _print_files(anyio.run(_load, args), out)
        elif args.command == "read":
            _check_output(args.output)
            reader = read_rows(
                args.uri,
                version=args.version,
                timestamp=args.timestamp,
                columns=_columns(args.columns),
                where=args.where,
                row_ids=args.row_ids,
                storage_options=_storage_options(args.storage_option),
                allow_external_paths=_external_paths(args),
            )
            _write(reader, args.output, out)
        elif args.command == "changes":
            _check_output(args.output)
            reader = read_changes(
                args.uri,
                start_version=args.start,
                end_version=args.end,
                start_timestamp=args.from_timestamp,
                end_timestamp=args.to_timestamp,
                columns=_columns(args.columns),
                infer_without_cdf=args.infer_without_cdf,
                allow_empty_range=args.allow_empty_range,
                where=args.where,
                row_ids=args.row_ids,
                storage_options=_storage_options(args.storage_option),
                allow_external_paths=_external_paths(args),
            )
            _write(reader, args.output, out)
        elif args.command == "reset":
            sink = parse_sink(
                args.sink, table=args.name, sink_options=_storage_options(args.sink_option)
            )
            removed = anyio.run(
                _reset,
                args.name,
                sink,
                args.state,
                _storage_options(args.state_storage_option),
                args.force,
            )
            out.write(json.dumps({"stream": args.name, "removed": removed}) + "\n")
        elif args.command in ("tail", "serve", "demo"):
            return _run_daemon(args, out)
    except DeltaStreamError as e:
        return _report(e)
    except BaseExceptionGroup as group:
        # anyio's task groups wrap what their tasks raise (the HTTP server failing to bind,
        # the demo): one error inside is reported as if it had been raised alone.
        error = _sole_error(group)
        if isinstance(error, DeltaStreamError):
            return _report(error)
        if isinstance(error, KeyboardInterrupt):
            return 130
        if isinstance(error, BrokenPipeError):
            return EXIT_CLOSED_PIPE
        raise
    except BrokenPipeError:  # the reader of the JSON on stdout went away (| head)
        return EXIT_CLOSED_PIPE
    except KeyboardInterrupt:
        return 130
    return 0


async def _reset(
    name: str, sink: Sink, state: str, options: dict[str, str], force: bool
) -> list[str]:
    """``deltastream reset``: under the stream's lease in the replica group its state names
    (refused, naming the holder, while a live replica holds it, unless ``force``)."""
    group = await recorded_group(state, options)
    if group is None:
        return await reset_stream(name, sink, state, options)
    try:
        return await holding(group, name, lambda: reset_stream(name, sink, state, options))
    except StreamHeldError as e:
        if not force:
            raise
        logging.getLogger("deltastream").warning("%s; resetting it anyway (--force)", e)
    return await reset_stream(name, sink, state, options)


def _report(error: DeltaStreamError) -> int:
    """Print ``error`` as the one line the user sees; the exit status."""
    if isinstance(error, OutputClosedError):
        return EXIT_CLOSED_PIPE  # stdout's reader went away: no one to tell, nothing wrong
    print(f"deltastream: error: {error}", file=sys.stderr)
    return EXIT_ERROR


def _sole_error(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception in ``group``, through nested groups; ``None`` if there are more."""
    if len(group.exceptions) != 1:
        return None
    (error,) = group.exceptions
    return _sole_error(error) if isinstance(error, BaseExceptionGroup) else error


def _tail_config(args: argparse.Namespace) -> ServiceConfig:
    name = args.name or default_stream_name(args.uri)
    tail = tail_config(name, args.uri, args.state, cli_options(args))
    parse_sink(args.sink, table=name, stream=tail)  # a wrong spec fails now, once
    if args.http:
        parse_address(args.http, "--http")
    config = single_stream(tail, args.sink, http_address=args.http or None)
    return replace(
        config,
        log_format=args.log_format,
        log_level=args.log_level or "info",
        log_summary_interval=args.log_summary_interval,
        available_now=args.available_now,
    )


def _serve_config(args: argparse.Namespace) -> ServiceConfig:
    config = load_config(args.config)
    if args.http is not None:
        if args.http:
            parse_address(args.http, "--http")
        config = replace(config, http_address=args.http or None)
    if args.log_format is not None:
        config = replace(config, log_format=args.log_format)
    if args.log_level is not None:
        config = replace(config, log_level=args.log_level)
    if args.log_summary_interval is not None:
        config = replace(config, log_summary_interval=args.log_summary_interval)
    if args.available_now:
        config = replace(config, available_now=True)
    return config


def _run_daemon(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``tail``, ``serve`` or ``demo`` until done or signalled; the exit status."""
    if args.command == "demo":
        logging.getLogger("deltastream").setLevel(logging.WARNING)
        stop = anyio.Event()

        async def demo() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_stop_on_signals, stop.set, tg.cancel_scope)
                await run_demo(
                    Path(args.path),
                    out,
                    duration=args.duration,
                    interval=args.interval,
                    stop=stop,
                    force=args.force,
                )
                tg.cancel_scope.cancel()

        anyio.run(demo)
        return 0
    config = _tail_config(args) if args.command == "tail" else _serve_config(args)
    # Decided before anything runs: --progress always with JSON logs is an error.
    bar = progress_bar(args.progress, config.log_format, sys.stderr)
    configure_logging(
        config.log_format,
        "debug" if args.verbose else config.log_level,
        stream=bar.log_stream if bar is not None else None,
    )
    # An unusable state or sink location, or an HTTP address that cannot be bound, is an
    # error now (exit 2), not a stream retrying for ever.
    check_service(config)
    if args.command == "tail":
        # A stream a replica group runs: take its lease there (refused, naming the holder,
        # while a replica runs it), as the group's only writer of it while this runs; a
        # --reset happens under that lease, after the refusal (the service resets it).
        tail = config.streams[0].tail
        group = anyio.run(recorded_group, tail.state, tail.resolved_state_options)
        if group is not None:
            config = replace(config, group=group, exclusive=True)
    # A stream's failure is printed once. tail prints it as its error line when it ends, so
    # its log does not repeat it, except as the structured record of JSON logs (for the
    # machines that read them: error_class, stream, uri). serve logs it when it happens,
    # since its other streams go on.
    service = Service(
        config,
        progress=bar,
        log_failures=args.command == "serve" or config.log_format == "json",
        settle_heap=True,  # the process is the daemon's own
        reset=args.command == "tail" and args.reset,
    )

    def stop_service() -> None:
        sd_notify.notify("STOPPING=1")
        service.stop()

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_signals, stop_service, tg.cancel_scope)
            # Under systemd (Type=notify, WatchdogSec=): pings from this event loop.
            tg.start_soon(sd_notify.watchdog)

            async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                await service.run(task_status=task_status)
                tg.cancel_scope.cancel()

            await tg.start(run)
            sd_notify.notify("READY=1")

    try:
        anyio.run(main)
    finally:
        if bar is not None:
            bar.close()
    failures = list(service.failures.values())
    if failures and all(isinstance(e, OutputClosedError) for e in failures):
        return EXIT_CLOSED_PIPE  # jsonl:- into a reader that went away
    if failures and (args.command == "tail" or not service.stopping):
        # One line per error: a run refused as a whole fails each stream with one error.
        for message in dict.fromkeys(str(error) for error in failures):
            print(f"deltastream: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    return 0


async def _stop_on_signals(stop: Callable[[], None], scope: anyio.CancelScope) -> None:
    """The first SIGTERM/SIGINT asks for a clean stop; a second one cancels everything."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        count = 0
        async for signum in signals:
            count += 1
            if count == 1:
                logging.getLogger("deltastream").info(
                    "%s received: stopping", signal.Signals(signum).name
                )
                stop()
            else:
                scope.cancel()


def main(argv: Sequence[str] | None = None) -> None:
    use_fast_allocator()
    keep_pandas_out_of_pyarrow(alone=True)  # the program runs deltastream alone: ~0.4 s, 35 MiB
    try:
        status = run(argv)
        sys.stdout.flush()  # a reader gone after the last write shows here
    except BrokenPipeError:
        status = EXIT_CLOSED_PIPE
    if status == EXIT_CLOSED_PIPE:
        _silence_stdout()
    sys.exit(status)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what is still
    buffered for a closed pipe fails silently (the recipe of Python's ``signal`` docs)."""
    with contextlib.suppress(OSError, ValueError):  # no file descriptor (embedded)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


if __name__ == "__main__":
    main()
