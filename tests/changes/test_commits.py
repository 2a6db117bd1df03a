"""The one per-commit step (:mod:`deltastream.changes.commits`): each rule it applies, on
commits written by hand, and :class:`CommitSteps` carrying state in order and reloading it
after a jump."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import logbuilder as lb
import pytest

import deltastream as ds
from deltastream.changes.commits import CommitStep, CommitSteps, InForce, process_commit
from deltastream.log.commit import LogActions
from deltastream.log.listing import list_log
from deltastream.log.paths import LogFile
from deltastream.schema.evolution import SchemaChangeKind
from deltastream.snapshot.loader import read_log_files
from deltastream.storage.local import LocalStore

T0 = 1_700_000_000_000


def commits(root: Path) -> list[tuple[LogFile, LogActions]]:
    async def go() -> list[tuple[LogFile, LogActions]]:
        store = LocalStore(root)
        files = list((await list_log(store)).commits().values())
        files.sort(key=lambda f: f.version)
        return list(zip(files, await read_log_files(store, files), strict=True))

    return anyio.run(go)


def schema_with(*fields: tuple[str, str]) -> dict[str, Any]:
    m = lb.metadata()
    m["metaData"]["schemaString"] = json.dumps(
        {
            "type": "struct",
            "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields],
        }
    )
    return m


def run_all(root: Path) -> list[CommitStep]:
    out: list[CommitStep] = []
    before: InForce | None = None
    for f, actions in commits(root):
        step = process_commit(str(root), before, f, actions)
        out.append(step)
        before = step.after
    return out


def test_the_first_commit_must_carry_protocol_and_metadata(tmp_path: Path) -> None:
    lb.LogWriter(tmp_path).commit(0, lb.add("a.parquet"))
    with pytest.raises(ds.CorruptCommitError, match="first commit has no protocol or metadata"):
        run_all(tmp_path)


def test_a_protocol_with_an_unknown_reader_feature_is_refused_at_its_version(
    tmp_path: Path,
) -> None:
    w = lb.LogWriter(tmp_path)
    w.commit(0, lb.protocol(), lb.metadata())
    w.commit(1, lb.protocol(3, 7, ["fancyNewThing"], ["fancyNewThing"]))
    with pytest.raises(ds.UnsupportedFeatureError, match="fancyNewThing"):
        run_all(tmp_path)


def test_file_times_are_made_strictly_increasing(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    w.commit(0, lb.protocol(), lb.metadata(), mtime_ms=T0)
    w.commit(1, lb.add("a.parquet"), mtime_ms=T0)  # same time
    w.commit(2, lb.add("b.parquet"), mtime_ms=T0 - 5000)  # a clock going back
    w.commit(3, lb.add("c.parquet"), mtime_ms=T0 + 10)
    assert [s.timestamp_ms for s in run_all(tmp_path)] == [T0, T0 + 1, T0 + 2, T0 + 10]


def test_file_times_look_back_a_hundred_versions(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    w.commit(0, lb.protocol(), lb.metadata(), mtime_ms=T0)
    for v in range(1, 150):
        w.commit(v, lb.add(f"{v}.parquet"), mtime_ms=T0)
    times = [s.timestamp_ms for s in run_all(tmp_path)]
    # Version v counts v ms after version 0 while version 0 is within 100 versions;
    # after that, version 0 no longer counts and every later file shares its time.
    assert times[:101] == [T0 + v for v in range(101)]
    assert times[101:] == [T0 + 100] * 49


def test_in_commit_timestamps_where_enabled_and_an_error_where_missing(tmp_path: Path) -> None:
    ict = {"delta.enableInCommitTimestamps": "true"}
    w = lb.LogWriter(tmp_path)
    w.commit(0, lb.commit_info(ict=T0 + 7), lb.protocol(), lb.metadata(configuration=ict))
    w.commit(1, lb.commit_info(ict=T0 + 9), lb.add("a.parquet"))
    assert [s.timestamp_ms for s in run_all(tmp_path)] == [T0 + 7, T0 + 9]
    w.commit(2, lb.add("b.parquet"))
    with pytest.raises(ds.CorruptCommitError, match="in-commit timestamps are enabled"):
        run_all(tmp_path)


def test_schema_changes_are_classified_and_a_new_id_is_a_replaced_table(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    w.commit(0, lb.protocol(), schema_with(("id", "long")))
    w.commit(1, schema_with(("id", "long"), ("x", "string")))
    w.commit(2, schema_with(("id", "string"), ("x", "string")))
    replaced = schema_with(("id", "string"), ("x", "string"))
    replaced["metaData"]["id"] = "another"
    w.commit(3, replaced)
    steps = run_all(tmp_path)
    assert [s.schema_change.kind for s in steps] == [
        SchemaChangeKind.NONE,
        SchemaChangeKind.ADDITIVE,
        SchemaChangeKind.NON_ADDITIVE,
        SchemaChangeKind.NONE,
    ]
    assert steps[2].schema_change.unreadable is not None
    assert [s.replaces_table for s in steps] == [False, False, False, True]


def test_starting_from_the_state_at_a_version_changes_nothing(tmp_path: Path) -> None:
    """A reader passes the reconciled state at its first version as ``before``: applying
    that version's own metadata again is no schema change."""
    w = lb.LogWriter(tmp_path)
    w.commit(0, lb.protocol(), schema_with(("id", "long")))
    w.commit(1, schema_with(("id", "long"), ("x", "string")))
    (_, a0), (f1, a1) = commits(tmp_path)
    assert a1.protocol is None and a0.protocol is not None and a1.metadata is not None
    at_1 = InForce(a0.protocol, a1.metadata, ())
    assert process_commit(str(tmp_path), at_1, f1, a1).schema_change.kind is SchemaChangeKind.NONE


def test_the_change_data_feed_is_not_in_force_without_the_writer_feature(tmp_path: Path) -> None:
    """Writer version 7 needs ``changeDataFeed`` among its features for the table property
    to count: a rewrite after such an upgrade lacks change data."""
    cdf = {"delta.enableChangeDataFeed": "true"}
    w = lb.LogWriter(tmp_path)
    w.commit(0, lb.protocol(1, 4), lb.metadata(configuration=cdf), lb.add("a.parquet"))
    w.commit(1, lb.remove("a.parquet"), lb.add("b.parquet"))
    w.commit(2, lb.protocol(3, 7, ["deletionVectors"], ["deletionVectors"]))
    w.commit(3, lb.remove("b.parquet"), lb.add("c.parquet"))
    steps = run_all(tmp_path)
    assert [s.change_data_in_force for s in steps] == [True, True, False, False]
    assert [s.lacks_change_data for s in steps] == [False, False, False, True]


def test_commit_steps_carry_state_in_order_and_reload_it_after_a_jump(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    w.commit(0, lb.protocol(), lb.metadata(), mtime_ms=T0)
    for v in range(1, 6):
        w.commit(v, lb.add(f"{v}.parquet"), mtime_ms=T0)
    expected = [s.timestamp_ms for s in run_all(tmp_path)]
    found = commits(tmp_path)

    async def go() -> tuple[list[int], int]:
        store = LocalStore(tmp_path)
        steps = CommitSteps(store)
        # In order from 2, then a jump back to 1 and on: the same timestamps as a walk
        # from version 0.
        order = [2, 3, 4, 1, 2, 5]
        out = [(await steps.step(*found[v])).timestamp_ms for v in order]
        return out, store.stats.list_requests

    out, lists = anyio.run(go)
    assert out == [expected[v] for v in [2, 3, 4, 1, 2, 5]]
    # Two listings (the state, the file times before it) where it started, after the jump
    # back and after the jump forward; none in between.
    assert lists == 6


def test_a_seeded_reader_looks_up_the_file_times_before_it_once(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    w.commit(0, lb.protocol(), lb.metadata(), mtime_ms=T0)
    for v in range(1, 4):
        w.commit(v, lb.add(f"{v}.parquet"), mtime_ms=T0)
    expected = [s.timestamp_ms for s in run_all(tmp_path)]
    found = commits(tmp_path)
    (_, first), *_ = found
    assert first.protocol is not None and first.metadata is not None

    async def go() -> tuple[list[int], int]:
        store = LocalStore(tmp_path)
        steps = CommitSteps(store)
        steps.seed(2, first.protocol, first.metadata)  # type: ignore[arg-type]
        out = [(await steps.step(*found[v])).timestamp_ms for v in (2, 3)]
        return out, store.stats.list_requests

    out, lists = anyio.run(go)
    assert out == expected[2:]
    assert lists == 1
