"""Hand-written Delta logs for tests that need exact (often broken) log contents.

Real tables come from the corpora or from ``deltalake``; this writes raw ``_delta_log``
files so that tests can produce the precise defects they are about: a truncated line, a
missing checkpoint part, a stale ``_last_checkpoint`` and so on.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from deltastream.log.actions import ADD_TYPE, REMOVE_TYPE, STRING_MAP
from deltastream.log.last_checkpoint import json_checksum

SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "part", "type": "string", "nullable": True, "metadata": {}},
    ],
}

PROTOCOL_TYPE = pa.struct(
    [
        ("minReaderVersion", pa.int32()),
        ("minWriterVersion", pa.int32()),
        ("readerFeatures", pa.list_(pa.string())),
        ("writerFeatures", pa.list_(pa.string())),
    ]
)
METADATA_TYPE = pa.struct(
    [
        ("id", pa.string()),
        ("name", pa.string()),
        ("description", pa.string()),
        ("format", pa.struct([("provider", pa.string()), ("options", STRING_MAP)])),
        ("schemaString", pa.string()),
        ("partitionColumns", pa.list_(pa.string())),
        ("createdTime", pa.int64()),
        ("configuration", STRING_MAP),
    ]
)
TXN_TYPE = pa.struct([("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())])
DOMAIN_TYPE = pa.struct(
    [("domain", pa.string()), ("configuration", pa.string()), ("removed", pa.bool_())]
)
CHECKPOINT_SCHEMA = pa.schema(
    [
        ("txn", TXN_TYPE),
        ("add", ADD_TYPE),
        ("remove", REMOVE_TYPE),
        ("metaData", METADATA_TYPE),
        ("protocol", PROTOCOL_TYPE),
        ("domainMetadata", DOMAIN_TYPE),
    ]
)


def protocol(
    reader: int = 1,
    writer: int = 2,
    reader_features: Sequence[str] | None = None,
    writer_features: Sequence[str] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"minReaderVersion": reader, "minWriterVersion": writer}
    if reader_features is not None:
        body["readerFeatures"] = list(reader_features)
    if writer_features is not None:
        body["writerFeatures"] = list(writer_features)
    return {"protocol": body}


def metadata(
    table_id: str = "00000000-0000-0000-0000-000000000001",
    configuration: dict[str, str] | None = None,
    partition_columns: Sequence[str] = ("part",),
) -> dict[str, Any]:
    return {
        "metaData": {
            "id": table_id,
            "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps(SCHEMA),
            "partitionColumns": list(partition_columns),
            "configuration": configuration or {},
            "createdTime": 1700000000000,
        }
    }


def add(
    path: str,
    size: int = 100,
    part: str | None = "a",
    dv: dict[str, Any] | None = None,
    data_change: bool = True,
    stats: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "path": path,
        "partitionValues": {"part": part},
        "size": size,
        "modificationTime": 1700000000000,
        "dataChange": data_change,
    }
    if dv is not None:
        body["deletionVector"] = dv
    if stats is not None:
        body["stats"] = stats
    return {"add": body}


def remove(path: str, dv: dict[str, Any] | None = None, data_change: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "path": path,
        "deletionTimestamp": 1700000000001,
        "dataChange": data_change,
    }
    if dv is not None:
        body["deletionVector"] = dv
    return {"remove": body}


def txn(app_id: str, version: int) -> dict[str, Any]:
    return {"txn": {"appId": app_id, "version": version}}


def commit_info(ict: int | None = None, timestamp: int = 1700000000000) -> dict[str, Any]:
    body: dict[str, Any] = {"timestamp": timestamp, "operation": "WRITE"}
    if ict is not None:
        body["inCommitTimestamp"] = ict
    return {"commitInfo": body}


def inline_dv(
    data: str = "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L", cardinality: int = 6
) -> dict[str, Any]:
    return {
        "storageType": "i",
        "pathOrInlineDv": data,
        "sizeInBytes": 40,
        "cardinality": cardinality,
    }


class LogWriter:
    """Writes commits, checkpoints and ``_last_checkpoint`` under ``root/_delta_log``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = root / "_delta_log"
        self.log.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.log / name

    def commit(self, version: int, *actions: dict[str, Any], mtime_ms: int | None = None) -> Path:
        p = self.log / f"{version:020d}.json"
        p.write_text("".join(json.dumps(a) + "\n" for a in actions))
        if mtime_ms is not None:
            os.utime(p, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
        return p

    def raw(self, name: str, data: bytes) -> Path:
        p = self.log / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        return p

    def checkpoint(
        self, version: int, actions: Iterable[dict[str, Any]], parts: int = 1
    ) -> list[Path]:
        """A V1 checkpoint of ``actions`` (split round-robin over ``parts`` files)."""
        rows = [self._row(a) for a in actions]
        out: list[Path] = []
        for i in range(parts):
            chunk = rows[i::parts]
            table = pa.Table.from_pylist(chunk, schema=CHECKPOINT_SCHEMA)
            name = (
                f"{version:020d}.checkpoint.parquet"
                if parts == 1
                else f"{version:020d}.checkpoint.{i + 1:010d}.{parts:010d}.parquet"
            )
            pq.write_table(table, self.log / name)
            out.append(self.log / name)
        return out

    def v2_checkpoint(
        self, version: int, actions: Iterable[dict[str, Any]], sidecars: int = 1
    ) -> Path:
        """A UUID-named JSON V2 checkpoint whose file actions live in ``sidecars`` sidecar files."""
        actions = list(actions)
        file_rows = [self._row(a) for a in actions if "add" in a or "remove" in a]
        lines: list[dict[str, Any]] = [{"checkpointMetadata": {"version": version}}]
        lines += [a for a in actions if "add" not in a and "remove" not in a]
        side_schema = pa.schema([("add", ADD_TYPE), ("remove", REMOVE_TYPE)])
        for i in range(sidecars):
            name = f"{uuid.uuid4()}.parquet"
            chunk = [
                {"add": r.get("add"), "remove": r.get("remove")} for r in file_rows[i::sidecars]
            ]
            (self.log / "_sidecars").mkdir(exist_ok=True)
            pq.write_table(
                pa.Table.from_pylist(chunk, schema=side_schema), self.log / "_sidecars" / name
            )
            size = (self.log / "_sidecars" / name).stat().st_size
            lines.append(
                {"sidecar": {"path": name, "sizeInBytes": size, "modificationTime": 1700000000000}}
            )
        p = self.log / f"{version:020d}.checkpoint.{uuid.uuid4()}.json"
        p.write_text("".join(json.dumps(a) + "\n" for a in lines))
        return p

    def last_checkpoint(self, version: int, checksum: bool = True, **fields: Any) -> Path:
        body: dict[str, Any] = {"version": version, "size": 1, **fields}
        if checksum:
            body["checksum"] = json_checksum(json.dumps(body))
        p = self.log / "_last_checkpoint"
        p.write_text(json.dumps(body))
        return p

    @staticmethod
    def _row(action: dict[str, Any]) -> dict[str, Any]:
        ((name, body),) = action.items()
        if name == "metaData":
            body = {**body, "name": None, "description": None}
        return {name: body}
