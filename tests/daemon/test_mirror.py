"""The mirror rule (:mod:`deltastream.daemon.sinks.mirror`) and the two sinks that keep a
mirror (``delta:…?mode=merge``, ``postgresql://…&mode=merge``) held to it:

* the rule on hand-made deliveries: key changes, swapped keys, a key removed and added in
  one version, whatever the order within the delivery; keys that are not unique refused;
* differential: seeded random histories written by ``deltalake`` (``mirror_histories``),
  tailed into each sink with 1, 3 and 1,000 rows per delivery and the sink's default, with
  and without a ``where``; after every run the mirror is the source's table (filtered),
  row for row;
* the same with the tailer process stopped at each crash point a merge delivery passes (the
  N-th time, N drawn from the seed), then run to the end: the mirror is still the source's;
* a key that is not unique in the source stops the stream with the exact error, nothing of
  the delivery committed, in each sink.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from crashpoint_child import Job, run_job
from deltalake import DeltaTable, write_deltalake
from mirror_histories import COLUMNS, SCHEMA, WHERE, History, source_rows
from mirror_targets import Mirror
from tailing import deliver_through, small_deliveries

from deltastream.daemon.crashpoints import CRASH_EXIT_STATUS
from deltastream.daemon.sinks import CallbackSink, parse_sink
from deltastream.daemon.sinks.mirror import ADDED_FIRST, DELETE, VERSION, mirror_changes
from deltastream.daemon.stream.config import Mode, StartFrom
from deltastream.daemon.stream.tailer import Tailer
from deltastream.errors import InvalidArgumentError, SinkRecoveryError, SinkRejectedError

pytestmark = pytest.mark.anyio


def changes(rows: list[tuple[int, str, str, int]]) -> pa.Table:
    """Change rows ``(id, name, change type, version)``."""
    return pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "name": pa.array([r[1] for r in rows], pa.string()),
            "_change_type": pa.array([r[2] for r in rows], pa.string()),
            "_commit_version": pa.array([r[3] for r in rows], pa.int64()),
            "_commit_timestamp": pa.array([0] * len(rows), pa.timestamp("us", "UTC")),
        }
    )


def outcome(table: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(
        (r["id"], r["name"], r[DELETE], r[ADDED_FIRST], r[VERSION]) for r in table.to_pylist()
    )


# ------------------------------------------------------------------------- the rule


def test_a_key_changed_by_an_update_removes_the_old_key() -> None:
    rows = changes(
        [(1, "a", "insert", 1), (1, "a", "update_preimage", 2), (100, "a", "update_postimage", 2)]
    )
    # Key 1: added, then removed (delete it if there); key 100: added anew.
    assert outcome(mirror_changes(rows, ["id"], "t")) == [
        (1, "a", True, True, 1),
        (100, "a", False, True, 2),
    ]


def test_keys_swapped_in_one_commit_keep_both_rows_whatever_the_order() -> None:
    swap = [
        (1, "a", "update_preimage", 5),
        (2, "a", "update_postimage", 5),
        (2, "b", "update_preimage", 5),
        (1, "b", "update_postimage", 5),
    ]
    expected = [(1, "b", False, False, 5), (2, "a", False, False, 5)]
    assert outcome(mirror_changes(changes(swap), ["id"], "t")) == expected
    assert outcome(mirror_changes(changes(swap[::-1]), ["id"], "t")) == expected


def test_a_key_removed_and_added_in_one_version_is_kept() -> None:
    # A replaceWhere: the additions listed before the removals in the delivery.
    rows = changes([(7, "new", "insert", 3), (7, "old", "delete", 3), (8, "x", "delete", 3)])
    assert outcome(mirror_changes(rows, ["id"], "t")) == [
        (7, "new", False, False, 3),
        (8, "x", True, False, 3),
    ]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [(2, "a", "insert", 1), (2, "b", "insert", 3)],
            "version 3 adds a second row with it (the source holds two)",
        ),
        (
            [(2, "a", "delete", 4), (2, "b", "update_preimage", 4)],
            "version 4 removes it twice (the source held two rows with it)",
        ),
    ],
)
def test_a_key_that_is_not_unique_is_refused(
    rows: list[tuple[int, str, str, int]], message: str
) -> None:
    with pytest.raises(SinkRejectedError) as caught:
        mirror_changes(changes(rows), ["id"], "sink")
    assert str(caught.value) == (
        f"sink: key id=2 is not unique in the source: {message}; a mirror needs a unique "
        "key; nothing of the delivery was committed"
    )


def test_compound_keys_name_every_column() -> None:
    rows = changes([(1, "a", "insert", 1), (1, "a", "insert", 2)])
    with pytest.raises(SinkRejectedError) as caught:
        mirror_changes(rows, ["id", "name"], "sink")
    assert "key (id, name)=(1, 'a') is not unique in the source: version 2" in str(caught.value)
    other = changes([(1, "a", "insert", 1), (1, "b", "insert", 2)])
    assert len(mirror_changes(other, ["id", "name"], "sink")) == 2


# ------------------------------------------------------------------------- the order


async def follow(cfg: Any, spec: str, version: int) -> None:
    """Run a stream into ``spec`` until it delivered ``version``; its errors propagate."""
    await deliver_through(cfg, parse_sink(spec), version)


async def delivered_rows(uri: str, state: Path, order: str) -> list[tuple[Any, ...]]:
    """Every change row of ``uri`` (version, change type, id, name), in delivery order, one
    row per delivery, through a callback sink asking for ``order``."""
    seen: list[tuple[Any, ...]] = []

    def record(delivery: Any) -> None:
        for b in delivery.batches:
            seen.extend(
                (r["_commit_version"], r["_change_type"], r["id"], r["name"]) for r in b.to_pylist()
            )

    sink = CallbackSink(record, description="record")
    sink.change_order = order  # type: ignore[assignment]
    cfg = small_deliveries(uri, state, max_rows_per_delivery=1)
    await deliver_through(cfg, sink, DeltaTable(uri).version())
    return seen


async def test_each_versions_removals_come_before_its_additions(tmp_path: Path) -> None:
    """With ``removals-first`` every version's removals (from change-data files, read twice,
    and from remove actions) precede its additions; the rows are those of the log order."""
    uri = str(tmp_path / "source")
    history = History(uri, 7, row_group=1)
    history.create()
    history.run(12)
    ordered = await delivered_rows(uri, tmp_path / "a", "removals-first")
    logged = await delivered_rows(uri, tmp_path / "b", "log")
    assert sorted(ordered) == sorted(logged)
    removal = {"delete": 0, "update_preimage": 0, "insert": 1, "update_postimage": 1}
    kinds = [(v, removal[t]) for v, t, _, _ in ordered]
    assert kinds == sorted(kinds)
    # The history has versions that mix both, from change-data files and from actions.
    assert [v for v, t, _, _ in logged if t == "update_preimage"]
    assert kinds != [(v, removal[t]) for v, t, _, _ in logged]


# ------------------------------------------------------------------------- the sinks


@pytest.fixture(params=["delta", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Mirror:
    postgres = request.getfixturevalue("postgres") if request.param == "postgresql" else None
    return Mirror(request.param, tmp_path, postgres, COLUMNS)


#: Every delivery size the issue names, with and without a ``where``, each on a seed of its
#: own (odd: starting with a snapshot, even: following from version 0). More seeds:
#: ``tests/benchmarks/fuzz_mirror.py``.
HISTORIES = [
    pytest.param(seed, size, where, id=f"{size or 'default'}-{'where' if where else 'all'}")
    for seed, (size, where) in enumerate(
        ((size, where) for size in (1, 3, 1000, None) for where in (None, WHERE)), start=1
    )
]


@pytest.mark.parametrize(("seed", "size", "where"), HISTORIES)
async def test_the_mirror_equals_the_source_after_a_random_history(
    tmp_path: Path, target: Mirror, seed: int, size: int | None, where: str | None
) -> None:
    uri = str(tmp_path / "source")
    history = History(uri, seed, row_group=1 if size == 1 else 4)
    history.create()
    middle = history.run(6)
    latest = history.run(6)
    # Odd seeds start with the snapshot of a middle version, even ones follow from version 0.
    start = (
        {"mode": Mode.SNAPSHOT_AND_FOLLOW, "start": StartFrom(version=middle)} if seed % 2 else {}
    )
    cfg = small_deliveries(
        uri, tmp_path / "state", max_rows_per_delivery=size, where=where, **start
    )
    await follow(cfg, target.spec, latest)
    assert target.rows() == source_rows(uri, where)
    # And again after more commits, the stream resumed where it stopped.
    latest = history.run(4)
    await follow(cfg, target.spec, latest)
    assert target.rows() == source_rows(uri, where)


#: The crash points a merge delivery passes (the delta sink's commit is its write: no fsync).
MERGE_POINTS = (
    "sink.before-write",
    "sink.after-write",
    "state.before-commit",
    "state.after-commit",
    "delivery.between",
)


@pytest.mark.parametrize("point", MERGE_POINTS)
async def test_the_mirror_equals_the_source_after_a_kill_inside_a_merge_delivery(
    tmp_path: Path, target: Mirror, point: str
) -> None:
    uri = str(tmp_path / "source")
    seed = sum(map(ord, point))
    history = History(uri, seed)
    history.create()
    latest = history.run(10)
    job = Job(
        uri=uri,
        state=str(tmp_path / "state"),
        sink=target.spec,
        mode="follow",
        start="0",
        latest=latest,
        rows_per_delivery=3,
    )
    nth = 2 + seed % 5
    assert await anyio.to_thread.run_sync(run_job, replace(job, crash=f"{point}:{nth}")) == (
        CRASH_EXIT_STATUS
    )
    error = tmp_path / "error"
    status = await anyio.to_thread.run_sync(run_job, replace(job, error_file=str(error)))
    assert status == 0, error.read_text() if error.exists() else status
    assert target.rows() == source_rows(uri)


def dup_source(uri: str) -> None:
    write_deltalake(
        uri,
        pa.table({"id": [1, 2], "name": ["a", "b"], "amount": [1, 2], "part": ["p", "p"]}, SCHEMA),
        configuration={"delta.enableChangeDataFeed": "true"},
    )


def dup_row() -> pa.Table:
    return pa.table({"id": [2], "name": ["dup"], "amount": [9], "part": ["p"]}, SCHEMA)


@pytest.mark.parametrize("then_deleted", [False, True], ids=["kept", "then-deleted"])
async def test_a_second_row_with_a_key_the_mirror_holds_stops_the_stream(
    tmp_path: Path, target: Mirror, then_deleted: bool
) -> None:
    """Key 2 appended a second time (and, in one delivery with it, deleted again: the case
    that lost key 2 from the mirror) stops the stream, nothing of the delivery committed."""
    uri = str(tmp_path / "source")
    dup_source(uri)
    cfg = small_deliveries(uri, tmp_path / "state", max_rows_per_delivery=None)
    await follow(cfg, target.spec, 0)
    write_deltalake(uri, dup_row(), mode="append")  # version 1: key 2 twice in the source
    if then_deleted:
        DeltaTable(uri).delete("name = 'dup'")  # version 2
    sink = parse_sink(target.spec)
    with pytest.raises(SinkRejectedError) as caught:
        await Tailer(cfg, sink).run()
    await sink.aclose()
    assert str(caught.value) == (
        f"{sink.description}: key id=2 is not unique in the source: version 1 adds a row with "
        "it while the source already holds one (in the mirror); a mirror needs a unique key; "
        "nothing of the delivery was committed"
    )
    assert target.rows() == [(1, "a", 1, "p"), (2, "b", 2, "p")]


async def test_a_mirrors_where_names_only_table_columns(tmp_path: Path, target: Mirror) -> None:
    uri = str(tmp_path / "source")
    dup_source(uri)
    cfg = small_deliveries(uri, tmp_path / "state", where="_change_type = 'insert'")
    sink = parse_sink(target.spec)
    with pytest.raises(InvalidArgumentError) as caught:
        await Tailer(cfg, sink).run()
    await sink.aclose()
    assert str(caught.value) == (
        "stream 's': a mirror's where may name only the table's columns, not _change_type: "
        "the mirror holds the rows of the table that the filter keeps"
    )


async def test_a_target_emptied_outside_deltastream_is_refused(
    tmp_path: Path, target: Mirror
) -> None:
    """The stream's state says its last delivery left rows in the target: a target found
    empty at the next start was emptied behind the stream's back. Refused, touching nothing;
    a mirror the source itself emptied is not."""
    uri = str(tmp_path / "source")
    dup_source(uri)
    cfg = small_deliveries(uri, tmp_path / "state", max_rows_per_delivery=None)
    await follow(cfg, target.spec, 0)
    target.empty()
    sink = parse_sink(target.spec)
    with pytest.raises(SinkRecoveryError) as caught:
        await Tailer(cfg, sink).run()
    await sink.aclose()
    assert "emptied outside deltastream; nothing was touched" in str(caught.value)
    assert "deltastream reset --state" in str(caught.value)
    assert target.rows() == []
    # The source deleting every row: the mirror is empty, and that is no reason to refuse.
    other = tmp_path / "other"
    other.mkdir()
    again = Mirror(target.kind, other, getattr(target, "postgres", None), COLUMNS)
    cfg = small_deliveries(uri, other / "state", max_rows_per_delivery=None)
    await follow(cfg, again.spec, 0)
    DeltaTable(uri).delete()  # version 1
    await follow(cfg, again.spec, 1)
    assert again.rows() == []
    write_deltalake(uri, dup_row(), mode="append")  # version 2
    await follow(cfg, again.spec, 2)
    assert again.rows() == [(2, "dup", 9, "p")]
