"""The ``deltastream`` command line.

Every subcommand prints JSON to stdout. Any error deltastream recognises is printed as one
line on stderr (``deltastream: error: …``) with exit status 2; warnings (e.g. a corrupt
``_last_checkpoint`` that was worked around) go to stderr too.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import anyio
import pyarrow as pa

from deltastream.changes.api import read_changes, read_rows
from deltastream.errors import DeltaStreamError, InvalidArgumentError
from deltastream.log.actions import AddFile
from deltastream.output import write_json_lines, write_parquet
from deltastream.runtime import use_fast_allocator
from deltastream.snapshot.snapshot import Snapshot
from deltastream.snapshot.table import Table

__all__ = ["main"]

EXIT_ERROR = 2


def _storage_options(pairs: Sequence[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidArgumentError(f"--storage-option expects KEY=VALUE, got {pair!r}")
        options[key] = value
    return options


def _add_table_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("uri", help="table location: a local path or s3://bucket/prefix")
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="S3 setting (endpoint_url, region, access_key_id, …); may repeat",
    )


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


def _write(reader: pa.RecordBatchReader, output: str, out: TextIO) -> None:
    if output == "-":
        write_json_lines(reader, out)
        return
    if not output.endswith(".parquet"):
        raise InvalidArgumentError(f"output must be a .parquet file or -, not {output!r}")
    rows = write_parquet(reader.schema, reader, output)
    out.write(json.dumps({"output": output, "rows": rows}) + "\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deltastream", description="Follow a Delta Lake table as it changes."
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log debug information to stderr"
    )
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
    _add_output_arg(changes)

    demo = sub.add_parser("demo", help="create a small local table and show its snapshot")
    demo.add_argument(
        "--path", default="deltastream-demo", help="where to create the demo table (replaced)"
    )
    return parser


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


def _demo(path: str, out: TextIO) -> None:
    try:
        from deltalake import DeltaTable, write_deltalake
    except ImportError as e:
        raise InvalidArgumentError(
            f"the demo writes its table with the 'deltalake' package ({e}); "
            "install it with: pip install 'deltastream[demo]'"
        ) from e
    import pyarrow as pa

    root = Path(path).absolute() / "table"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    config = {"delta.enableChangeDataFeed": "true"}
    for start in range(0, 30, 10):
        batch = pa.table(
            {
                "id": pa.array(range(start, start + 10), pa.int64()),
                "country": pa.array(["NL", "FR", "JP", "BR", "NL"] * 2),
                "amount": pa.array([float(i) * 1.5 for i in range(start, start + 10)]),
            }
        )
        write_deltalake(
            str(root), batch, mode="append", partition_by=["country"], configuration=config
        )
    table = DeltaTable(str(root))
    table.delete("id % 7 = 0")
    table.update(predicate="country = 'JP'", updates={"amount": "amount * 2"})
    table.create_checkpoint()
    snapshot = anyio.run(_load_path, str(root))
    out.write(json.dumps(snapshot.summary(), indent=2) + "\n")
    _print_files(snapshot, out)


async def _load_path(uri: str) -> Snapshot:
    async with Table(uri) as table:
        return await table.snapshot(validate_checksum=True)


def run(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status instead of exiting (for tests and embedding)."""
    out = out or sys.stdout
    parser = _build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="deltastream: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.command == "snapshot":
            out.write(json.dumps(anyio.run(_load, args).summary()) + "\n")
        elif args.command == "files":
            _print_files(anyio.run(_load, args), out)
        elif args.command == "read":
            reader = read_rows(
                args.uri,
                version=args.version,
                timestamp=args.timestamp,
                columns=_columns(args.columns),
                where=args.where,
                storage_options=_storage_options(args.storage_option),
            )
            _write(reader, args.output, out)
        elif args.command == "changes":
            reader = read_changes(
                args.uri,
                start_version=args.start,
                end_version=args.end,
                start_timestamp=args.from_timestamp,
                end_timestamp=args.to_timestamp,
                columns=_columns(args.columns),
                infer_without_cdf=args.infer_without_cdf,
                allow_empty_range=args.allow_empty_range,
                storage_options=_storage_options(args.storage_option),
            )
            _write(reader, args.output, out)
        elif args.command == "demo":
            _demo(args.path, out)
    except DeltaStreamError as e:
        print(f"deltastream: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    use_fast_allocator()
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
