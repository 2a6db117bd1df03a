"""Reads stay under the table root: a log whose actions name a data, change-data or
deletion-vector file elsewhere (an absolute path, ``../``, another bucket) is refused with
:class:`~deltastream.errors.UnsafePathError` by ``read``, ``changes``, ``tail`` and Spark,
naming the log file or snapshot, the version, the path and the option; the option lets
everything, or only the roots given, through."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import S3Bucket
from hostile_tables import hostile_table

import deltastream as ds
from deltastream.cli import run
from deltastream.daemon.sinks import parse_sink
from deltastream.daemon.stream.tailer import Mode, StartFrom, TailConfig, Tailer


def ids(reader: pa.RecordBatchReader) -> list[int]:
    return sorted(reader.read_all().column("id").to_pylist())


def test_read_refuses_a_file_outside_the_table(tmp_path: Path) -> None:
    table, outside = hostile_table(tmp_path)
    with pytest.raises(ds.UnsafePathError) as info:
        ds.read_rows(table).read_all()
    message = str(info.value)
    assert info.value.path == str(outside) and info.value.version == 1
    assert "_delta_log" in message and "--allow-external-paths" in message


@pytest.mark.parametrize(
    "path", ["../outside/secret.parquet", "%2E%2E/outside/secret.parquet", "a/../../outside/x"]
)
def test_relative_paths_leading_out_are_refused(tmp_path: Path, path: str) -> None:
    table, _ = hostile_table(tmp_path, path)
    with pytest.raises(ds.UnsafePathError, match="outside the table"):
        ds.read_rows(table).read_all()


def test_changes_refuse_it_naming_the_commit(tmp_path: Path) -> None:
    table, outside = hostile_table(tmp_path)
    with pytest.raises(ds.UnsafePathError) as info:
        ds.read_changes(table, start_version=0).read_all()
    assert info.value.source.endswith(f"_delta_log/{1:020d}.json")
    assert info.value.version == 1 and info.value.path == str(outside)


def test_allowed_everywhere_or_under_the_roots_given(tmp_path: Path) -> None:
    table, outside = hostile_table(tmp_path)
    assert ids(ds.read_rows(table, allow_external_paths=True)) == [0, 1, 2, 100, 101]
    roots = [str(outside.parent)]
    assert ids(ds.read_rows(table, allow_external_paths=roots)) == [0, 1, 2, 100, 101]
    changes = ds.read_changes(table, start_version=0, allow_external_paths=roots)
    assert ids(changes) == [0, 1, 2, 100, 101]
    with pytest.raises(ds.UnsafePathError):
        ds.read_rows(table, allow_external_paths=[str(tmp_path / "elsewhere")]).read_all()
    with pytest.raises(ds.InvalidArgumentError, match="absolute"):
        ds.read_rows(table, allow_external_paths=["relative/root"])


def test_listing_files_reads_none_and_is_not_refused(tmp_path: Path) -> None:
    table, outside = hostile_table(tmp_path)
    assert str(outside) in ds.read_snapshot(table).files.column("path").to_pylist()


def test_the_cli_prints_one_line_and_exits_2(tmp_path: Path, capsys: Any) -> None:
    table, _ = hostile_table(tmp_path)
    assert run(["read", table, "-o", "-"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("deltastream: error: ")
    assert "outside the table" in err[0] and "--allow-external-paths" in err[0]
    assert run(["changes", table, "--allow-external-paths", "-o", "-"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["id"] for r in rows) == [0, 1, 2, 100, 101]


@pytest.mark.anyio
async def test_a_tailer_stops_on_it_for_good(tmp_path: Path) -> None:
    table, outside = hostile_table(tmp_path)
    config = TailConfig(
        name="t",
        uri=table,
        state=str(tmp_path / "state"),
        mode=Mode.FOLLOW,
        start=StartFrom(version=0),
        notifications=False,
    )
    async with parse_sink(f"jsonl:{tmp_path / 'out.jsonl'}", table="t") as sink:
        tailer = Tailer(config, sink)
        with pytest.raises(ds.UnsafePathError) as info, anyio.fail_after(30):
            await tailer.run()
    assert not ds.is_transient(info.value) and info.value.version == 1
    # Version 0 was delivered and committed before the stream stopped at version 1.
    assert tailer.position == ds.Position(1)
    allowed = TailConfig(**{**config.__dict__, "allow_external_paths": [str(outside.parent)]})
    assert allowed.allow_external_paths.roots == (str(outside.parent),)


def test_a_stream_config_takes_the_option_from_toml(tmp_path: Path) -> None:
    config = tmp_path / "ds.toml"
    config.write_text(
        "[[tables]]\nname = 'a'\nuri = '/t'\nstate = '/s'\nsink = 'jsonl:/o.jsonl'\n"
        "allow_external_paths = ['s3://shared/src']\n"
    )
    (stream,) = ds.load_config(str(config)).streams
    assert stream.tail.allow_external_paths.roots == ("s3://shared/src",)


@pytest.mark.anyio
async def test_s3_refuses_another_bucket_unless_allowed(s3_bucket: S3Bucket) -> None:
    client = s3_bucket.server.client()
    other = f"{s3_bucket.name}-other"
    client.create_bucket(Bucket=other)
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": [100]}), sink)
    data = sink.getvalue().to_pybytes()
    client.put_object(Bucket=other, Key="x/secret.parquet", Body=data)
    log = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": "t",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(
                    {
                        "type": "struct",
                        "fields": [
                            {"name": "id", "type": "long", "nullable": True, "metadata": {}}
                        ],
                    }
                ),
                "partitionColumns": [],
                "configuration": {},
            }
        },
        {
            "add": {
                "path": f"s3://{other}/x/secret.parquet",
                "partitionValues": {},
                "size": len(data),
                "modificationTime": 0,
                "dataChange": True,
            }
        },
    ]
    s3_bucket.put(
        "t/_delta_log/00000000000000000000.json", "\n".join(map(json.dumps, log)).encode()
    )
    uri, options = s3_bucket.uri("t"), s3_bucket.storage_options
    with pytest.raises(ds.UnsafePathError, match=f"s3://{other}/x/secret.parquet"):
        ds.read_rows(uri, storage_options=options).read_all()
    allowed = ds.read_rows(uri, storage_options=options, allow_external_paths=[f"s3://{other}/x"])
    assert ids(allowed) == [100]
