"""delta-kernel-rs as a second oracle: the change data feed of every corpus table with
expected change data equals what delta-kernel-rs's ``table_changes`` produces (through its
Python wrapper, the PyPI package ``delta-kernel-rust-sharing-wrapper``), every column
included, ``_commit_timestamp`` too. Both follow the protocol's rule (the in-commit timestamp
where enabled, else the commit file's modification time), with one documented difference:
deltastream makes file times strictly increasing, as Delta's time travel does (so the
timestamp that selects a version is its rows' ``_commit_timestamp``): the file time of
version v is the largest ``modified(k) + (v - k)`` over versions k in ``v - 100 .. v``;
kernel-rs takes them as they are. The corpora are unpacked in one go, so their commits
often share a modification time: the comparison applies that one rule, written out here
independently, to kernel-rs's output."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from cdf_tables import upgraded_without_cdf_feature
from conftest import CORPORA
from kernel_oracle import kernel_changes

import deltastream as ds

#: (table, start, end) of every expected-cdf case, once each.
CASES = sorted(
    {
        (spec["table"], spec["start_version"], spec["end_version"])
        for spec in (json.loads(p.read_text()) for p in (CORPORA / "expected-cdf").glob("*.json"))
    },
    key=str,
)


def file_times(path: str) -> tuple[dict[int, int], dict[int, int]]:
    """``(raw, strictly increasing)`` commit file times (ms) by version, from the file system."""
    raw = {
        int(p.name[:20]): p.stat().st_mtime_ns // 1_000_000
        for p in (Path(path) / "_delta_log").glob("*.json")
        if len(p.name) == 25 and p.name[:20].isdigit()
    }
    increasing = {
        v: max(raw[k] + (v - k) for k in range(max(v - 100, 0), v + 1) if k in raw) for v in raw
    }
    return raw, increasing


def with_increasing_file_times(path: str, table: pa.Table) -> pa.Table:
    """kernel-rs's rows with each file-time ``_commit_timestamp`` replaced by the strictly
    increasing one (in-commit timestamps, which differ from the file time, stay)."""
    raw, chained = file_times(path)
    versions = table.column("_commit_version").to_pylist()
    stamps = pc.cast(table.column("_commit_timestamp"), pa.int64()).to_pylist()
    fixed = [
        chained[v] * 1000 if ts == raw[v] * 1000 else ts
        for v, ts in zip(versions, stamps, strict=True)
    ]
    i = table.schema.get_field_index("_commit_timestamp")
    column = pa.array(fixed, pa.int64()).cast(table.schema.field(i).type)
    return table.set_column(i, table.schema.field(i), column)


def rows(table: pa.Table) -> Counter[tuple[Any, ...]]:
    names = sorted(table.schema.names)
    return Counter(
        tuple(json.dumps(r[n], default=str, sort_keys=True) for n in names)
        for r in table.to_pylist()
    )


@pytest.mark.parametrize(("table", "start", "end"), CASES, ids=lambda x: str(x))
def test_change_data_equals_delta_kernel_rs(table: str, start: int, end: int | None) -> None:
    path = str(CORPORA / table)
    expected = with_increasing_file_times(path, kernel_changes(path, start, end))
    actual = ds.read_changes(path, start_version=start, end_version=end).read_all()
    assert sorted(actual.schema.names) == sorted(expected.schema.names)
    assert rows(actual) == rows(expected)
    assert actual.num_rows > 0


def test_both_refuse_a_rewrite_made_while_the_feed_was_not_in_force(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    upgraded_without_cdf_feature(uri)
    with pytest.raises(ValueError, match=r"Change data feed is unsupported .* at version 2"):
        kernel_changes(uri, 0, None)
    with pytest.raises(ds.ChangeDataNotEnabledError) as caught:
        ds.read_changes(uri, start_version=0).read_all()
    assert caught.value.versions == (2,)
