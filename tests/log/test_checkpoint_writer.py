"""Writing classic checkpoints (PROTOCOL.md "Checkpoints", "Checkpoint Schema"): the state
round-trips through deltastream's checkpoint reader, for synthetic states and for every
corpus table, and delta-rs reads tables whose log starts at a checkpoint we wrote."""

from __future__ import annotations

import functools
import io
import json
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import anyio
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from corpus import CorpusTable, corpora_cases
from deltalake import DeltaTable, write_deltalake

import deltastream as ds
from deltastream.log.actions import (
    ADD_TYPE,
    DV_TYPE,
    REMOVE_TYPE,
    STRING_MAP,
    DomainMetadata,
    Format,
    Metadata,
    Protocol,
    Txn,
)
from deltastream.log.checkpoint import parse_checkpoint_parquet
from deltastream.log.checkpoint_writer import (
    CHECKPOINT_REMOVE_TYPE,
    CHECKPOINT_SCHEMA,
    CheckpointInfo,
    write_checkpoint,
    write_checkpoint_to,
)
from deltastream.log.commit import LogActions
from deltastream.snapshot.loader import load_table_state
from deltastream.snapshot.reconcile import LogState
from deltastream.storage import open_store

FILES_SCHEMA = pa.schema([pa.field(f.name, f.type) for f in ADD_TYPE])
TOMBSTONES_SCHEMA = pa.schema([pa.field(f.name, f.type) for f in REMOVE_TYPE])


CORPORA_CASES = corpora_cases()
ORACLE_PATHS = frozenset(t.path for t in CORPORA_CASES.ORACLE)


# ---------------------------------------------------------------------------------------
# helpers


def load_state(location: str) -> LogState:
    return load_latest(location)[0]


def load_latest(location: str) -> tuple[LogState, int]:
    """The latest reconciled state (files and tombstones included) and its version."""
    load = functools.partial(load_table_state, open_store(location), None, files=True)
    state, segment = anyio.run(load)
    return state, segment.version


def checkpoint_of(state: LogState, **kwargs: Any) -> bytes:
    assert state.protocol is not None and state.metadata is not None
    return write_checkpoint(
        protocol=state.protocol,
        metadata=state.metadata,
        txns=state.txns.values(),
        domains=state.domains.values(),
        files=state.files,
        tombstones=state.tombstones,
        **kwargs,
    )


def struct_rows(column: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pc.drop_null(column).to_pylist(maps_as_pydicts="strict")
    return rows


def sorted_rows(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


def as_checkpointed(table: pa.Table, *, remove: bool) -> list[str]:
    """A state table's rows as a checkpoint holds them: ``dataChange=false``, and removes
    without ``stats`` and ``tags``."""
    rows = table.to_pylist(maps_as_pydicts="strict")
    for r in rows:
        r["dataChange"] = False
        if remove:
            r["stats"] = r["tags"] = None
    return sorted_rows(rows)


def assert_round_trip(
    parsed: LogActions,
    *,
    protocol: Protocol,
    metadata: Metadata,
    txns: Iterable[Txn],
    domains: Iterable[DomainMetadata],
    files: pa.Table,
    tombstones: pa.Table,
) -> None:
    assert parsed.protocol == protocol
    assert parsed.metadata == metadata
    assert sorted(parsed.txns, key=lambda t: t.app_id) == sorted(txns, key=lambda t: t.app_id)
    assert sorted(parsed.domain_metadata, key=lambda d: d.domain) == sorted(
        domains, key=lambda d: d.domain
    )
    actions = parsed.file_actions
    assert sorted_rows(struct_rows(actions.column("add"))) == as_checkpointed(files, remove=False)
    assert sorted_rows(struct_rows(actions.column("remove"))) == as_checkpointed(
        tombstones, remove=True
    )
    assert parsed.sidecars == () and parsed.checkpoint_metadata is None


def one_action_per_row(table: pa.Table) -> list[str]:
    """The name of the one non-null column of each row (fails if a row has none or two)."""
    names: list[str] = []
    valid = {name: table.column(name).is_valid().to_pylist() for name in table.column_names}
    for i in range(table.num_rows):
        present = [name for name in table.column_names if valid[name][i]]
        assert len(present) == 1, f"row {i} holds {present}"
        names.append(present[0])
    return names


# ---------------------------------------------------------------------------------------
# synthetic states

SCHEMA_STRING = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "part", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
)
PROTOCOL = Protocol(
    3,
    7,
    reader_features=("deletionVectors", "v2Checkpoint"),
    writer_features=("deletionVectors", "domainMetadata", "rowTracking", "v2Checkpoint"),
)
METADATA = Metadata(
    id="5fba94ed-9794-4965-ba6e-6ee3c0d22af9",
    schema_string=SCHEMA_STRING,
    partition_columns=("part",),
    configuration=MappingProxyType(
        {"delta.enableDeletionVectors": "true", "delta.enableRowTracking": "true"}
    ),
    format=Format("parquet", MappingProxyType({"compression": "zstd"})),
    name="events",
    description="a table, with a description",
    created_time=1_700_000_000_123,
)
TXNS = (Txn("app-1", 4), Txn("app-2", 9, last_updated=1_700_000_001_000))
DOMAINS = (
    DomainMetadata("delta.rowTracking", '{"rowIdHighWaterMark":41}'),
    DomainMetadata("my.domain", '{"k":"v"}'),
    DomainMetadata("gone.domain", "", removed=True),
)
INLINE_DV = {
    "storageType": "i",
    "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f",
    "offset": None,
    "sizeInBytes": 20,
    "cardinality": 2,
    "maxRowIndex": None,
}
PATH_DV = {
    "storageType": "u",
    "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
    "offset": 4,
    "sizeInBytes": 40,
    "cardinality": 6,
    "maxRowIndex": 99,
}


def add_row(path: str, part: str | None, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "path": path,
        "partitionValues": {"part": part},
        "size": 1000,
        "modificationTime": 1_700_000_000_000,
        "dataChange": True,
        "stats": None,
        "tags": None,
        "deletionVector": None,
        "baseRowId": None,
        "defaultRowCommitVersion": None,
        "clusteringProvider": None,
    }
    row.update(fields)
    return row


def remove_row(path: str, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "path": path,
        "deletionTimestamp": 1_700_000_002_000,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": {"part": "a"},
        "size": 10,
        "stats": '{"numRecords":3}',
        "tags": {"t": "1"},
        "deletionVector": None,
        "baseRowId": None,
        "defaultRowCommitVersion": None,
    }
    row.update(fields)
    return row


FILES = pa.Table.from_pylist(
    [
        add_row(
            "part=a/f1.parquet",
            "a",
            stats='{"numRecords":10,"minValues":{"id":1},"maxValues":{"id":10}}',
            tags={"INSERTION_TIME": "1700000000000000", "ZCUBE_ID": "z1"},
            baseRowId=0,
            defaultRowCommitVersion=1,
        ),
        add_row("part=b/f2.parquet", "b", deletionVector=INLINE_DV, baseRowId=10),
        add_row(
            "part=b/f2.parquet",  # the same data file with another DV: another logical file
            "b",
            deletionVector=PATH_DV,
            baseRowId=20,
            defaultRowCommitVersion=3,
        ),
        add_row("part=__HIVE_DEFAULT_PARTITION__/f3.parquet", None, clusteringProvider="liquid"),
        add_row("part=c/f4.parquet", "c", dataChange=False, tags={}),
    ],
    schema=FILES_SCHEMA,
)
TOMBSTONES = pa.Table.from_pylist(
    [
        remove_row("part=a/f0.parquet"),
        remove_row("part=b/f2.parquet"),  # f2 without a DV: removed when the DV was added
        remove_row(
            "part=b/f5.parquet",
            deletionVector=PATH_DV,
            extendedFileMetadata=None,
            partitionValues=None,
            size=None,
            deletionTimestamp=None,
            baseRowId=5,
            defaultRowCommitVersion=2,
        ),
    ],
    schema=TOMBSTONES_SCHEMA,
)
STATE: dict[str, Any] = {
    "protocol": PROTOCOL,
    "metadata": METADATA,
    "txns": TXNS,
    "domains": DOMAINS,
    "files": FILES,
    "tombstones": TOMBSTONES,
}


def test_synthetic_state_round_trips() -> None:
    data = write_checkpoint(**STATE)
    assert_round_trip(parse_checkpoint_parquet("mem", data), **STATE)


def test_rows_are_ordered_one_action_each() -> None:
    data = write_checkpoint(**STATE, row_group_rows=3)
    pf = pq.ParquetFile(io.BytesIO(data))
    table = pf.read()
    kinds = one_action_per_row(table)
    assert kinds == (
        ["protocol", "metaData"]
        + ["txn"] * len(TXNS)
        + ["domainMetadata"] * len(DOMAINS)
        + ["add"] * FILES.num_rows
        + ["remove"] * TOMBSTONES.num_rows
    )
    n = len(kinds)
    assert pf.metadata.num_rows == n
    assert [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)] == [3] * (
        n // 3
    ) + ([n % 3] if n % 3 else [])
    # Adds and removes keep the callers' order; every file action has dataChange=false.
    assert (
        pc.struct_field(pc.drop_null(table.column("add")), "path").to_pylist()
        == FILES.column("path").to_pylist()
    )
    assert (
        pc.struct_field(pc.drop_null(table.column("remove")), "path").to_pylist()
        == TOMBSTONES.column("path").to_pylist()
    )
    for name in ("add", "remove"):
        assert set(pc.struct_field(pc.drop_null(table.column(name)), "dataChange").to_pylist()) == {
            False
        }


def test_schema_follows_the_protocol() -> None:
    data = write_checkpoint(**STATE)
    schema = pq.read_schema(io.BytesIO(data))
    assert schema.remove_metadata() == CHECKPOINT_SCHEMA
    assert schema.names == ["txn", "add", "remove", "metaData", "protocol", "domainMetadata"]
    assert schema.field("protocol").type == pa.struct(
        [
            ("minReaderVersion", pa.int32()),
            ("minWriterVersion", pa.int32()),
            ("readerFeatures", pa.list_(pa.string())),
            ("writerFeatures", pa.list_(pa.string())),
        ]
    )
    metadata = schema.field("metaData").type
    assert [f.name for f in metadata] == [
        "id",
        "name",
        "description",
        "format",
        "schemaString",
        "partitionColumns",
        "configuration",
        "createdTime",
    ]
    assert metadata.field("format").type == pa.struct(
        [("provider", pa.string()), ("options", STRING_MAP)]
    )
    assert metadata.field("configuration").type == STRING_MAP
    assert metadata.field("createdTime").type == pa.int64()
    assert schema.field("add").type == ADD_TYPE
    assert schema.field("add").type.field("deletionVector").type == DV_TYPE
    # Tombstones only serve VACUUM: no stats, no tags (PROTOCOL.md "Checkpoints").
    remove = schema.field("remove").type
    assert remove == CHECKPOINT_REMOVE_TYPE
    assert {f.name for f in REMOVE_TYPE} - {f.name for f in remove} == {"stats", "tags"}
    assert schema.field("txn").type == pa.struct(
        [("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())]
    )
    assert schema.field("domainMetadata").type == pa.struct(
        [("domain", pa.string()), ("configuration", pa.string()), ("removed", pa.bool_())]
    )
    # The parquet schema uses the standard MAP and LIST layouts.
    parquet_schema = str(pq.ParquetFile(io.BytesIO(data)).schema)
    assert "optional group partitionValues (Map)" in parquet_schema.replace("field_id=-1 ", "")
    assert "repeated group key_value" in parquet_schema.replace("field_id=-1 ", "")


def test_protocol_without_features_writes_null_features() -> None:
    """Below reader 3 / writer 7 the feature lists are null (the spec allows the fields in
    the schema only with null values)."""
    state = {**STATE, "protocol": Protocol(1, 2)}
    data = write_checkpoint(**state)
    row = struct_rows(pq.read_table(io.BytesIO(data)).column("protocol"))
    assert row == [
        {
            "minReaderVersion": 1,
            "minWriterVersion": 2,
            "readerFeatures": None,
            "writerFeatures": None,
        }
    ]
    parsed = parse_checkpoint_parquet("mem", data)
    assert parsed.protocol == Protocol(1, 2)
    writer_only = Protocol(1, 7, writer_features=("appendOnly",))
    parsed = parse_checkpoint_parquet("mem", write_checkpoint(**{**state, "protocol": writer_only}))
    assert parsed.protocol == writer_only


def test_minimal_metadata_round_trips() -> None:
    """No name, description, creation time, schema (old writers) or format options."""
    metadata = Metadata(id="m", schema_string=None, partition_columns=(), configuration={})
    state = {**STATE, "metadata": metadata, "txns": (), "domains": ()}
    parsed = parse_checkpoint_parquet("mem", write_checkpoint(**state))
    assert_round_trip(parsed, **state)


def test_chunked_inputs_and_many_row_groups() -> None:
    """Inputs in many chunks, row groups cutting across chunks and across the
    non-file/add/remove boundaries."""
    files = pa.concat_tables([FILES.slice(i, 1) for i in range(FILES.num_rows)])
    assert files.column("path").num_chunks == FILES.num_rows
    tombstones = pa.concat_tables([TOMBSTONES.slice(0, 2), TOMBSTONES.slice(2)])
    state = {**STATE, "files": files, "tombstones": tombstones}
    for rows in (1, 2, 4, 7, 1000):
        data = write_checkpoint(**state, row_group_rows=rows)
        assert_round_trip(parse_checkpoint_parquet("mem", data), **state)
        n = 2 + len(TXNS) + len(DOMAINS) + FILES.num_rows + TOMBSTONES.num_rows
        assert pq.ParquetFile(io.BytesIO(data)).metadata.num_row_groups == -(-n // rows)


def test_columns_in_another_order_or_castable_types_are_accepted() -> None:
    files = FILES.select(list(reversed(FILES.column_names)))
    files = files.set_column(
        files.column_names.index("path"), "path", files.column("path").cast(pa.large_string())
    )
    data = write_checkpoint(**{**STATE, "files": files})
    assert_round_trip(parse_checkpoint_parquet("mem", data), **STATE)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"files": FILES.drop_columns(["clusteringProvider"])}, "missing.*clusteringProvider"),
        ({"files": FILES.append_column("extra", pa.nulls(5))}, "unexpected.*extra"),
        ({"tombstones": FILES}, "tombstones must have exactly the columns"),
        ({"files": FILES.append_column("path", FILES.column("path"))}, r"repeated \['path'\]"),
        ({"files": FILES.set_column(0, "path", pa.nulls(5, pa.string()))}, "null path"),
        ({"row_group_rows": 0}, "row_group_rows must be positive"),
    ],
)
def test_bad_input_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write_checkpoint(**{**STATE, **change})


def test_streaming_variant_writes_the_same_bytes(tmp_path: Path) -> None:
    data = write_checkpoint(**STATE)
    expected = CheckpointInfo(
        num_actions=2 + len(TXNS) + len(DOMAINS) + FILES.num_rows + TOMBSTONES.num_rows,
        num_add_files=FILES.num_rows,
        size_in_bytes=len(data),
    )

    path = tmp_path / "cp.parquet"
    assert write_checkpoint_to(path, **STATE) == expected
    assert path.read_bytes() == data
    assert write_checkpoint_to(str(path), **STATE) == expected
    assert path.read_bytes() == data

    stream = io.BytesIO(b"prefix")
    stream.seek(0, io.SEEK_END)
    assert write_checkpoint_to(stream, **STATE) == expected
    assert not stream.closed and stream.getvalue() == b"prefix" + data

    native = pa.BufferOutputStream()
    assert write_checkpoint_to(native, **STATE) == expected
    assert not native.closed and native.getvalue().to_pybytes() == data
    # pyarrow's parquet writer refuses a native file that is not at its start.
    native = pa.BufferOutputStream()
    native.write(b"xyz")
    with pytest.raises(OSError, match="Appending"):
        write_checkpoint_to(native, **STATE)


def test_empty_state() -> None:
    """No files, no tombstones, no txns, no domains: just protocol and metadata."""
    state = {
        **STATE,
        "txns": (),
        "domains": (),
        "files": FILES_SCHEMA.empty_table(),
        "tombstones": TOMBSTONES_SCHEMA.empty_table(),
    }
    data = write_checkpoint(**state)
    assert one_action_per_row(pq.read_table(io.BytesIO(data))) == ["protocol", "metaData"]
    parsed = parse_checkpoint_parquet("mem", data)
    assert_round_trip(parsed, **state)
    assert parsed.file_actions.num_rows == 0


def test_files_without_tombstones() -> None:
    state = {**STATE, "tombstones": TOMBSTONES_SCHEMA.empty_table()}
    data = write_checkpoint(**state, row_group_rows=4)
    assert_round_trip(parse_checkpoint_parquet("mem", data), **state)
    assert "remove" not in one_action_per_row(pq.read_table(io.BytesIO(data)))


SPECIAL = [
    "",
    " ",
    "a=b/c",
    "100%",
    "%20",
    "naïve 東京 🦆",
    'quote " and \\ backslash',
    "line\nbreak\ttab",
    "{}[],:",
    "\x00nul",
]


def test_special_characters_in_maps_and_paths() -> None:
    files = pa.Table.from_pylist(
        [
            add_row(
                # No file can be named with a NUL byte (readers refuse such paths): it
                # stays in the map values and statistics.
                f"part={i}/file {s.replace(chr(0), '')}.parquet",
                s,
                tags={s or "empty": s, "k": None},
                stats=json.dumps({"numRecords": 1, "minValues": {"part": s}}),
            )
            for i, s in enumerate(SPECIAL)
        ]
        + [
            add_row("p%20q/%25/x%C3%A9 y.parquet", None),
            add_row("s3://bucket/absolute path/ü.parquet", "ü"),
            add_row("file:/tmp/a%20b/c d.parquet", "x"),
        ],
        schema=FILES_SCHEMA,
    )
    tombstones = pa.Table.from_pylist(
        [
            remove_row(f"removed/{s.replace(chr(0), '')}.parquet", partitionValues={"part": s})
            for s in SPECIAL
        ],
        schema=TOMBSTONES_SCHEMA,
    )
    metadata = Metadata(
        id="id with spaces ü",
        schema_string=SCHEMA_STRING,
        partition_columns=("part", "wéird col", "a.b"),
        configuration={s or "empty": s for s in SPECIAL},
        format=Format("parquet", {"k=v": "x/y", "ü": ""}),
        name="名前",
        description="multi\nline",
    )
    state = {
        **STATE,
        "metadata": metadata,
        "txns": [Txn(s or "empty", i) for i, s in enumerate(SPECIAL)],
        "domains": [DomainMetadata(f"d{i}", s) for i, s in enumerate(SPECIAL)],
        "files": files,
        "tombstones": tombstones,
    }
    data = write_checkpoint(**state, row_group_rows=5)
    assert_round_trip(parse_checkpoint_parquet("mem", data), **state)


def test_a_million_files() -> None:
    """The size check: a million adds go through Arrow only (no per-file Python objects);
    the timing is printed, not asserted."""
    n = 1_000_000
    ids = pa.array(np.arange(n))
    sid = pc.cast(ids, pa.string())
    day = pc.cast(pa.array(np.arange(n) % 365), pa.string())
    pv_offsets = pa.array(np.arange(n + 1, dtype=np.int32))
    partition_values = pa.MapArray.from_arrays(
        pv_offsets, pa.array(["date"] * n), pc.binary_join_element_wise("2024-", day, "")
    ).cast(STRING_MAP)
    files = pa.table(
        {
            "path": pc.binary_join_element_wise(
                "date=2024-", day, "/part-", sid, "-c000-8e1f3b2a.snappy.parquet", ""
            ),
            "partitionValues": partition_values,
            "size": pa.array(np.full(n, 123_456)),
            "modificationTime": pa.array(1_700_000_000_000 + np.arange(n)),
            "dataChange": pa.repeat(True, n),
            "stats": pc.binary_join_element_wise(
                '{"numRecords":',
                sid,
                ',"minValues":{"id":',
                sid,
                '},"maxValues":{"id":',
                sid,
                "}}",
                "",
            ),
            "tags": pa.nulls(n, STRING_MAP),
            "deletionVector": pa.nulls(n, DV_TYPE),
            "baseRowId": ids,
            "defaultRowCommitVersion": pa.array(np.full(n, 7)),
            "clusteringProvider": pa.nulls(n, pa.string()),
        },
        schema=FILES_SCHEMA,
    )
    start = time.perf_counter()
    data = write_checkpoint(
        protocol=Protocol(1, 2),
        metadata=Metadata("m", SCHEMA_STRING, ("date",), {}),
        files=files,
        tombstones=TOMBSTONES_SCHEMA.empty_table(),
    )
    elapsed = time.perf_counter() - start
    print(f"\n1,000,000 adds: {elapsed:.2f} s, {len(data):,} bytes")
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    assert meta.num_rows == n + 2
    assert meta.num_row_groups > 1
    parsed = parse_checkpoint_parquet("mem", data)
    adds = parsed.file_actions.column("add")
    assert parsed.file_actions.num_rows == n
    assert pc.struct_field(adds, "path").equals(files.column("path"))
    assert pc.struct_field(adds, "baseRowId").equals(files.column("baseRowId"))


# ---------------------------------------------------------------------------------------
# every corpus table


@pytest.mark.parametrize("table", CORPORA_CASES.TABLES, ids=str)
def test_corpus_state_round_trips(table: CorpusTable, tmp_path: Path) -> None:
    """Load the latest state, write its checkpoint, parse it back: the same state. Where
    delta-rs can read the table, it reads the same live files from a log holding only that
    checkpoint."""
    error = CORPORA_CASES.expected_error(table)
    if error is not None:
        with pytest.raises(error):
            load_state(str(table.location))
        return
    state, version = load_latest(str(table.location))
    assert state.protocol is not None and state.metadata is not None
    data = checkpoint_of(state, row_group_rows=7)
    assert_round_trip(
        parse_checkpoint_parquet("mem", data),
        protocol=state.protocol,
        metadata=state.metadata,
        txns=state.txns.values(),
        domains=state.domains.values(),
        files=state.files,
        tombstones=state.tombstones,
    )
    if table.path not in ORACLE_PATHS:
        return
    log = tmp_path / "_delta_log"
    log.mkdir()
    (log / f"{version:020d}.checkpoint.parquet").write_bytes(data)
    dt = DeltaTable(str(tmp_path))
    assert dt.version() == version
    files = pa.table(dt.get_add_actions(flatten=False))
    assert sorted(
        zip(
            files.column("path").to_pylist(),
            files.column("size_bytes").to_pylist(),
            files.column("modification_time").to_pylist(),
            strict=True,
        )
    ) == sorted(
        zip(
            state.files.column("path").to_pylist(),
            state.files.column("size").to_pylist(),
            state.files.column("modificationTime").to_pylist(),
            strict=True,
        )
    )
    proto = dt.protocol()
    assert (proto.min_reader_version, proto.min_writer_version) == (
        state.protocol.min_reader_version,
        state.protocol.min_writer_version,
    )
    assert set(proto.reader_features or ()) == set(state.protocol.reader_features or ())
    assert set(proto.writer_features or ()) == set(state.protocol.writer_features or ())
    md = dt.metadata()
    assert md.id == state.metadata.id
    assert list(md.partition_columns) == list(state.metadata.partition_columns)
    assert dict(md.configuration) == dict(state.metadata.configuration)


def test_every_corpus_table_is_covered() -> None:
    tables = CORPORA_CASES.TABLES
    readable = [t for t in tables if CORPORA_CASES.expected_error(t) is None]
    assert len(tables) >= 300
    assert len(readable) >= 280
    assert len(ORACLE_PATHS) >= 250


# ---------------------------------------------------------------------------------------
# tables written by delta-rs, then read from our checkpoint alone


def build_table(root: Path, partitioned: bool) -> None:
    names = ["a b", "ü/ñ", "100%", None, "x=y", "plain"]
    for i in range(4):
        ids = list(range(i * 12, i * 12 + 12))
        batch = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "name": pa.array([names[j % len(names)] for j in ids]),
                "value": pa.array([j * 1.5 for j in ids]),
            }
        )
        write_deltalake(
            str(root), batch, mode="append", partition_by=["name"] if partitioned else None
        )
    DeltaTable(str(root)).delete("id % 5 = 0")


def install_checkpoint(log: Path, data: bytes, version: int) -> None:
    (log / f"{version:020d}.checkpoint.parquet").write_bytes(data)
    size = pq.ParquetFile(io.BytesIO(data)).metadata.num_rows
    (log / "_last_checkpoint").write_text(json.dumps({"version": version, "size": size}))


def replace_log_with_checkpoint(root: Path, data: bytes, version: int, keep_last: bool) -> None:
    log = root / "_delta_log"
    install_checkpoint(log, data, version)
    for v in range(version + (0 if keep_last else 1)):
        (log / f"{v:020d}.json").unlink()


def snapshot_files(snap: ds.Snapshot) -> list[str]:
    return sorted_rows(snap.files.drop_columns(["dataChange"]).to_pylist(maps_as_pydicts="strict"))


@pytest.mark.parametrize("compression", ["snappy", "zstd"])
@pytest.mark.parametrize("keep_last", [True, False], ids=["keep-commit-N", "checkpoint-only"])
@pytest.mark.parametrize("partitioned", [False, True], ids=["flat", "partitioned"])
def test_deltalake_reads_our_checkpoint(
    tmp_path: Path, partitioned: bool, keep_last: bool, compression: Any
) -> None:
    root = tmp_path / "table"
    build_table(root, partitioned)
    before = DeltaTable(str(root))
    version = before.version()
    uris = sorted(before.file_uris())
    rows = before.to_pyarrow_table().sort_by("id")
    snap_before = ds.read_snapshot(str(root))
    assert snap_before.tombstones.num_rows > 0 and snap_before.num_files > 0

    state = load_state(str(root))
    data = checkpoint_of(state, compression=compression)
    replace_log_with_checkpoint(root, data, version, keep_last)
    checkpoint = root / "_delta_log" / f"{version:020d}.checkpoint.parquet"
    assert pq.read_table(checkpoint).schema.remove_metadata() == CHECKPOINT_SCHEMA
    assert [p.name for p in (root / "_delta_log").glob("*.json")] == (
        [f"{version:020d}.json"] if keep_last else []
    )

    after = DeltaTable(str(root))
    assert after.version() == version
    assert sorted(after.file_uris()) == uris
    assert after.to_pyarrow_table().sort_by("id").equals(rows)
    assert after.metadata().partition_columns == (["name"] if partitioned else [])

    snap = ds.read_snapshot(str(root))
    assert snap.version == version and snap.segment.checkpoint_version == version
    assert snapshot_files(snap) == snapshot_files(snap_before)
    assert sorted_rows(snap.tombstones.to_pylist(maps_as_pydicts="strict")) == as_checkpointed(
        snap_before.tombstones, remove=True
    )
    assert (snap.protocol, snap.metadata) == (snap_before.protocol, snap_before.metadata)

    # delta-rs keeps writing on top of our checkpoint, provided that commit N is still there
    # (without it, it fails with "Invalid table version").
    if not keep_last:
        return
    extra = pa.table({"id": [1000], "name": ["new"], "value": [0.5]})
    write_deltalake(str(root), extra, mode="append", partition_by=["name"] if partitioned else None)
    grown = DeltaTable(str(root))
    assert grown.version() == version + 1
    assert (
        grown.to_pyarrow_table()
        .sort_by("id")
        .equals(pa.concat_tables([rows, extra.cast(rows.schema)]).sort_by("id"))
    )
    assert ds.read_snapshot(str(root)).num_files == snap.num_files + 1


def test_deltalake_reads_our_checkpoint_of_an_empty_table(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    DeltaTable.create(str(root), schema, partition_by=["name"])
    write_deltalake(str(root), schema.empty_table(), mode="append")
    version = DeltaTable(str(root)).version()
    state = load_state(str(root))
    assert state.files.num_rows == 0 and state.tombstones.num_rows == 0
    data = checkpoint_of(state)
    assert one_action_per_row(pq.read_table(io.BytesIO(data))) == ["protocol", "metaData"]
    replace_log_with_checkpoint(root, data, version, keep_last=False)
    dt = DeltaTable(str(root))
    assert dt.version() == version
    assert dt.file_uris() == []
    assert dt.to_pyarrow_table().num_rows == 0
    assert dt.metadata().partition_columns == ["name"]
    snap = ds.read_snapshot(str(root))
    assert snap.num_files == 0 and snap.segment.checkpoint_version == version


_GOLDEN = "delta/connectors/golden-tables/src/main/resources/golden"


@pytest.mark.parametrize(
    "path",
    [
        f"{_GOLDEN}/data-reader-escaped-chars",
        f"{_GOLDEN}/hive/deltatbl-special-chars-in-partition-column",
        "delta-rs/crates/test/tests/data/delta-0.8.0-special-partition",
        # delta-rs does not read rows of tables with deletion vectors: only files are compared.
        "delta/spark/src/test/resources/delta/table-with-dv-special-char",
    ],
)
def test_copied_corpus_table_with_special_paths(tmp_path: Path, path: str) -> None:
    """Tables with escaped characters in their file and DV paths, their whole log replaced
    by our checkpoint: delta-rs and deltastream still read the same files and rows."""
    root = tmp_path / "t"
    shutil.copytree(CORPORA_CASES.CORPORA_ROOT / path, root)
    before = DeltaTable(str(root))
    version = before.version()
    uris = sorted(before.file_uris())
    has_dvs = "deletionVectors" in (before.protocol().reader_features or ())
    expected = None if has_dvs else before.to_pyarrow_table()
    snap_before = ds.read_snapshot(str(root))
    assert any("%" in p or "&" in p for p in snapshot_paths(snap_before))
    data = checkpoint_of(load_state(str(root)))
    log = root / "_delta_log"
    for f in log.iterdir():
        f.unlink()
    install_checkpoint(log, data, version)
    after = DeltaTable(str(root))
    assert sorted(after.file_uris()) == uris
    if expected is not None:
        actual = after.to_pyarrow_table()
        key = [(k, "ascending") for k in actual.column_names]
        assert actual.sort_by(key).equals(expected.sort_by(key))
    snap = ds.read_snapshot(str(root))
    assert snap.segment.checkpoint_version == version
    assert snapshot_files(snap) == snapshot_files(snap_before)


def snapshot_paths(snap: ds.Snapshot) -> list[str]:
    paths = snap.files.column("path").to_pylist()
    dvs = snap.files.column("deletionVector").to_pylist()
    return paths + [dv["pathOrInlineDv"] for dv in dvs if dv is not None]
