"""A Delta target as it is: its types (exact, or refused with the fix), its schema
evolution (nested fields), its constraints and properties (permanent refusals stop the
stream at once), and what its owner does to it while the stream runs (emptied, removed or
replaced: refused at the next delivery; OPTIMIZE and VACUUM: taken in, no retry).

Sources and targets are real Delta tables written by ``deltalake``; streams run through the
tailer or the command line, or the sink is driven as the tailer drives it.
"""

from __future__ import annotations

import logging
import shlex
import shutil
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from tailing import CDF, batch, create_table, eventually, small_deliveries
from test_delta_sink import STREAM, delivery, run_cli, run_until, the_error

from deltastream.daemon.delivery import Position, StreamRef
from deltastream.daemon.sinks import DeltaSink, parse_sink
from deltastream.daemon.sinks.delta import delta_storage_options
from deltastream.daemon.stream.tailer import Tailer
from deltastream.errors import SinkRecoveryError, SinkRejectedError, SinkSchemaError

S1 = pa.struct([("a", pa.int64())])
S2 = pa.struct([("a", pa.int64()), ("b", pa.string())])


def sorted_rows(uri: str, columns: list[str]) -> list[dict[str, Any]]:
    rows = DeltaTable(uri).to_pyarrow_table(columns=columns).to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def inserts(table: pa.Table, version: int) -> pa.Table:
    n = table.num_rows
    return (
        table.append_column("_change_type", pa.array(["insert"] * n))
        .append_column("_commit_version", pa.array([version] * n, pa.int64()))
        .append_column(
            "_commit_timestamp", pa.array([version * 1000] * n, pa.timestamp("us", tz="UTC"))
        )
    )


# ------------------------------------------------------------------ types and schemas


@pytest.mark.anyio
async def test_a_nested_field_added_reaches_a_change_log_and_a_mirror(tmp_path: Path) -> None:
    """The source gains ``s.b`` and then updates one row: both targets take the field by
    schema merge, and the mirror's rows (the ones its MERGE copied from a rewritten file
    too) equal the source's value for value."""
    uri, log_target, mirror = (str(tmp_path / n) for n in ("src", "log", "mirror"))
    first = pa.table(
        {"id": pa.array([1, 2, 3], pa.int64()), "s": pa.array([{"a": i} for i in (1, 2, 3)], S1)}
    )
    write_deltalake(uri, first, configuration=CDF)
    wider = pa.table({"id": pa.array([4], pa.int64()), "s": pa.array([{"a": 4, "b": "x"}], S2)})
    write_deltalake(uri, wider, mode="append", schema_mode="merge")
    DeltaTable(uri).update(predicate="id = 1", updates={"s": "named_struct('a', 10, 'b', 'y')"})
    for spec in (f"delta:{log_target}", f"delta:{mirror}?mode=merge&key=id"):
        cfg = small_deliveries(uri, tmp_path / f"state-{len(spec)}", max_rows_per_delivery=100)
        await run_until(cfg, parse_sink(spec), 2)
    assert (
        sorted_rows(mirror, ["id", "s"])
        == sorted_rows(uri, ["id", "s"])
        == [
            {"id": 1, "s": {"a": 10, "b": "y"}},
            {"id": 2, "s": {"a": 2, "b": None}},
            {"id": 3, "s": {"a": 3, "b": None}},
            {"id": 4, "s": {"a": 4, "b": "x"}},
        ]
    )
    changes = DeltaTable(log_target).to_pyarrow_table(columns=["id", "s", "_change_type"])
    assert sorted(changes.to_pylist(), key=lambda r: (r["id"], r["_change_type"])) == [
        {"id": 1, "s": {"a": 1, "b": None}, "_change_type": "insert"},
        {"id": 1, "s": {"a": 10, "b": "y"}, "_change_type": "update_postimage"},
        {"id": 1, "s": {"a": 1, "b": None}, "_change_type": "update_preimage"},
        {"id": 2, "s": {"a": 2, "b": None}, "_change_type": "insert"},
        {"id": 3, "s": {"a": 3, "b": None}, "_change_type": "insert"},
        {"id": 4, "s": {"a": 4, "b": "x"}, "_change_type": "insert"},
    ]


@pytest.mark.anyio
async def test_a_wider_column_made_beforehand_takes_the_values_exactly(tmp_path: Path) -> None:
    """An empty target made with ``long`` and ``decimal(12,4)`` for a source's ``integer``
    and ``decimal(10,2)``: the rows are cast to its types, each value exactly, and the
    table keeps them."""
    target = str(tmp_path / "out")
    made = pa.schema(
        [
            ("id", pa.int64()),
            ("n", pa.int64()),
            ("d", pa.decimal128(12, 4)),
            ("_change_type", pa.string()),
            ("_commit_version", pa.int64()),
            ("_commit_timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )
    write_deltalake(target, made.empty_table())
    sink = DeltaSink(target)
    await sink.recover(StreamRef(STREAM, "state"), None, {})
    rows = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "n": pa.array([2**31 - 1, -(2**31)], pa.int32()),
            "d": pa.array(["12345678.91", "-0.01"], pa.string()).cast(pa.decimal128(10, 2)),
        }
    )
    await sink.deliver(delivery(Position(1), Position(2), inserts(rows, 1)))
    table = DeltaTable(target)
    assert pa.schema(table.schema().to_arrow()).field("n").type == pa.int64()
    assert sorted_rows(target, ["id", "n", "d"]) == [
        {"id": 1, "n": 2**31 - 1, "d": Decimal("12345678.9100")},
        {"id": 2, "n": -(2**31), "d": Decimal("-0.0100")},
    ]


@pytest.mark.anyio
async def test_a_widened_source_type_is_refused_with_a_fix_that_works(tmp_path: Path) -> None:
    """A source ``integer`` column now ``long``: delta-rs cannot widen the target's column,
    so the delivery is refused naming the column, both types and the rewrite that keeps the
    rows and the stream's txn; run as given, the stream goes on with the next delivery."""
    target = str(tmp_path / "out")
    sink = DeltaSink(target)
    ref = StreamRef(STREAM, str(tmp_path / "state"))
    await sink.recover(ref, None, {})
    narrow = pa.table({"id": pa.array([1], pa.int64()), "n": pa.array([7], pa.int32())})
    await sink.deliver(delivery(Position(1), Position(2), inserts(narrow, 1)))
    version = DeltaTable(target).version()
    wide = pa.table({"id": pa.array([2], pa.int64()), "n": pa.array([2**40], pa.int64())})
    later = delivery(Position(2), Position(3), inserts(wide, 2))
    with pytest.raises(SinkSchemaError) as caught:
        await sink.deliver(later)
    message = str(caught.value)
    assert message.startswith(
        f"delta:{target}: column n of the table at {target} is integer, and the source's is "
        "now long: delta-rs (deltalake 1.6.6) cannot widen a Delta column's type; nothing was "
        "committed. To go on, rewrite the table with n as long, keeping its rows and the "
        "stream's txn (python -c \""
    )
    assert message.endswith(
        "then start the stream again; or start it over into a new table (to discard the "
        f"stream's output and start over: deltastream reset --state {tmp_path / 'state'} "
        f"--sink delta:{target} --name s, then remove the table)"
    )
    assert DeltaTable(target).version() == version  # nothing committed
    fix = message.split('python -c "')[1].split('")')[0]
    await anyio.run_process([sys.executable, "-c", fix], check=True)
    sink = DeltaSink(target)
    await sink.recover(ref, Position(2), {"rows": True})
    await sink.deliver(later)
    assert sorted_rows(target, ["id", "n"]) == [{"id": 1, "n": 7}, {"id": 2, "n": 2**40}]


# ------------------------------------------------------------------ permanent refusals


def test_a_check_constraint_stops_the_stream_at_once(tmp_path: Path) -> None:
    """A CHECK constraint the rows break: exit 2 with one line, no retry, nothing
    committed."""
    uri, target, state = str(tmp_path / "src"), str(tmp_path / "out"), str(tmp_path / "s")
    create_table(uri, rows=3)
    made = pa.schema(
        [
            ("id", pa.int64()),
            ("name", pa.string()),
            ("part", pa.string()),
            ("_change_type", pa.string()),
            ("_commit_version", pa.int64()),
            ("_commit_timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )
    write_deltalake(target, made.empty_table())
    DeltaTable(target).alter.add_constraint({"positive_ids": "id > 0"})
    version = DeltaTable(target).version()
    done = run_cli(
        "tail", uri, "--mode", "follow", "--available-now", "--from", "0", "--state", state,
        "--sink", f"delta:{target}",
    )  # fmt: skip
    assert the_error(done) == (
        f"deltastream: error: delta:{target}: commit of 3 rows of src (v0 to v1) failed: the "
        "table refused 1 row(s) that break one of its CHECK constraints or NOT NULL columns "
        "(delta-rs: Generic DeltaTable error: External error: Invalid data found: 1 rows "
        "failed validation check.); nothing of it was committed"
    )
    assert "retry" not in done.stderr
    assert DeltaTable(target).version() == version


@pytest.mark.anyio
async def test_a_not_null_column_and_an_append_only_mirror_stop_the_stream(
    tmp_path: Path,
) -> None:
    """A null where the target's column is NOT NULL, and a mirror's delete into an
    append-only table: each refused at once (SinkRejectedError, no retry), nothing
    committed."""
    import deltalake

    strict = str(tmp_path / "strict")
    fields = [deltalake.Field("id", "long", nullable=False), deltalake.Field("n", "long")]
    for name in ("_change_type", "_commit_version", "_commit_timestamp"):
        kind = {"_change_type": "string", "_commit_version": "long"}.get(name, "timestamp")
        fields.append(deltalake.Field(name, kind))
    DeltaTable.create(strict, deltalake.Schema(fields))
    sink = DeltaSink(strict, base_delay=0.0)
    await sink.recover(StreamRef(STREAM, "state"), None, {})
    nulls = pa.table({"id": pa.array([None], pa.int64()), "n": pa.array([1], pa.int64())})
    with pytest.raises(SinkRejectedError, match="refused 1 row\\(s\\) that break one of its"):
        await sink.deliver(delivery(Position(1), Position(2), inserts(nulls, 1)))
    assert sink.retries == 0 and DeltaTable(strict).version() == 0

    mirror = str(tmp_path / "mirror")
    sink = DeltaSink(f"{mirror}?mode=merge&key=id", base_delay=0.0)
    await sink.recover(StreamRef(STREAM, "state"), None, {})
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "n": pa.array([1, 2], pa.int64())})
    await sink.deliver(delivery(Position(1), Position(2), inserts(rows, 1)))
    DeltaTable(mirror).alter.set_table_properties({"delta.appendOnly": "true"})
    version = DeltaTable(mirror).version()
    gone = inserts(rows.slice(0, 1), 2).set_column(2, "_change_type", pa.array(["delete"]))
    with pytest.raises(SinkRejectedError) as caught:
        await sink.deliver(delivery(Position(2), Position(3), gone))
    assert str(caught.value) == (
        f"delta:{mirror}?mode=merge&key=id: commit of 1 rows of s (v2 to v3) failed: the "
        "table is append-only (delta.appendOnly=true), and the delivery removes or rewrites "
        "rows (a mirror's deletes and updates do); nothing of it was committed. Use an "
        "append-only table for a change log (mode=append) only"
    )
    assert sink.retries == 0 and DeltaTable(mirror).version() == version


@pytest.mark.anyio
async def test_a_missing_privilege_on_an_s3_target_stops_the_stream_at_once(
    tmp_path: Path, s3_bucket: Any
) -> None:
    """S3 answers 403 AccessDenied to the sink (a role without ``s3:GetObject``/``ListBucket``
    on the target, or without ``s3:PutObject``), at the start or once a grant is withdrawn
    while the stream runs: refused at once with the denial named, no retry, nothing
    committed; on the command line, one line and exit 2."""
    from faultproxy import FaultProxy

    target = s3_bucket.uri("out")
    direct = delta_storage_options(target, s3_bucket.storage_options)
    write_deltalake(target, inserts(pa.table({"id": pa.array([1], pa.int64())}), 1).slice(0, 0),
                    storage_options=direct)  # fmt: skip
    version = DeltaTable(target, storage_options=direct).version()
    for method in ("GET", "PUT"):
        with FaultProxy(
            s3_bucket.server.endpoint, rate=1.0, weights={"denied": 1.0}, methods=[method]
        ) as proxy:
            options = {**s3_bucket.storage_options, "endpoint_url": proxy.url}
            sink = DeltaSink(target, storage_options=options, base_delay=0.0)
            with pytest.raises(SinkRejectedError) as caught:
                await sink.recover(StreamRef(STREAM, "state"), None, {})
                rows = pa.table({"id": pa.array([2], pa.int64())})
                await sink.deliver(delivery(Position(1), Position(2), inserts(rows, 1)))
            await sink.aclose()
            assert "AccessDenied" in str(caught.value), method
            assert "they lack a permission the target needs" in str(caught.value), method
            assert sink.retries == 0, method
            assert proxy.counts()["denied"] >= 1
    assert DeltaTable(target, storage_options=direct).version() == version

    # A grant withdrawn while the stream runs: the check before the next commit (a HEAD of
    # the target's log) is refused, and the stream stops there, nothing more committed.
    with FaultProxy(
        s3_bucket.server.endpoint, rate=0.0, weights={"denied": 1.0}, methods=["HEAD"]
    ) as proxy:
        options = {**s3_bucket.storage_options, "endpoint_url": proxy.url}
        running = s3_bucket.uri("running")
        sink = DeltaSink(running, storage_options=options, base_delay=0.0)
        await sink.recover(StreamRef(STREAM, "state"), None, {})
        rows = pa.table({"id": pa.array([2], pa.int64())})
        await sink.deliver(delivery(Position(1), Position(2), inserts(rows, 1)))
        committed = DeltaTable(running, storage_options=direct).version()
        proxy.rate = 1.0
        with pytest.raises(SinkRejectedError) as caught:
            await sink.deliver(delivery(Position(2), Position(3), inserts(rows, 2)))
        await sink.aclose()
    message = str(caught.value)
    assert message.startswith(f"delta:{running}: commit of 1 rows of s (v2 to v3) failed: ")
    assert "403" in message and "they lack a permission" in message
    assert sink.retries == 0 and proxy.counts()["denied"] == 1
    assert DeltaTable(running, storage_options=direct).version() == committed

    uri, state = str(tmp_path / "src"), str(tmp_path / "s")
    create_table(uri, rows=3)
    with FaultProxy(
        s3_bucket.server.endpoint, rate=1.0, weights={"denied": 1.0}, methods=["PUT"]
    ) as proxy:
        options = {**s3_bucket.storage_options, "endpoint_url": proxy.url}
        done = run_cli(
            "tail", uri, "--mode", "follow", "--available-now", "--from", "0", "--state", state,
            "--sink", f"delta:{target}", *(f"--sink-option={k}={v}" for k, v in options.items()),
        )  # fmt: skip
    line = the_error(done)
    assert line.startswith(f"deltastream: error: delta:{target}: ") and "AccessDenied" in line
    assert "retry" not in done.stderr
    assert DeltaTable(target, storage_options=direct).version() == version


# ------------------------------------------------------------------ the owner's doings


MIRROR = "?mode=merge&key=id"


async def mirror_running(
    tmp_path: Path, act: Any, query: str = MIRROR
) -> tuple[Tailer, list[BaseException]]:
    """A mirror stream (or, with ``query=""``, a change log) of a 6-row source; once it
    holds them, ``act(target)`` runs and the source deletes a row and adds two; the stream
    runs until it delivers that or fails."""
    uri, mirror = str(tmp_path / "src"), str(tmp_path / "mirror")
    create_table(uri, rows=6)
    cfg = small_deliveries(uri, tmp_path / "state", max_rows_per_delivery=100)
    tailer = Tailer(cfg, parse_sink(f"delta:{mirror}{query}"))
    failures: list[BaseException] = []

    async def run() -> None:
        try:
            await tailer.run()
        except SinkRecoveryError as e:
            failures.append(e)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await eventually(lambda: (tailer.position or Position(-1)) >= Position(1))
        act(mirror)
        DeltaTable(uri).delete("id = 0")
        write_deltalake(uri, batch([10, 11]), mode="append")
        await eventually(lambda: bool(failures) or (tailer.position or Position(-1)) >= Position(3))
        tailer.stop()
    return tailer, failures


def hint(tmp_path: Path, query: str = MIRROR) -> str:
    mirror = tmp_path / "mirror"
    return (
        "to discard the stream's output and start over: deltastream reset --state "
        f"{tmp_path / 'state'} --sink {shlex.quote(f'delta:{mirror}{query}')} --name s"
    )


@pytest.mark.anyio
@pytest.mark.parametrize("query", [MIRROR, ""], ids=["mirror", "change-log"])
async def test_a_target_emptied_while_its_stream_runs_is_refused_at_the_next_delivery(
    tmp_path: Path, query: str
) -> None:
    _, failures = await mirror_running(tmp_path, lambda m: DeltaTable(m).delete(), query)
    mirror = tmp_path / "mirror"
    assert str(failures[0]) == (
        f"delta:{mirror}{query}: the commit of 3 rows of s (v1 to v3) found the "
        f"target changed by another writer: the table at {mirror} holds no rows, but the "
        f"stream's txn says its rows up to v1 were committed there, and its state in "
        f"{tmp_path / 'state'} that rows were left: it was emptied outside deltastream; "
        f"nothing was committed. {hint(tmp_path, query)}"
    )
    assert DeltaTable(str(mirror)).to_pyarrow_table().num_rows == 0


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["removed", "replaced"])
async def test_a_mirror_removed_or_replaced_while_its_stream_runs_is_refused(
    tmp_path: Path, how: str
) -> None:
    def act(mirror: str) -> None:
        shutil.rmtree(mirror)
        if how == "replaced":
            for n in range(4):  # a new table with more versions than the mirror had
                write_deltalake(mirror, pa.table({"id": [n]}), mode="append")

    _, failures = await mirror_running(tmp_path, act)
    mirror = tmp_path / "mirror"
    why = (
        "the table was removed"
        if how == "removed"
        else "the target was replaced, or another table written at its location"
    )
    assert str(failures[0]) == (
        f"delta:{mirror}?mode=merge&key=id: the commit of 3 rows of s (v1 to v3) found the "
        f"target changed by another writer: the table at {mirror} holds no rows of stream "
        f"'s', but its state in {tmp_path / 'state'} says rows up to v1 were committed "
        f"there: {why}; nothing was committed. {hint(tmp_path)}"
    )
    if how == "removed":
        assert not mirror.exists()  # no commit recreated it
    else:
        assert DeltaTable(str(mirror)).version() == 3


@pytest.mark.anyio
async def test_optimize_and_vacuum_of_a_mirror_cost_its_stream_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def maintain(mirror: str) -> None:
        owner = DeltaTable(mirror)
        owner.optimize.compact()
        owner.optimize.z_order(["id"])
        owner.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        owner.create_checkpoint()

    with caplog.at_level(logging.WARNING, logger="deltastream"):
        tailer, failures = await mirror_running(tmp_path, maintain)
    assert not failures and tailer.metrics.sink_retries == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    rows = DeltaTable(str(tmp_path / "mirror")).to_pyarrow_table(columns=["id", "name"])
    assert sorted(r["id"] for r in rows.to_pylist()) == [1, 2, 3, 4, 5, 10, 11]


@pytest.mark.anyio
async def test_a_mirror_merge_bounded_to_the_deliverys_keys_keeps_every_row(
    tmp_path: Path,
) -> None:
    """The MERGE reads only the target's files within the delivery's key range (a string
    key, quotes and all): rows outside it stay, rows within it change as the source's."""
    mirror = str(tmp_path / "mirror")
    sink = DeltaSink(f"{mirror}?mode=merge&key=k")
    await sink.recover(StreamRef(STREAM, "state"), None, {})
    for version, keys in enumerate((["a", "b"], ["o'brien", "p"], ["x", "y"]), start=1):
        rows = pa.table({"k": keys, "n": pa.array([version] * 2, pa.int64())})
        await sink.deliver(
            delivery(Position(version), Position(version + 1), inserts(rows, version))
        )
    assert len(DeltaTable(mirror).file_uris()) == 3
    kinds = ["update_preimage", "update_postimage", "delete"]
    change = pa.table({"k": ["o'brien", "o'brien", "p"], "n": pa.array([2, 9, 2], pa.int64())})
    change = inserts(change, 4).set_column(2, "_change_type", pa.array(kinds))
    await sink.deliver(delivery(Position(4), Position(5), change))
    assert sorted((r["k"], r["n"]) for r in DeltaTable(mirror).to_pyarrow_table().to_pylist()) == [
        ("a", 1),
        ("b", 1),
        ("o'brien", 9),
        ("x", 3),
        ("y", 3),
    ]
    merged = DeltaTable(mirror).history(1)[0]["operationMetrics"]
    assert merged["num_target_files_scanned"] == 1
    assert merged["num_target_files_skipped_during_scan"] == 2


@pytest.mark.anyio
async def test_a_file_vacuumed_under_a_merge_is_retried_on_the_target_loaded_anew(
    tmp_path: Path,
) -> None:
    """OPTIMIZE and VACUUM between the sink's check of the target and its MERGE (as if the
    check had found nothing new): the MERGE fails on a file gone from the store, which is
    transient; the target is loaded anew and the delivery committed once."""
    mirror = str(tmp_path / "mirror")
    sink = DeltaSink(f"{mirror}?mode=merge&key=id", base_delay=0.0)
    await sink.recover(StreamRef(STREAM, "state"), None, {})
    for version in (1, 2):
        ids = pa.array([2 * version - 1, 2 * version], pa.int64())
        rows = pa.table({"id": ids, "n": pa.array([0, 0], pa.int64())})
        await sink.deliver(
            delivery(Position(version), Position(version + 1), inserts(rows, version))
        )
    owner = DeltaTable(mirror)
    owner.optimize.compact()
    owner.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)

    async def unchanged(seen: int) -> bool:
        return False

    sink._target_changed = unchanged  # type: ignore[method-assign]
    update = pa.table({"id": pa.array([1, 1], pa.int64()), "n": pa.array([0, 7], pa.int64())})
    update = inserts(update, 3).set_column(
        2, "_change_type", pa.array(["update_preimage", "update_postimage"])
    )
    await sink.deliver(delivery(Position(3), Position(4), update))
    assert sink.retries == 1
    rows = DeltaTable(mirror).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["n"]) for r in rows) == [(1, 7), (2, 0), (3, 0), (4, 0)]
