"""Tables with row tracking, written action by action, as a writer that follows the protocol
would write them (no engine the tests can run writes row tracking: deltalake cannot).

A :class:`RowTrackingTable` writes data files (pyarrow, with the materialized row id and row
commit version columns where a test gives them) and commits whatever ``add``, ``remove`` and
``cdc`` actions a test states, with the ``baseRowId`` and ``defaultRowCommitVersion`` it
states: tests work out the expected row ids from those by the protocol's rule, by hand.
:func:`history` is one such table, a short history of every kind of commit.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from variant_tables import dv_file

ROW_ID_COLUMN = "_row-id-col-3f1c"
COMMIT_VERSION_COLUMN = "_row-commit-version-col-9a2e"
SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "value", "type": "string", "nullable": True, "metadata": {}},
    ],
}
#: A data row: ``(id, value)``.
Row = tuple[int, str]


@dataclass(frozen=True)
class DataFile:
    path: str
    size: int
    num_rows: int


class RowTrackingTable:
    """Writes a table with row tracking enabled (``enabled=False``: only supported)."""

    def __init__(
        self,
        root: Path,
        *,
        cdf: bool = False,
        enabled: bool = True,
        schema: dict[str, Any] | None = None,
    ) -> None:
        self.root = root
        self.log = root / "_delta_log"
        self.log.mkdir(parents=True, exist_ok=True)
        self.version = -1
        self.cdf = cdf
        self.enabled = enabled
        self.schema = schema or SCHEMA
        self._names = 0

    @property
    def uri(self) -> str:
        return str(self.root)

    def configuration(self) -> dict[str, str]:
        config = {
            "delta.enableDeletionVectors": "true",
            "delta.rowTracking.materializedRowIdColumnName": ROW_ID_COLUMN,
            "delta.rowTracking.materializedRowCommitVersionColumnName": COMMIT_VERSION_COLUMN,
        }
        if self.enabled:
            config["delta.enableRowTracking"] = "true"
        if self.cdf:
            config["delta.enableChangeDataFeed"] = "true"
        return config

    def create(self, *actions: dict[str, Any]) -> int:
        """Version 0: protocol, metadata and ``actions``."""
        writer = ["deletionVectors", "domainMetadata", "rowTracking"]
        if self.cdf:
            writer.append("changeDataFeed")
        protocol = {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["deletionVectors"],
            "writerFeatures": writer,
        }
        metadata = {
            "id": "00000000-0000-0000-0000-00000000000a",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps(self.schema),
            "partitionColumns": [],
            "configuration": self.configuration(),
            "createdTime": 1700000000000,
        }
        return self.commit({"protocol": protocol}, {"metaData": metadata}, *actions)

    def commit(self, *actions: dict[str, Any], operation: str = "WRITE") -> int:
        self.version += 1
        info = {"commitInfo": {"timestamp": 1700000000000 + self.version, "operation": operation}}
        lines = [info, *actions]
        (self.log / f"{self.version:020d}.json").write_text(
            "".join(json.dumps(a) + "\n" for a in lines)
        )
        return self.version

    def data_file(
        self,
        rows: Sequence[Row],
        row_ids: Sequence[int | None] | None = None,
        commit_versions: Sequence[int | None] | None = None,
        *,
        row_group_size: int | None = None,
        table: pa.Table | None = None,
    ) -> DataFile:
        """A parquet file of ``rows`` (or of ``table``) with, if given, the materialized
        columns (``None``: a null in that row); without them the file has no such column."""
        if table is None:
            table = pa.table(
                {
                    "id": pa.array([r[0] for r in rows], pa.int64()),
                    "value": pa.array([r[1] for r in rows], pa.string()),
                }
            )
        if row_ids is not None:
            table = table.append_column(ROW_ID_COLUMN, pa.array(row_ids, pa.int64()))
        if commit_versions is not None:
            table = table.append_column(
                COMMIT_VERSION_COLUMN, pa.array(commit_versions, pa.int64())
            )
        self._names += 1
        path = f"part-{self._names:05d}-{uuid.uuid4()}.parquet"
        pq.write_table(table, self.root / path, row_group_size=row_group_size)
        return DataFile(path, (self.root / path).stat().st_size, table.num_rows)

    def cdc_file(self, rows: Sequence[tuple[int, str, str]]) -> dict[str, Any]:
        """A change-data file of ``(id, value, _change_type)`` rows, and its ``cdc`` action."""
        table = pa.table(
            {
                "id": pa.array([r[0] for r in rows], pa.int64()),
                "value": pa.array([r[1] for r in rows], pa.string()),
                "_change_type": pa.array([r[2] for r in rows], pa.string()),
            }
        )
        (self.root / "_change_data").mkdir(exist_ok=True)
        self._names += 1
        path = f"_change_data/cdc-{self._names:05d}-{uuid.uuid4()}.parquet"
        pq.write_table(table, self.root / path)
        size = (self.root / path).stat().st_size
        return {"cdc": {"path": path, "partitionValues": {}, "size": size, "dataChange": False}}

    def deletion_vector(self, rows: Sequence[int]) -> dict[str, Any]:
        """A deletion vector file marking ``rows``, and its descriptor."""
        return dv_file(self.root, list(rows))

    def add(
        self,
        f: DataFile,
        base_row_id: int | None,
        default_version: int | None,
        *,
        dv: dict[str, Any] | None = None,
        data_change: bool = True,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "path": f.path,
            "partitionValues": {},
            "size": f.size,
            "modificationTime": 1700000000000,
            "dataChange": data_change,
            "stats": json.dumps({"numRecords": f.num_rows}),
        }
        return {"add": _tracked(body, dv, base_row_id, default_version)}

    def remove(
        self,
        f: DataFile,
        base_row_id: int | None,
        default_version: int | None,
        *,
        dv: dict[str, Any] | None = None,
        data_change: bool = True,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "path": f.path,
            "deletionTimestamp": 1700000000000,
            "dataChange": data_change,
            "extendedFileMetadata": True,
            "partitionValues": {},
            "size": f.size,
        }
        return {"remove": _tracked(body, dv, base_row_id, default_version)}

    @staticmethod
    def high_water_mark(mark: int) -> dict[str, Any]:
        return {
            "domainMetadata": {
                "domain": "delta.rowTracking",
                "configuration": json.dumps({"rowIdHighWaterMark": mark}),
                "removed": False,
            }
        }


def _tracked(
    body: dict[str, Any],
    dv: dict[str, Any] | None,
    base_row_id: int | None,
    default_version: int | None,
) -> dict[str, Any]:
    """An add or remove action's body with its deletion vector and row tracking fields."""
    if dv is not None:
        body["deletionVector"] = dv
    if base_row_id is not None:
        body["baseRowId"] = base_row_id
    if default_version is not None:
        body["defaultRowCommitVersion"] = default_version
    return body


def history(root: Path, *, cdf: bool = False) -> RowTrackingTable:
    """A table through every kind of commit, each as a writer that follows the protocol
    writes it (``cdf``: with change data feed, whose DML commits then carry ``cdc`` files):

    * v0 inserts ``f0`` (ids 10, 11, 12; baseRowId 0) and ``f1`` (ids 20, 21; baseRowId 3):
      no materialized columns;
    * v1 deletes id 11 (``f0``'s row 1) with a deletion vector;
    * v2 updates id 20 to ``"b"`` and inserts id 30: ``f1`` gets a deletion vector on its row
      0, ``f2`` (baseRowId 5) holds the updated row, its row id 3 and its commit version null
      materialized, then the new row, both materialized columns null;
    * v3 is an ``OPTIMIZE``: ``f0``, ``f1``, ``f2`` replaced (``dataChange=false``) by ``f3``
      (baseRowId 7), every row's row id and commit version materialized;
    * v4 updates id 12 to ``"c"`` copying the rest of ``f3`` (a copy-on-write rewrite, no
      deletion vector): ``f4`` (baseRowId 12) holds every row, the copies with their row ids
      and commit versions materialized, the updated row with its id and a null version.

    The rows and their (row id, row commit version) by version, worked out by the protocol's
    rule: :data:`HISTORY_ROWS`.
    """
    t = RowTrackingTable(root, cdf=cdf)
    f0 = t.data_file([(10, "a"), (11, "a"), (12, "a")])
    f1 = t.data_file([(20, "a"), (21, "a")])
    t.create(t.add(f0, 0, 0), t.add(f1, 3, 0), t.high_water_mark(4))
    dv0 = t.deletion_vector([1])
    v1: list[dict[str, Any]] = [t.remove(f0, 0, 0), t.add(f0, 0, 0, dv=dv0)]
    if cdf:
        v1.append(t.cdc_file([(11, "a", "delete")]))
    t.commit(*v1, operation="DELETE")
    f2 = t.data_file([(20, "b"), (30, "a")], row_ids=[3, None], commit_versions=[None, None])
    dv1 = t.deletion_vector([0])
    v2: list[dict[str, Any]] = [
        t.remove(f1, 3, 0),
        t.add(f1, 3, 0, dv=dv1),
        t.add(f2, 5, 2),
        t.high_water_mark(6),
    ]
    if cdf:
        v2.append(
            t.cdc_file(
                [(20, "a", "update_preimage"), (20, "b", "update_postimage"), (30, "a", "insert")]
            )
        )
    t.commit(*v2, operation="MERGE")
    f3 = t.data_file(
        [(10, "a"), (12, "a"), (21, "a"), (20, "b"), (30, "a")],
        row_ids=[0, 2, 4, 3, 6],
        commit_versions=[0, 0, 0, 2, 2],
    )
    t.commit(
        t.remove(f0, 0, 0, dv=dv0, data_change=False),
        t.remove(f1, 3, 0, dv=dv1, data_change=False),
        t.remove(f2, 5, 2, data_change=False),
        t.add(f3, 7, 3, data_change=False),
        t.high_water_mark(11),
        operation="OPTIMIZE",
    )
    f4 = t.data_file(
        [(10, "a"), (12, "c"), (21, "a"), (20, "b"), (30, "a")],
        row_ids=[0, 2, 4, 3, 6],
        commit_versions=[0, None, 0, 2, 2],
    )
    v4: list[dict[str, Any]] = [t.remove(f3, 7, 3), t.add(f4, 12, 4), t.high_water_mark(16)]
    if cdf:
        v4.append(t.cdc_file([(12, "a", "update_preimage"), (12, "c", "update_postimage")]))
    t.commit(*v4, operation="UPDATE")
    return t


#: The rows of :func:`history` at each version: ``(id, value, _row_id, _row_commit_version)``.
HISTORY_ROWS: dict[int, set[tuple[int, str, int, int]]] = {
    # Fresh ids: baseRowId + position; commit versions: defaultRowCommitVersion.
    0: {(10, "a", 0, 0), (11, "a", 1, 0), (12, "a", 2, 0), (20, "a", 3, 0), (21, "a", 4, 0)},
    # Row 1 of f0 hidden: row 2 keeps its position, so its id stays 0 + 2.
    1: {(10, "a", 0, 0), (12, "a", 2, 0), (20, "a", 3, 0), (21, "a", 4, 0)},
    # f1's row 1 keeps id 3 + 1; f2: row 0 materialized id 3 (version null: default 2), row 1
    # fresh 5 + 1 with version 2.
    2: {(10, "a", 0, 0), (12, "a", 2, 0), (21, "a", 4, 0), (20, "b", 3, 2), (30, "a", 6, 2)},
    # OPTIMIZE: every id and version materialized, the same as before.
    3: {(10, "a", 0, 0), (12, "a", 2, 0), (21, "a", 4, 0), (20, "b", 3, 2), (30, "a", 6, 2)},
    # The updated row keeps id 2, its version null: default 4; the copies keep theirs.
    4: {(10, "a", 0, 0), (12, "c", 2, 4), (21, "a", 4, 0), (20, "b", 3, 2), (30, "a", 6, 2)},
}


class KeylessHistory:
    """A table without a key (rows repeat whole), with row tracking: what only row ids can
    mirror. :meth:`first` writes versions 0 to 3, :meth:`second` 4 and 5 (``cdf``: the DML
    commits carry ``cdc`` files too):

    * v0 inserts ``(1, a)`` twice and ``(2, b)`` (row ids 0, 1, 2); v1 ``(1, a)`` once more (3);
    * v2 updates row id 1 to ``(1, z)``: a deletion vector on its row, its new version in a
      new file with its id materialized;
    * v3 is an ``OPTIMIZE`` into one file, every id and version materialized;
    * v4 deletes row id 3 copying the others to a new file (copy-on-write);
    * v5 updates every ``id = 1`` row to ``q``, copying ``(2, b)``.
    """

    #: The rows at versions 3 and 5: ``(id, value, _row_id, _row_commit_version)``.
    AT_3 = frozenset({(1, "a", 0, 0), (1, "z", 1, 2), (2, "b", 2, 0), (1, "a", 3, 1)})
    AT_5 = frozenset({(1, "q", 0, 5), (1, "q", 1, 5), (2, "b", 2, 0)})

    def __init__(self, root: Path, *, cdf: bool) -> None:
        self.t = RowTrackingTable(root, cdf=cdf)
        self.cdf = cdf

    def _cdc(self, rows: Sequence[tuple[int, str, str]]) -> list[dict[str, Any]]:
        return [self.t.cdc_file(rows)] if self.cdf else []

    def first(self) -> int:
        t = self.t
        f0 = t.data_file([(1, "a"), (1, "a"), (2, "b")])
        t.create(t.add(f0, 0, 0), t.high_water_mark(2))
        f1 = t.data_file([(1, "a")])
        t.commit(t.add(f1, 3, 1), t.high_water_mark(3))
        dv = t.deletion_vector([1])
        f2 = t.data_file([(1, "z")], row_ids=[1], commit_versions=[None])
        t.commit(
            t.remove(f0, 0, 0),
            t.add(f0, 0, 0, dv=dv),
            t.add(f2, 4, 2),
            t.high_water_mark(4),
            *self._cdc([(1, "a", "update_preimage"), (1, "z", "update_postimage")]),
            operation="UPDATE",
        )
        self.f3 = t.data_file(
            [(1, "a"), (2, "b"), (1, "a"), (1, "z")],
            row_ids=[0, 2, 3, 1],
            commit_versions=[0, 0, 1, 2],
        )
        return t.commit(
            t.remove(f0, 0, 0, dv=dv, data_change=False),
            t.remove(f1, 3, 1, data_change=False),
            t.remove(f2, 4, 2, data_change=False),
            t.add(self.f3, 5, 3, data_change=False),
            t.high_water_mark(8),
            operation="OPTIMIZE",
        )

    def second(self) -> int:
        t = self.t
        f4 = t.data_file(
            [(1, "a"), (2, "b"), (1, "z")], row_ids=[0, 2, 1], commit_versions=[0, 0, 2]
        )
        t.commit(
            t.remove(self.f3, 5, 3),
            t.add(f4, 9, 4),
            t.high_water_mark(11),
            *self._cdc([(1, "a", "delete")]),
            operation="DELETE",
        )
        f5 = t.data_file(
            [(1, "q"), (2, "b"), (1, "q")], row_ids=[0, 2, 1], commit_versions=[None, 0, None]
        )
        return t.commit(
            t.remove(f4, 9, 4),
            t.add(f5, 12, 5),
            t.high_water_mark(14),
            *self._cdc(
                [
                    (1, "a", "update_preimage"),
                    (1, "z", "update_preimage"),
                    (1, "q", "update_postimage"),
                    (1, "q", "update_postimage"),
                ]
            ),
            operation="UPDATE",
        )
