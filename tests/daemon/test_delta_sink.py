"""The ``delta:`` sink: change rows appended to a Delta table, or a mirror kept in one, each
delivery one commit carrying the protocol's ``txn`` action with the stream's position.

Every target is a real Delta table (written by the sink through delta-rs, read back with
delta-rs), every source one written by ``deltalake``; the oracles are delta-rs's
``load_cdf`` (the change rows) and the source's snapshot (the mirror).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from tailing import (
    Writer,
    batch,
    change_key,
    create_table,
    eventually,
    expected_changes,
    small_deliveries,
)

from deltastream.daemon.delivery import Delivery, Position, StreamRef
from deltastream.daemon.service.config import parse_config
from deltastream.daemon.sinks import DeltaSink, parse_sink
from deltastream.daemon.sinks.delta import (
    EPOCH_APP_PREFIX,
    RELEASED,
    WRITER_APP_PREFIX,
    app_id,
    decode_position,
    delta_storage_options,
    encode_position,
    rows_in,
)
from deltastream.daemon.stream.config import Mode, StartFrom, TailConfig, tail_config
from deltastream.daemon.stream.reset import reset_stream
from deltastream.daemon.stream.tailer import Tailer
from deltastream.errors import (
    InvalidArgumentError,
    SinkInUseError,
    SinkRecoveryError,
    SinkRejectedError,
)
from deltastream.snapshot.loader import load_table_state
from deltastream.snapshot.reconcile import FILES_SCHEMA
from deltastream.storage import open_store
from deltastream.storage.azure.options import EMULATOR_KEY

STREAM = "s"


config = small_deliveries


async def run_until(cfg: TailConfig, sink: Any, version: int) -> Tailer:
    """Run a tailer until it has delivered every version up to ``version``."""
    tailer = Tailer(cfg, sink)
    async with anyio.create_task_group() as tg:
        tg.start_soon(tailer.run)
        await eventually(lambda: (tailer.position or Position(-1)) >= Position(version + 1))
        tailer.stop()
    return tailer


def source_with_history(uri: str, steps: int = 6) -> int:
    """A source table with appends, updates, deletes and merges; its latest version."""
    create_table(uri, rows=10)
    writer = Writer(uri, steps)
    writer.run()
    return DeltaTable(uri).version()


def target_changes(target: str, **options: Any) -> Counter[tuple[Any, ...]]:
    rows = DeltaTable(target, **options).to_pyarrow_table().to_pylist()
    return Counter(change_key(r) for r in rows)


def rows_of(uri: str, columns: tuple[str, ...] = ("id", "name", "part")) -> list[tuple[Any, ...]]:
    table = DeltaTable(uri).to_pyarrow_table()
    return sorted(tuple(r[c] for c in columns) for r in table.to_pylist())


async def deltastream_txns(uri: str, options: Mapping[str, str] | None = None) -> dict[str, int]:
    """The target's txn versions by appId, but the streams' epochs (:func:`epochs`) and
    writer marks."""
    txns = await all_txns(uri, options)
    marks = (EPOCH_APP_PREFIX, WRITER_APP_PREFIX)
    return {a: v for a, v in txns.items() if not a.startswith(marks)}


def last_operation(uri: str) -> Any:
    """What deltastream's last commit to ``uri`` was (its ``commitInfo``)."""
    return DeltaTable(uri).history(1)[0].get("deltastream.operation")


async def epochs(uri: str) -> dict[str, int]:
    """The streams' epochs the target holds, by stream."""
    txns = await all_txns(uri)
    return {
        a.removeprefix(EPOCH_APP_PREFIX): v
        for a, v in txns.items()
        if a.startswith(EPOCH_APP_PREFIX)
    }


async def all_txns(uri: str, options: Mapping[str, str] | None = None) -> dict[str, int]:
    async with open_store(uri, options) as store:
        state, _ = await load_table_state(store)
    return {a: t.version for a, t in state.txns.items()}


def wrong_schema_table() -> pa.Table:
    """No rows, and a ``name`` column of another type than the sources' (``id long, name
    long``)."""
    return pa.table({"id": pa.array([], pa.int64()), "name": pa.array([], pa.int64())})


def delivery(start: Position, end: Position, rows: pa.Table, table_id: str = "tid") -> Delivery:
    return Delivery(STREAM, table_id, "src", start, end, rows.schema, rows.to_batches())


def changes(ids: list[int], kind: str, version: int, name: str = "x") -> pa.Table:
    base = batch(ids, name)
    n = base.num_rows
    return (
        base.append_column("_change_type", pa.array([kind] * n))
        .append_column("_commit_version", pa.array([version] * n, pa.int64()))
        .append_column(
            "_commit_timestamp", pa.array([version * 1000] * n, pa.timestamp("us", tz="UTC"))
        )
    )


# ------------------------------------------------------------------------- positions


def test_txn_versions_order_as_positions_do_and_decode_back() -> None:
    positions = [
        Position(0),
        Position(0, False, 1),
        Position(0, True, 0),
        Position(0, True, 2**31 - 1),
        Position(1),
        Position(7, False, 12345),
        Position(2**31 - 1, True, 5),
    ]
    encoded = [encode_position(p) for p in positions]
    assert encoded == sorted(encoded) and len(set(encoded)) == len(encoded)
    assert [decode_position(v) for v in encoded] == positions
    assert max(encoded) < 2**63  # a txn version is a signed long
    with pytest.raises(InvalidArgumentError, match="offset must be below 2\\*\\*31"):
        encode_position(Position(3, False, 2**31))


# ------------------------------------------------------------------------- specs


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("delta:", "is incomplete"),
        ("delta:/t?mode=upsert", "mode must be one of append, merge, not 'upsert'"),
        ("delta:/t?mode=merge", "mode=merge needs key=COLUMN"),
        ("delta:/t?key=id", "key= applies to mode=merge only"),
        ("delta:/t?keys=id", "unknown setting 'keys' (known: mode, key, partition_by"),
        ("delta:/t?checkpoint_interval=0", "checkpoint_interval must be a whole number >= 1"),
        ("delta:/t?mode=merge&key=id&key=x", "'key' is given twice"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_problem(spec: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        parse_sink(spec)
    assert message in str(caught.value)


def test_the_target_store_settings_flow_from_sink_options_or_the_tables(tmp_path: Path) -> None:
    s3 = {"endpoint_url": "http://127.0.0.1:9", "access_key_id": "k", "secret_access_key": "s"}
    given = tail_config(
        "s", "s3://b/src", str(tmp_path), {"sink_options": {**s3, "region": "eu-west-1"}}
    )
    sink = parse_sink("delta:s3://b/out", stream=given)
    assert isinstance(sink, DeltaSink)
    assert sink._delta_options == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_ALLOW_HTTP": "true",
    }
    inherited = tail_config("s", "s3://b/src", str(tmp_path), {"storage_options": s3})
    assert parse_sink("delta:s3://b/out", stream=inherited)._delta_options["AWS_REGION"] == (  # type: ignore[attr-defined]
        "us-east-1"
    )
    # A local target takes none of an S3 table's options; given explicitly, they are refused.
    assert parse_sink(f"delta:{tmp_path}/out", stream=inherited)._delta_options == {}  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgumentError, match="only apply to tables in object stores"):
        delta_storage_options(str(tmp_path), s3)
    with pytest.raises(InvalidArgumentError, match="unknown"):
        delta_storage_options("s3://b/t", {"endpoint_ur": "x"})


# ------------------------------------------------------------------------- append


@pytest.mark.anyio
async def test_append_commits_each_change_row_once_with_the_txn(tmp_path: Path) -> None:
    uri, target = str(tmp_path / "src"), str(tmp_path / "out")
    latest = source_with_history(uri)
    sink = parse_sink(f"delta:{target}", stream=config(uri, tmp_path / "state"))
    tailer = await run_until(config(uri, tmp_path / "state"), sink, latest)
    assert target_changes(target) == expected_changes(uri, 0, latest)
    columns = DeltaTable(target).schema().fields
    assert [f.name for f in columns] == [
        "id",
        "name",
        "part",
        "_change_type",
        "_commit_version",
        "_commit_timestamp",
    ]
    # Each delivery one commit (3 rows at most each), each with the stream's txn.
    history = DeltaTable(target).history()
    assert len(history) > latest and {h["operation"] for h in history} == {"WRITE"}
    app = app_id(STREAM, DeltaTable(uri).metadata().id)
    ours = await deltastream_txns(target)
    assert list(ours) == [app]
    assert ours[app] == DeltaTable(target).transaction_version(app)
    assert decode_position(ours[app]) == tailer.position == Position(latest + 1)


@pytest.mark.anyio
async def test_a_restart_resumes_where_the_target_is_whatever_the_state_says(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A state restored from an older copy (as after a crash between the target's commit and
    the state's): the stream resumes at the target's txn, repeating nothing."""
    uri, target, state = str(tmp_path / "src"), str(tmp_path / "out"), tmp_path / "state"
    create_table(uri, rows=4)
    spec = f"delta:{target}"
    await run_until(config(uri, state), parse_sink(spec), 0)
    old = (state / "position.json").read_bytes()
    for v in range(1, 4):
        write_deltalake(uri, batch(range(10 * v, 10 * v + 4)), mode="append")
    await run_until(config(uri, state), parse_sink(spec), 3)
    (state / "position.json").write_bytes(old)  # the state falls back to version 1
    write_deltalake(uri, batch([99]), mode="append")  # version 4
    with caplog.at_level(logging.WARNING, logger="deltastream"):
        await run_until(config(uri, state), parse_sink(spec), 4)
    assert any("holds the stream's rows up to v4" in r.getMessage() for r in caplog.records)
    assert target_changes(target) == expected_changes(uri, 0, 4)


@pytest.mark.anyio
async def test_a_new_column_in_the_source_reaches_the_target(tmp_path: Path) -> None:
    uri, target = str(tmp_path / "src"), str(tmp_path / "out")
    create_table(uri, rows=4)
    wider = batch([50, 51]).append_column("extra", pa.array([1.5, 2.5]))
    write_deltalake(uri, wider, mode="append", schema_mode="merge")
    for spec in (f"delta:{target}", f"delta:{target}-mirror?mode=merge&key=id"):
        await run_until(config(uri, tmp_path / f"state-{len(spec)}"), parse_sink(spec), 1)
    rows = DeltaTable(target).to_pyarrow_table()
    assert "extra" in rows.column_names
    assert sorted(r["extra"] for r in rows.to_pylist() if r["extra"] is not None) == [1.5, 2.5]
    assert target_changes(target) == expected_changes(uri, 0, 1)
    assert rows_of(f"{target}-mirror", ("id", "extra")) == rows_of(uri, ("id", "extra"))


@pytest.mark.anyio
async def test_a_target_whose_schema_does_not_fit_is_refused_naming_both(tmp_path: Path) -> None:
    uri, target = str(tmp_path / "src"), str(tmp_path / "out")
    create_table(uri, rows=4)
    write_deltalake(target, wrong_schema_table())  # empty: a stream may take it
    with pytest.raises(SinkRejectedError) as caught:
        await Tailer(config(uri, tmp_path / "state"), parse_sink(f"delta:{target}")).run()
    message = str(caught.value)
    assert message.startswith(
        f"delta:{target}: column name of the table at {target} is long, which cannot hold "
        "every value of the source's string: the rows' schema (id long, name string, part "
    )
    assert "does not fit the table's (id long, name long); nothing was committed" in message
    assert DeltaTable(target).version() == 0  # nothing committed
    assert not (tmp_path / "state" / "position.json").read_text().count('"txn"')


@pytest.mark.anyio
async def test_a_target_of_another_stream_is_refused_naming_it(tmp_path: Path) -> None:
    uri, other, target = str(tmp_path / "src"), str(tmp_path / "other"), str(tmp_path / "out")
    create_table(uri, rows=4)
    create_table(other, rows=2)
    await run_until(config(uri, tmp_path / "a"), parse_sink(f"delta:{target}"), 0)
    before = DeltaTable(target).version()
    with pytest.raises(SinkRecoveryError) as caught:
        cfg = config(uri, tmp_path / "b", name="b")
        await Tailer(cfg, parse_sink(f"delta:{target}")).run()
    assert (
        f"the table at {target} is owned by another stream, 's' (txn appId "
        f"'deltastream:s:{DeltaTable(uri).metadata().id}', up to v1)" in str(caught.value)
    )
    # The same stream name on another table: the tailer refuses the table's rows.
    with pytest.raises(SinkRecoveryError, match="the target belongs to another table's stream"):
        await Tailer(config(other, tmp_path / "c"), parse_sink(f"delta:{target}")).run()
    assert DeltaTable(target).version() == before


@pytest.mark.anyio
async def test_a_target_that_lost_the_streams_rows_is_refused(tmp_path: Path) -> None:
    uri, target, state = str(tmp_path / "src"), tmp_path / "out", tmp_path / "state"
    create_table(uri, rows=4)
    await run_until(config(uri, state), parse_sink(f"delta:{target}"), 0)
    shutil.rmtree(target)
    with pytest.raises(SinkRecoveryError, match="holds no rows of stream 's', but its state"):
        await Tailer(config(uri, state), parse_sink(f"delta:{target}")).run()


@pytest.mark.anyio
async def test_a_concurrent_writer_is_retried_without_repeating_rows(tmp_path: Path) -> None:
    target = str(tmp_path / "out")
    sink = DeltaSink(target, base_delay=0.0, max_delay=0.0)
    events: list[Any] = []
    sink.retry_listener = events.append
    assert await sink.recover(StreamRef(STREAM, "state"), None, {}) is None
    first = changes([1, 2, 3], "insert", 1)
    await sink.deliver(delivery(Position(1), Position(2), first))

    # Another writer commits to the target (rewriting a file the sink's view still holds)
    # between the sink's check of the target and its commit: as if after the check.
    async def unchanged(seen: int) -> bool:
        return False

    check = sink._target_changed
    sink._target_changed = unchanged  # type: ignore[method-assign]
    DeltaTable(target).update(predicate="id = 1", updates={"name": "'other'"})
    second = changes([4, 5], "insert", 2)
    state = await sink.deliver(delivery(Position(2), Position(3), second))
    assert [(e.operation, e.attempt) for e in events] == [("commit", 1)]
    assert "CommitFailedError" in events[0].cause
    assert state == {"txn": encode_position(Position(3)), "rows": True}
    ids = sorted(r["id"] for r in DeltaTable(target).to_pyarrow_table().to_pylist())
    assert ids == [1, 2, 3, 4, 5]
    sink._target_changed = check  # type: ignore[method-assign]
    # Delivered again (a tailer that lost its state): the target holds it; not repeated.
    await sink.deliver(delivery(Position(2), Position(3), second))
    assert len(DeltaTable(target).to_pyarrow_table()) == 5


@pytest.mark.anyio
async def test_a_checkpoint_is_written_every_n_commits(tmp_path: Path) -> None:
    target = tmp_path / "out"
    sink = parse_sink(f"delta:{target}?checkpoint_interval=3")
    await sink.recover(StreamRef(STREAM, "state"), None, {})
    for v in range(1, 8):
        await sink.deliver(delivery(Position(v), Position(v + 1), changes([v], "insert", v)))
    checkpoints = sorted(p.name for p in (target / "_delta_log").glob("*.checkpoint.parquet"))
    # Every 3 commits, counting the first (version 0): after versions 2 and 5 of 0..7.
    assert [int(name.split(".")[0]) for name in checkpoints] == [2, 5]
    assert DeltaTable(str(target)).metadata().configuration["delta.checkpointInterval"] == "3"
    assert await deltastream_txns(str(target)) == {
        app_id(STREAM, "tid"): encode_position(Position(8))
    }


# ------------------------------------------------------------------------- merge


@pytest.mark.anyio
@pytest.mark.parametrize("rows_per_delivery", [2, 100_000])
async def test_the_mirror_holds_the_source_rows_as_of_the_delivered_version(
    tmp_path: Path, rows_per_delivery: int
) -> None:
    uri, target = str(tmp_path / "src"), str(tmp_path / "mirror")
    latest = source_with_history(uri, steps=10)
    cfg = config(
        uri,
        tmp_path / "state",
        mode=Mode.SNAPSHOT_AND_FOLLOW,
        start=StartFrom(version=2),
        max_rows_per_delivery=rows_per_delivery,
    )
    sink = parse_sink(f"delta:{target}?mode=merge&key=id")
    await run_until(cfg, sink, latest)
    assert rows_of(target) == rows_of(uri)
    assert [f.name for f in DeltaTable(target).schema().fields] == ["id", "name", "part"]
    app = app_id(STREAM, DeltaTable(uri).metadata().id)
    assert DeltaTable(target).transaction_version(app) == encode_position(Position(latest + 1))
    assert (await deltastream_txns(target))[app] == encode_position(Position(latest + 1))
    # One version at a time: the mirror equals the source's snapshot at each.
    write_deltalake(uri, batch([5000, 5001]), mode="append")
    await run_until(cfg, parse_sink(f"delta:{target}?mode=merge&key=id"), latest + 1)
    assert rows_of(target) == rows_of(uri) and (5000, "x5000", "p2") in rows_of(target)
    DeltaTable(uri).delete("id = 5000")
    await run_until(cfg, parse_sink(f"delta:{target}?mode=merge&key=id"), latest + 2)
    assert rows_of(target) == rows_of(uri) and (5000, "x5000", "p2") not in rows_of(target)


@pytest.mark.anyio
async def test_a_null_or_missing_key_is_refused_and_nothing_committed(tmp_path: Path) -> None:
    uri = str(tmp_path / "src")
    create_table(uri, rows=3)
    nulls = pa.table(
        {
            "id": pa.array([None, 7], pa.int64()),
            "name": pa.array(["n", "m"]),
            "part": pa.array(["p0", "p1"]),
        }
    )
    target = str(tmp_path / "mirror")
    cfg = config(uri, tmp_path / "state", max_rows_per_delivery=100)
    await run_until(cfg, parse_sink(f"delta:{target}?mode=merge&key=id"), 0)
    write_deltalake(uri, nulls, mode="append")  # version 1
    with pytest.raises(SinkRejectedError) as caught:
        await Tailer(cfg, parse_sink(f"delta:{target}?mode=merge&key=id")).run()
    assert str(caught.value) == (
        f"delta:{target}?mode=merge&key=id: merge key column 'id' is null in 1 change row(s) "
        "(version(s) 1); nothing was committed"
    )
    assert rows_of(target) == [(i, f"x{i}", f"p{i % 3}") for i in range(3)]  # version 0 only
    assert DeltaTable(target).version() == 1 and last_operation(target) == "claim"
    with pytest.raises(SinkRejectedError, match=r"merge key column\(s\) nope are not in the rows"):
        cfg = config(uri, tmp_path / "state2")
        await Tailer(cfg, parse_sink(f"delta:{target}-2?mode=merge&key=nope")).run()
    assert not await anyio.Path(f"{target}-2").exists()


# ------------------------------------------------------------------------- S3


@pytest.mark.anyio
async def test_an_s3_target(tmp_path: Path, s3_bucket: Any) -> None:
    uri = str(tmp_path / "src")
    latest = source_with_history(uri, steps=4)
    options = s3_bucket.storage_options
    cfg = config(uri, tmp_path / "state", sink_options=options)
    for spec in ("out", "mirror?mode=merge&key=id"):
        sink = parse_sink(f"delta:{s3_bucket.uri(spec)}", stream=cfg)
        await run_until(replace_state(cfg, tmp_path / spec.partition("?")[0]), sink, latest)
    delta_options = delta_storage_options(s3_bucket.uri(), options)
    out = s3_bucket.uri("out")
    assert target_changes(out, storage_options=delta_options) == expected_changes(uri, 0, latest)
    mirror = DeltaTable(s3_bucket.uri("mirror"), storage_options=delta_options)
    assert sorted((r["id"], r["name"]) for r in mirror.to_pyarrow_table().to_pylist()) == sorted(
        (r[0], r[1]) for r in rows_of(uri)
    )
    app = app_id(STREAM, DeltaTable(uri).metadata().id)
    txns = await deltastream_txns(out, options)
    assert txns[app] == DeltaTable(out, storage_options=delta_options).transaction_version(app)

    # `deltastream reset` reaches the target's store with the --sink-option given to tail.
    command = [sys.executable, "-m", "deltastream", "reset", "--state", str(tmp_path / "out")]
    command += ["--sink", f"delta:{out}", "--name", STREAM]
    command += [f"--sink-option={k}={v}" for k, v in options.items()]
    done = await anyio.run_process(command, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert f"the rows of delta:{out}" in json.loads(done.stdout)["removed"][0]
    assert DeltaTable(out, storage_options=delta_options).to_pyarrow_table().num_rows == 0
    assert (await deltastream_txns(out, options))[app] < 0  # released


def replace_state(cfg: TailConfig, state: Path) -> TailConfig:
    return replace(cfg, state=str(state))


# ------------------------------------------------------------------------- Azure, GCS


async def tail_into_object_store(tmp_path: Path, bucket: Any, options: Mapping[str, str]) -> None:
    """A target in ``bucket``: commits past checkpoints, a restart from an older state that
    repeats nothing, and a mirror; each read back with delta-rs and deltastream."""
    uri, state = str(tmp_path / "src"), tmp_path / "state"
    create_table(uri, rows=4)
    cfg = config(uri, state, sink_options=options)
    out = bucket.uri("out")
    spec = f"delta:{out}?checkpoint_interval=2"
    await run_until(cfg, parse_sink(spec, stream=cfg), 0)
    old = (state / "position.json").read_bytes()
    Writer(uri, 3).run()
    await run_until(cfg, parse_sink(spec, stream=cfg), DeltaTable(uri).version())
    (state / "position.json").write_bytes(old)  # the state falls back to version 1
    write_deltalake(uri, batch([99]), mode="append")
    latest = DeltaTable(uri).version()
    await run_until(cfg, parse_sink(spec, stream=cfg), latest)
    mirror = bucket.uri("mirror")
    mirror_cfg = replace_state(cfg, tmp_path / "mirror-state")
    await run_until(mirror_cfg, parse_sink(f"delta:{mirror}?mode=merge&key=id", stream=cfg), latest)

    delta_options = delta_storage_options(out, options)
    assert target_changes(out, storage_options=delta_options) == expected_changes(uri, 0, latest)
    target = DeltaTable(out, storage_options=delta_options)
    assert target.version() > 2
    async with open_store(out, options) as store:
        log = [m.key async for m in store.list_from("_delta_log/")]
    assert any(key.endswith(".checkpoint.parquet") for key in log)
    app = app_id(STREAM, DeltaTable(uri).metadata().id)
    txns = await deltastream_txns(out, options)
    assert txns[app] == target.transaction_version(app) == encode_position(Position(latest + 1))
    rows = DeltaTable(mirror, storage_options=delta_options).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["name"], r["part"]) for r in rows) == rows_of(uri)


@pytest.mark.anyio
async def test_an_azure_target(
    tmp_path: Path, azure_container: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Azurite, with delta-rs in its emulator mode (``AZURITE_BLOB_STORAGE_URL`` names the
    server, as for the store); outside it, commits after a table's second fail there."""
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", azure_container.endpoint.rsplit("/", 1)[0])
    options = azure_container.storage_options
    assert delta_storage_options(azure_container.uri(), options)["azure_storage_use_emulator"]
    await tail_into_object_store(tmp_path, azure_container, options)


@pytest.mark.anyio
async def test_a_gcs_target(tmp_path: Path, gcs_server: str) -> None:
    """On gcp-storage-emulator behind :class:`gcs_strict.StrictGcs`, which serves the XML
    API that delta-rs (object_store) speaks and checks its conditional writes."""
    from conftest import GcsBucket
    from emulators import gcs_create_bucket
    from gcs_strict import StrictGcs

    with StrictGcs(gcs_server) as proxy:
        bucket = GcsBucket(proxy.url, f"test-{uuid.uuid4().hex[:12]}")
        gcs_create_bucket(gcs_server, bucket.name)
        await tail_into_object_store(tmp_path, bucket, bucket.storage_options)
        assert proxy.requests["PUT"] > 0 and proxy.requests["HEAD"] + proxy.requests["GET"] > 0


@pytest.mark.anyio
async def test_a_failed_commit_that_the_target_holds_is_not_repeated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The txns are read again after a failure: a delivery whose commit landed although
    the call failed (a lost response) is not committed twice."""
    target = str(tmp_path / "mirror")
    spec = f"{target}?mode=merge&key=id"
    sink = DeltaSink(spec, base_delay=0.0)
    events: list[Any] = []
    sink.retry_listener = events.append
    await sink.recover(StreamRef(STREAM, "state"), None, {})
    await sink.deliver(delivery(Position(1), Position(2), changes([1, 2], "insert", 1)))
    real = sink._commit

    def landed_but_lost(*args: Any) -> None:
        real(*args)
        raise OSError("connection reset by peer")

    sink._commit = landed_but_lost  # type: ignore[method-assign]
    update_rows = pa.concat_tables(
        [changes([1], "update_preimage", 2), changes([1], "update_postimage", 2, name="y")]
    )
    version = DeltaTable(target).version()
    with caplog.at_level(logging.WARNING, logger="deltastream"):
        update = delivery(Position(2), Position(4), update_rows)
        assert await sink.deliver(update) == {"txn": encode_position(Position(4)), "rows": True}
    assert events == [] and DeltaTable(target).version() == version + 1
    assert any("but the target holds it: not repeated" in r.getMessage() for r in caplog.records)
    assert rows_of(target) == [(1, "y1", "p1"), (2, "x2", "p2")]


# ------------------------------------------------------------------------- set-up errors


def test_without_deltalake_the_sink_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "deltalake", None)  # as if not installed
    with pytest.raises(InvalidArgumentError) as caught:
        parse_sink("delta:/lake/t")
    assert str(caught.value) == (
        "delta:/lake/t: this sink needs the delta extra: pip install "
        "'deltastream[delta]' (missing: deltalake)"
    )


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltastream", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def the_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("deltastream: error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_the_command_line_reports_a_delta_sink_failure_in_one_line(tmp_path: Path) -> None:
    uri, target, state = str(tmp_path / "src"), str(tmp_path / "out"), str(tmp_path / "s")
    create_table(uri, rows=3)
    write_deltalake(target, wrong_schema_table())
    tail = ("tail", uri, "--mode", "follow", "--from", "0", "--state", state)
    done = run_cli(*tail, "--sink", f"delta:{target}")
    assert the_error(done).startswith(
        f"deltastream: error: delta:{target}: column name of the table at {target} is long, "
    )
    # --sink-option reaches the sink: S3 settings for a local target are refused.
    done = run_cli(*tail, "--sink", f"delta:{target}-2", "--sink-option", "region=x")
    assert the_error(done) == (
        f"deltastream: error: {target}-2: storage options ['region'] only apply to tables in "
        "object stores (s3://, gs://, Azure)"
    )


def test_azure_and_gcs_settings_reach_delta_rs_in_its_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Azurite where delta-rs's emulator mode looks for it (AZURITE_BLOB_STORAGE_URL, by
    # default 127.0.0.1:10000): that mode, which lists the log without startFrom.
    monkeypatch.delenv("AZURITE_BLOB_STORAGE_URL", raising=False)
    emulator = {"endpoint_url": "http://127.0.0.1:10000/devstoreaccount1", "use_emulator": "true"}
    in_emulator_mode = {
        "azure_storage_account_name": "devstoreaccount1",
        "azure_storage_account_key": EMULATOR_KEY,
        "azure_storage_use_emulator": "true",
    }
    assert delta_storage_options("az://c/t", emulator) == in_emulator_mode
    assert delta_storage_options("az://c/t", {"use_emulator": "true"}) == in_emulator_mode
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", "http://127.0.0.1:9/")
    assert delta_storage_options("az://c/t", {"use_emulator": "true"}) == in_emulator_mode
    # Elsewhere: the endpoint as given (Azurite there must honour startFrom: 3.37.0 on).
    assert delta_storage_options("az://c/t", emulator) == {
        "azure_storage_account_name": "devstoreaccount1",
        "azure_storage_account_key": EMULATOR_KEY,
        "azure_endpoint": "http://127.0.0.1:10000/devstoreaccount1",
        "azure_allow_http": "true",
    }
    uri = "abfss://c@acct.dfs.core.windows.net/t"
    assert delta_storage_options(uri, {"sas_token": "sv=1"}) == {
        "azure_storage_account_name": "acct",
        "azure_storage_sas_key": "sv=1",
    }
    # GCS: an endpoint is object_store's base URL; unsigned, its uploads carry an empty token.
    no_oauth = {"disable_oauth": True, "client_email": "", "private_key": "", "private_key_id": ""}
    unsigned = {"google_skip_signature": "true", "google_service_account_key": json.dumps(no_oauth)}
    assert delta_storage_options("gs://b/t", {"skip_signature": "true"}) == unsigned
    assert delta_storage_options("gs://b/t", {"endpoint_url": "http://127.0.0.1:9"}) == {
        "google_base_url": "http://127.0.0.1:9",
        **unsigned,
    }


@pytest.mark.anyio
async def test_another_writers_commit_under_a_running_stream_costs_no_retry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A writer rewrites a file of the change log while the stream runs (an update that
    changes no value), then compacts it and vacuums the files it replaced: the stream's
    next delivery finds the target changed, loads it again and commits (no retry, nothing
    logged), and every change row is in the target once."""
    uri, target = str(tmp_path / "src"), str(tmp_path / "out")
    create_table(uri, rows=9)
    tailer = Tailer(config(uri, tmp_path / "state"), parse_sink(f"delta:{target}"))
    with caplog.at_level(logging.WARNING, logger="deltastream"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(tailer.run)
            await eventually(lambda: (tailer.position or Position(-1)) >= Position(1))
            owner = DeltaTable(target)
            owner.update(predicate="id = 0", updates={"name": "name"})
            owner.optimize.compact()
            owner.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
            write_deltalake(uri, batch(range(10, 13)), mode="append")  # version 1
            await eventually(lambda: (tailer.position or Position(-1)) >= Position(2))
            tailer.stop()
    assert tailer.metrics.sink_retries == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert target_changes(target) == expected_changes(uri, 0, 1)


@pytest.mark.anyio
async def test_a_dropped_source_column_stops_the_stream_naming_both_schemas(
    tmp_path: Path,
) -> None:
    """Followed past a non-additive change (``on_schema_change="continue"``: the table
    overwritten without its ``name`` column), rows that lack a column of the target do not
    fit it: the stream stops, committing nothing."""
    uri, target = str(tmp_path / "src"), str(tmp_path / "out")
    create_table(uri, rows=3)
    cfg = config(uri, tmp_path / "state", on_schema_change="continue", max_rows_per_delivery=100)
    await run_until(cfg, parse_sink(f"delta:{target}"), 0)
    narrower = pa.table({"id": pa.array([5], pa.int64()), "part": ["p2"]})
    write_deltalake(uri, narrower, mode="overwrite", schema_mode="overwrite")
    before = DeltaTable(target).version()
    with pytest.raises(SinkRejectedError) as caught:
        await Tailer(cfg, parse_sink(f"delta:{target}")).run()
    message = str(caught.value)
    assert "the rows' schema (id long, part string, _change_type string" in message
    assert "(id long, name string, part string, _change_type string" in message
    # Only the restarted stream's claim of the table (its epoch, no rows).
    assert DeltaTable(target).version() == before + 1 and last_operation(target) == "claim"


@pytest.mark.anyio
async def test_partition_by_partitions_a_new_target_and_must_match_an_existing_one(
    tmp_path: Path,
) -> None:
    uri, target = str(tmp_path / "src"), str(tmp_path / "out")
    create_table(uri, rows=6)
    await run_until(config(uri, tmp_path / "a"), parse_sink(f"delta:{target}?partition_by=part"), 0)
    assert DeltaTable(target).metadata().partition_columns == ["part"]
    assert target_changes(target) == expected_changes(uri, 0, 0)
    with pytest.raises(SinkRejectedError, match=r"is partitioned by \(part\), not by \(name\)"):
        spec = f"delta:{target}-2?partition_by=name"
        write_deltalake(f"{target}-2", batch([]), partition_by=["part"])
        await Tailer(config(uri, tmp_path / "b"), parse_sink(spec)).run()


def test_two_streams_of_one_file_cannot_share_a_target(tmp_path: Path) -> None:
    tables = [
        {"name": n, "uri": "/t", "sink": f"delta:{tmp_path}/out{q}", "state": f"/s/{n}"}
        for n, q in (("a", ""), ("b", "?mode=merge&key=id"))
    ]
    with pytest.raises(InvalidArgumentError) as caught:
        parse_config({"tables": tables}, "c.toml")
    assert str(caught.value) == (
        f"c.toml: streams 'a' and 'b' write to the same output (delta:{tmp_path}/out); each "
        "stream needs its own sink output"
    )


@pytest.mark.anyio
@pytest.mark.parametrize("rows_per_delivery", [1, 100])
async def test_a_commit_replacing_rows_keeps_them_in_the_mirror(
    tmp_path: Path, rows_per_delivery: int
) -> None:
    """An overwrite of a partition (delete and insert of the same keys in one commit),
    within one delivery and split across deliveries one row each."""
    uri, target = str(tmp_path / "src"), str(tmp_path / "mirror")
    create_table(uri, rows=9)
    write_deltalake(uri, batch([1, 4, 7], name="new"), mode="overwrite", predicate="part = 'p1'")
    cfg = config(uri, tmp_path / "state", max_rows_per_delivery=rows_per_delivery)
    await run_until(cfg, parse_sink(f"delta:{target}?mode=merge&key=id"), 1)
    assert rows_of(target) == rows_of(uri) and (4, "new4", "p1") in rows_of(target)


# ------------------------------------------------------------------------- reset


async def reset(name: str, spec: str, state: Path) -> list[str]:
    async with parse_sink(spec) as sink:
        return await reset_stream(name, sink, str(state))


def last_commit(uri: str) -> dict[str, Any]:
    return DeltaTable(uri).history(1)[0]


@pytest.mark.anyio
@pytest.mark.parametrize("query", ["", "?mode=merge&key=id"])
async def test_a_reset_removes_the_rows_and_releases_the_txn_in_one_commit(
    tmp_path: Path, query: str
) -> None:
    """Then the stream starts afresh into the same target: every change row once (a
    mirror: the source's rows), and a second reset is harmless."""
    uri, target, state = str(tmp_path / "src"), str(tmp_path / "out"), tmp_path / "state"
    latest = source_with_history(uri)
    spec = f"delta:{target}{query}"
    await run_until(config(uri, state), parse_sink(spec), latest)
    held = DeltaTable(target)
    before, rows = held.version(), held.to_pyarrow_table().num_rows
    app = app_id(STREAM, DeltaTable(uri).metadata().id)
    assert rows and (await deltastream_txns(target))[app] == encode_position(Position(latest + 1))

    removed = await reset(STREAM, spec, state)
    assert removed[0] == f"the rows of delta:{target} ({rows} rows, commit v{before + 1})"
    assert f"{state}/position.json" in removed[1:]
    assert DeltaTable(target).version() == before + 1  # one commit: the rows and the txn
    assert last_commit(target)["operation"] == "DELETE"
    assert DeltaTable(target).to_pyarrow_table().num_rows == 0
    assert await deltastream_txns(target) == {app: RELEASED}
    assert DeltaTable(target).transaction_version(app) == RELEASED
    assert not (state / "reset.json").exists()

    # Twice: nothing of the stream's is left, nothing is committed.
    assert await reset(STREAM, spec, state) == []
    assert DeltaTable(target).version() == before + 1

    tailer = await run_until(config(uri, state), parse_sink(spec), latest)
    assert tailer.position == Position(latest + 1)
    if query:
        assert rows_of(target) == rows_of(uri)
    else:
        assert target_changes(target) == expected_changes(uri, 0, latest)
    assert await deltastream_txns(target) == {app: encode_position(Position(latest + 1))}


@pytest.mark.anyio
async def test_a_reset_of_a_target_with_no_rows_left_releases_its_txn(tmp_path: Path) -> None:
    """The stream's rows deleted by another writer: delta-rs's delete has nothing to remove
    and commits nothing, so the reset commits the released txn alone."""
    target = str(tmp_path / "out")
    sink = DeltaSink(target)
    await sink.recover(StreamRef(STREAM, "state"), None, {})
    await sink.deliver(delivery(Position(1), Position(2), changes([1, 2], "insert", 1)))
    DeltaTable(target).delete("id > 0")
    version = DeltaTable(target).version()
    removed = await DeltaSink(target).reset(StreamRef(STREAM, "state"))
    assert removed == [f"the rows of delta:{target} (0 rows, commit v{version + 1})"]
    assert DeltaTable(target).version() == version + 1
    assert await deltastream_txns(target) == {app_id(STREAM, "tid"): RELEASED}


@pytest.mark.anyio
async def test_a_reset_of_another_streams_target_is_refused_touching_nothing(
    tmp_path: Path,
) -> None:
    uri, target = str(tmp_path / "src"), str(tmp_path / "out")
    create_table(uri, rows=4)
    await run_until(config(uri, tmp_path / "a"), parse_sink(f"delta:{target}"), 0)
    before = DeltaTable(target).version()
    other = tmp_path / "b"
    other.mkdir()
    (other / "keep").write_text("b's")
    with pytest.raises(SinkInUseError) as caught:
        await reset("b", f"delta:{target}", other)
    assert str(caught.value) == (
        f"delta:{target}: the table at {target} is owned by another stream, 's' (txn appId "
        f"'deltastream:s:{DeltaTable(uri).metadata().id}', up to v1); a delta target holds "
        "one stream's rows: a reset of 'b' leaves it alone; nothing was touched. To start "
        "'s' over, reset that stream"
    )
    assert DeltaTable(target).version() == before
    assert target_changes(target) == expected_changes(uri, 0, 0)
    assert sorted(p.name for p in other.iterdir()) == ["keep"]  # no reset recorded
    # The owner's own reset goes on as usual.
    await run_until(config(uri, tmp_path / "a"), parse_sink(f"delta:{target}"), 0)


@pytest.mark.anyio
async def test_a_table_holding_rows_no_stream_accounts_for_is_refused_at_start(
    tmp_path: Path,
) -> None:
    """Neither appended nor merged into, and a reset leaves it as it is."""
    uri, target, state = str(tmp_path / "src"), str(tmp_path / "out"), tmp_path / "state"
    create_table(uri, rows=4)
    write_deltalake(target, batch([1, 2, 3]))
    write_deltalake(target, batch([4]), mode="append")
    for spec in (f"delta:{target}", f"delta:{target}?mode=merge&key=id"):
        with pytest.raises(SinkRecoveryError) as caught:
            await Tailer(config(uri, state), parse_sink(spec)).run()
        assert str(caught.value) == (
            f"{spec}: the table at {target} holds rows that no stream's txn accounts for (4 "
            "row(s) in 2 data file(s)); deltastream writes only to a new or empty Delta "
            "table, or one it owns: name another target, or empty this one"
        )
    assert DeltaTable(target).version() == 1
    assert await reset(STREAM, f"delta:{target}", state) == []
    assert DeltaTable(target).version() == 1 and rows_of(target)[0] == (1, "x1", "p1")


@pytest.mark.anyio
async def test_an_empty_table_made_beforehand_is_taken_with_its_properties(
    tmp_path: Path,
) -> None:
    uri, target = str(tmp_path / "src"), str(tmp_path / "out")
    latest = source_with_history(uri, steps=3)
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("name", pa.string()),
            ("part", pa.string()),
            ("_change_type", pa.string()),
            ("_commit_version", pa.int64()),
            ("_commit_timestamp", pa.timestamp("us", tz="UTC")),
        ]
    )
    retention = {"delta.logRetentionDuration": "interval 7 days"}
    DeltaTable.create(target, schema, partition_by=["part"], configuration=retention)
    await run_until(config(uri, tmp_path / "state"), parse_sink(f"delta:{target}"), latest)
    assert target_changes(target) == expected_changes(uri, 0, latest)
    metadata = DeltaTable(target).metadata()
    assert metadata.configuration == retention and metadata.partition_columns == ["part"]


@pytest.mark.anyio
async def test_a_released_table_can_be_taken_by_another_stream(tmp_path: Path) -> None:
    uri, target = str(tmp_path / "src"), str(tmp_path / "out")
    create_table(uri, rows=5)
    spec = f"delta:{target}"
    await run_until(config(uri, tmp_path / "a"), parse_sink(spec), 0)
    await reset(STREAM, spec, tmp_path / "a")
    await run_until(config(uri, tmp_path / "b", name="b"), parse_sink(spec), 0)
    table_id = DeltaTable(uri).metadata().id
    assert await deltastream_txns(target) == {
        app_id(STREAM, table_id): RELEASED,
        app_id("b", table_id): encode_position(Position(1)),
    }
    assert target_changes(target) == expected_changes(uri, 0, 0)
    # Now 'b''s: the released stream is refused like any other.
    with pytest.raises(SinkRecoveryError, match="is owned by another stream, 'b'"):
        await Tailer(config(uri, tmp_path / "a"), parse_sink(spec)).run()


@pytest.mark.anyio
async def test_rows_written_into_a_released_table_are_refused_at_start(tmp_path: Path) -> None:
    uri, target = str(tmp_path / "src"), str(tmp_path / "out")
    create_table(uri, rows=3)
    await run_until(config(uri, tmp_path / "a"), parse_sink(f"delta:{target}"), 0)
    await reset(STREAM, f"delta:{target}", tmp_path / "a")
    await run_until(config(uri, tmp_path / "b", name="b"), parse_sink(f"delta:{target}-2"), 0)
    rows = DeltaTable(f"{target}-2").to_pyarrow_table()
    write_deltalake(target, rows, mode="append")  # copied in by hand
    version = DeltaTable(target).version()
    for name in (STREAM, "c"):
        with pytest.raises(SinkRecoveryError, match="holds rows that no stream's txn accounts"):
            cfg = config(uri, tmp_path / name, name=name)
            await Tailer(cfg, parse_sink(f"delta:{target}")).run()
    assert DeltaTable(target).version() == version


@pytest.mark.anyio
async def test_a_reset_under_a_running_stream_stops_it_before_it_commits_again(
    tmp_path: Path,
) -> None:
    """A Delta target has no lock a reset could wait for: the stream's next commit loses to
    the reset's, and the txn read after it says the stream's position is gone."""
    uri, target = str(tmp_path / "src"), str(tmp_path / "out")
    create_table(uri, rows=3)
    tailer = Tailer(config(uri, tmp_path / "state"), parse_sink(f"delta:{target}"))
    failures: list[BaseException] = []

    async def run() -> None:
        try:
            await tailer.run()
        except SinkRecoveryError as e:
            failures.append(e)

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await eventually(lambda: (tailer.position or Position(-1)) >= Position(1))
        await DeltaSink(target).reset(StreamRef(STREAM, "elsewhere"))
        write_deltalake(uri, batch([10, 11]), mode="append")
        await eventually(lambda: bool(failures))
    message = str(failures[0])
    assert "found the target changed by another writer: the table at" in message
    assert "(its txn: released)" in message
    assert message.endswith(
        "reset or replaced while the stream ran; nothing was committed. to discard the "
        "stream's output and start over: deltastream reset --state "
        f"{tmp_path / 'state'} --sink delta:{target} --name s"
    )
    assert DeltaTable(target).to_pyarrow_table().num_rows == 0


def test_rows_are_counted_from_the_log() -> None:
    def file(stats: str | None, deleted: int | None = None) -> dict[str, Any]:
        dv = None if deleted is None else {"storageType": "u", "cardinality": deleted}
        return {"path": "f", "stats": stats, "deletionVector": dv}

    def count(*files: dict[str, Any]) -> tuple[int, int | None]:
        return rows_in(pa.Table.from_pylist(list(files), schema=FILES_SCHEMA))

    assert count() == (0, 0)
    assert count(file('{"numRecords":0}'), file('{"numRecords":4}', deleted=4)) == (0, 0)
    assert count(file('{"numRecords":3}'), file('{"numRecords":4}', deleted=1)) == (2, 6)
    assert count(file('{"numRecords":0}'), file(None)) == (1, None)
    assert count(file("{}")) == (1, None)


@pytest.mark.anyio
async def test_a_state_older_than_the_reset_is_refused_saying_so(tmp_path: Path) -> None:
    """A copy of the state taken before the reset still says rows were committed: the
    target, emptied and released, does not hold them."""
    uri, target, state = str(tmp_path / "src"), str(tmp_path / "out"), tmp_path / "state"
    create_table(uri, rows=3)
    await run_until(config(uri, state), parse_sink(f"delta:{target}"), 0)
    shutil.copytree(state, tmp_path / "copy")
    await reset(STREAM, f"delta:{target}", state)
    with pytest.raises(SinkRecoveryError) as caught:
        await Tailer(config(uri, tmp_path / "copy"), parse_sink(f"delta:{target}")).run()
    assert (
        "but its state in "
        f"{tmp_path / 'copy'} says rows up to v1 were committed there: the stream's rows were "
        "removed by a reset (its txn is released); nothing was touched" in str(caught.value)
    )


@pytest.mark.anyio
async def test_a_sink_whose_target_was_reset_under_it_commits_nothing(tmp_path: Path) -> None:
    """Whether the sink's view of the target is from before the reset (its commit loses to
    the reset's) or loaded after it (the txn it finds is released)."""
    target = str(tmp_path / "out")
    stale, fresh = DeltaSink(target, base_delay=0.0), DeltaSink(target, base_delay=0.0)
    await stale.recover(StreamRef(STREAM, "state"), None, {})
    await stale.deliver(delivery(Position(1), Position(2), changes([1, 2], "insert", 1)))
    await fresh.recover(StreamRef(STREAM, "state"), Position(2), {})
    await DeltaSink(target).reset(StreamRef(STREAM, "state"))
    version = DeltaTable(target).version()
    later = delivery(Position(2), Position(3), changes([3], "insert", 2))
    for sink in (fresh, stale):
        with pytest.raises(SinkRecoveryError) as caught:
            await sink.deliver(later)
        assert str(caught.value).endswith(
            f"the table at {target} no longer holds the stream's position v2 (its txn: "
            "released): the target was reset or replaced while the stream ran; nothing was "
            "committed. to discard the stream's output and start over: deltastream reset "
            f"--state state --sink delta:{target} --name s"
        )
    assert str(caught.value).startswith(f"delta:{target}: the commit of 1 rows of s (v2 to v3) ")
    assert DeltaTable(target).version() == version
    assert DeltaTable(target).to_pyarrow_table().num_rows == 0
