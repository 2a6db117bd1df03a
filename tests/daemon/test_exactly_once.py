"""The exactly-once scenarios users hit: stops inside one version or one snapshot, and
committed output that recovery must never destroy (a lost or damaged state, a sink shared by
two streams). Each runs the real tailer, and the command line where the user would."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from tailing import CDF, SMALL_GROUPS, batch, change_key, run_tailer_until

from deltastream.cli import run
from deltastream.daemon.crashpoints import CRASH_ENV, CRASH_EXIT_STATUS
from deltastream.daemon.delivery import Position, StreamRef
from deltastream.daemon.service.config import parse_config
from deltastream.daemon.sinks import parse_sink
from deltastream.daemon.sinks.marker import OutputMarker
from deltastream.daemon.stream.tailer import Mode, StartFrom, TailConfig, Tailer
from deltastream.errors import InvalidArgumentError


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    """v0: 10 rows; v1: 120 rows in 30 row groups; v2: an update."""
    uri = str(tmp_path_factory.mktemp("exactly-once") / "table")
    write_deltalake(uri, batch(range(10)), partition_by=["part"], configuration=CDF)
    write_deltalake(uri, batch(range(100, 220)), mode="append", writer_properties=SMALL_GROUPS)
    DeltaTable(uri).update(
        predicate="id % 5 = 0",
        updates={"name": "concat(name, '+')"},
        writer_properties=SMALL_GROUPS,
    )
    return uri


def expected(uri: str, mode: Mode) -> Counter[tuple[Any, ...]]:
    t = DeltaTable(uri)
    if mode is Mode.SNAPSHOT:
        rows = pa.table(t.to_pyarrow_table()).to_pylist()
        return Counter(
            change_key({**r, "_commit_version": t.version(), "_change_type": "insert"})
            for r in rows
        )
    cdf = pa.table(t.load_cdf(starting_version=1, ending_version=t.version()))
    return Counter(change_key(r) for r in cdf.to_pylist())


def sink_rows(spec: str) -> list[dict[str, Any]]:
    kind, _, where = spec.partition(":")
    if kind == "jsonl":
        return [json.loads(line) for line in Path(where).read_text().splitlines()]
    files = sorted(Path(where).glob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def stop_after_deliveries(tailer: Tailer, sink: Any, count: int) -> None:
    """Ask ``tailer`` to stop as the sink acknowledges its ``count``-th delivery: a stop at
    an exact point, however fast the deliveries come."""
    deliver = sink.deliver
    done = 0

    async def counting(delivery: Any) -> Any:
        nonlocal done
        state = await deliver(delivery)
        done += 1
        if done >= count:
            tailer.stop()
        return state

    sink.deliver = counting


@pytest.mark.parametrize("mode", [Mode.FOLLOW, Mode.SNAPSHOT])
@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
@pytest.mark.anyio
async def test_stopped_twice_inside_one_version_or_snapshot_every_row_arrives_once(
    table: str, mode: Mode, kind: str, tmp_path: Path
) -> None:
    spec = f"{kind}:{tmp_path / ('out.jsonl' if kind == 'jsonl' else 'out')}"
    config = TailConfig(
        name="t",
        uri=table,
        state=str(tmp_path / "state"),
        mode=mode,
        start=StartFrom(version=1 if mode is Mode.FOLLOW else 2),
        poll_interval=0.02,
        notifications=False,
        max_rows_per_delivery=1,
    )
    latest = DeltaTable(table).version()
    positions = []
    for deliveries in (4, 3):  # stopped (as by SIGTERM) inside version 1 / the snapshot, twice
        async with parse_sink(spec, table="t") as sink:
            tailer = Tailer(config, sink)
            stop_after_deliveries(tailer, sink, deliveries)
            await tailer.run()
        assert tailer.position is not None and tailer.position.offset > 0
        positions.append(tailer.position)
    assert positions[0] < positions[1] and positions[0].version == positions[1].version

    def done(t: Tailer) -> bool:
        p = t.position
        return p is not None and not p.snapshot and p.version > latest

    async with parse_sink(spec, table="t") as sink:
        if mode is Mode.SNAPSHOT:
            await Tailer(config, sink).run()  # returns once delivered
        else:
            await run_tailer_until(config, sink, done)
    rows = sink_rows(spec)
    assert Counter(change_key(r) for r in rows) == expected(table, mode)
    assert len(rows) == sum(expected(table, mode).values())


# ------------------------------------------------------------------ committed output is kept


def tail(*args: str) -> int:
    return run(["tail", *args, "--progress", "never"])


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(err) == 1, err
    return err[0]


@pytest.fixture
def delivered(table: str, tmp_path: Path) -> tuple[str, Path, Path, bytes]:
    """A snapshot stream delivered to a jsonl file in several deliveries: (table, state,
    output, its bytes)."""
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    args = ("--mode", "snapshot", "--max-rows-per-delivery", "10")
    assert tail(table, *args, "--state", str(state), "--sink", f"jsonl:{out}") == 0
    return table, state, out, out.read_bytes()


@pytest.mark.parametrize("how", ["empty", "mistyped"])
def test_a_missing_state_refuses_and_keeps_the_output(
    delivered: tuple[str, Path, Path, bytes],
    how: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    table, _, out, content = delivered
    other = tmp_path / ("empty-state" if how == "empty" else "stat")
    if how == "empty":
        other.mkdir()
    capsys.readouterr()
    assert tail(table, "--mode", "snapshot", "--state", str(other), "--sink", f"jsonl:{out}") == 2
    line = one_line_error(capsys)
    assert str(out) in line and str(other) in line and "deltastream reset" in line
    assert out.read_bytes() == content


def test_a_position_json_that_is_a_directory_is_an_error(
    delivered: tuple[str, Path, Path, bytes],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    table, _, out, content = delivered
    state = tmp_path / "state2"
    (state / "position.json").mkdir(parents=True)
    new_out = tmp_path / "new.jsonl"
    capsys.readouterr()
    args = ("--mode", "snapshot", "--state", str(state))
    assert tail(table, *args, "--sink", f"jsonl:{new_out}") == 2
    assert "position.json: is a directory" in one_line_error(capsys)
    # ... and with output already there, that output is refused, not wiped.
    assert tail(table, *args, "--sink", f"jsonl:{out}") == 2
    assert out.read_bytes() == content


def test_a_lost_position_with_saved_snapshots_is_an_error(
    delivered: tuple[str, Path, Path, bytes],
    capsys: pytest.CaptureFixture[str],
) -> None:
    table, state, out, content = delivered
    assert list((state / "snapshots").glob("*.checkpoint.parquet"))  # saved at the end
    (state / "position.json").unlink()
    capsys.readouterr()
    args = ("--mode", "snapshot", "--state", str(state), "--sink", f"jsonl:{out}")
    assert tail(table, *args) == 2
    line = one_line_error(capsys)
    assert "position.json: is missing" in line and "holds saved table states" in line
    assert out.read_bytes() == content


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"bytes": 0}, "cannot prove it wrote after that commit"),
        ({"bytes": 10**9}, "were committed"),
        ({"bytes": 12, "tail": "0" * 32}, "is not the output the state"),
    ],
)
def test_a_damaged_committed_size_refuses_and_keeps_the_output(
    delivered: tuple[str, Path, Path, bytes],
    edit: dict[str, Any],
    problem: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    table, state, out, content = delivered
    position = state / "position.json"
    value = json.loads(position.read_text())
    value["sink"] = edit
    value["position"]["offset"] = 0
    value["position"]["snapshot"] = True
    value["position"]["version"] -= 1
    position.write_text(json.dumps(value))
    capsys.readouterr()
    args = ("--mode", "snapshot", "--state", str(state), "--sink", f"jsonl:{out}")
    assert tail(table, *args) == 2
    line = one_line_error(capsys)
    assert problem in line and str(out) in line
    assert out.read_bytes() == content


def test_parquet_output_is_kept_when_the_state_is_missing_or_older(
    table: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, out = tmp_path / "state", tmp_path / "out"
    args = ("--mode", "snapshot", "--max-rows-per-delivery", "10", "--sink", f"parquet:{out}")
    assert tail(table, *args, "--state", str(state)) == 0
    files = {f.name: f.read_bytes() for f in out.iterdir()}
    assert len([n for n in files if n.endswith(".parquet")]) > 2
    # A mistyped state directory, then a position.json restored from an older copy.
    position = state / "position.json"
    value = json.loads(position.read_text())
    value["position"] = {"version": value["position"]["version"] - 1, "snapshot": True, "offset": 0}
    for where, edit in ((tmp_path / "stat", False), (state, True)):
        if edit:
            position.write_text(json.dumps(value))
        capsys.readouterr()
        assert tail(table, *args, "--state", str(where)) == 2
        line = one_line_error(capsys)
        assert str(out) in line and str(where) in line and "nothing was touched" in line
        assert {f.name: f.read_bytes() for f in out.iterdir()} == files


def test_reset_starts_a_stream_over_knowingly(
    delivered: tuple[str, Path, Path, bytes],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    table, state, out, content = delivered
    other = tmp_path / "fresh-state"
    args = ("--mode", "snapshot", "--sink", f"jsonl:{out}")
    assert tail(table, "--state", str(other), *args) == 2  # refused: output exists
    assert tail(table, "--state", str(other), *args, "--reset") == 0
    assert out.read_bytes() == content  # delivered afresh, once
    capsys.readouterr()
    assert run(["reset", "--state", str(state), "--sink", f"jsonl:{out}", "--name", "table"]) == 0
    removed = json.loads(capsys.readouterr().out)["removed"]
    assert any(str(out) in r for r in removed) and any("position.json" in r for r in removed)
    assert not out.exists() and not (state / "position.json").exists()
    assert tail(table, "--state", str(state), *args) == 0
    assert out.read_bytes() == content


#: What every start of a stream writes to its state before anything else, even a start the
#: sink then refuses: the claim of the stream (its next epoch, by this process, now).
CLAIM_FIELDS = ("epoch", "owner", "updated_ms")


def files_of(*directories: Path) -> dict[str, bytes]:
    """Every file's bytes, a state's ``position.json`` less its claim (:data:`CLAIM_FIELDS`)."""
    out = {}
    for d in directories:
        for p in sorted(d.rglob("*")):
            if not p.is_file():
                continue
            data = p.read_bytes()
            if p.name == "position.json":
                state = {k: v for k, v in json.loads(data).items() if k not in CLAIM_FIELDS}
                data = json.dumps(state, sort_keys=True).encode()
            out[str(p)] = data
    return out


def test_a_committed_parquet_file_deleted_by_hand_stops_the_stream(
    table: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's reproduction without a reset: the stream used to resume, rows missing."""
    state, out = tmp_path / "state", tmp_path / "out"
    args = ("--mode", "snapshot", "--max-rows-per-delivery", "10", "--name", "events")
    args += ("--state", str(state), "--sink", f"parquet:{out}")
    assert tail(table, *args) == 0
    files = sorted(out.glob("*.parquet"))
    assert len(files) > 5
    gone = files[2]
    size, total = gone.stat().st_size, sum(f.stat().st_size for f in files)
    gone.unlink()
    kept = files_of(out, state)
    position = Position.from_json(json.loads((state / "position.json").read_text())["position"])
    capsys.readouterr()
    assert tail(table, *args) == 2
    assert one_line_error(capsys) == (
        f"deltastream: error: {out}: holds {len(files) - 1} file(s) ({total - size} bytes) of "
        f"stream 'events' before the committed position ({position}) in {state}, but "
        f"{len(files)} ({total} bytes) were committed: committed output was removed or changed "
        f"behind the stream's back; missing: {gone.name}; nothing was touched. Restore the "
        "files, or to discard the stream's output and start over: "
        + StreamRef("events", str(state)).reset_command(f"parquet:{out}")
    )
    assert files_of(out, state) == kept


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_reset_killed_half_way_blocks_tail_until_reset_again(
    table: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue: ``reset`` killed after the first output file is gone, the state still there.
    ``tail`` now refuses (exit 2, one line), touching nothing, until ``reset`` is run again."""
    state = tmp_path / "state"
    spec = f"jsonl:{tmp_path / 'out.jsonl'}" if kind == "jsonl" else f"parquet:{tmp_path / 'out'}"
    args = ("--mode", "snapshot", "--max-rows-per-delivery", "10", "--name", "events")
    args += ("--state", str(state), "--sink", spec)
    assert tail(table, *args) == 0
    reset = ["reset", "--state", str(state), "--sink", spec, "--name", "events"]
    killed = subprocess.run(
        [sys.executable, "-m", "deltastream", *reset],
        env={**os.environ, CRASH_ENV: "reset.output-file:1"},
        capture_output=True,
        text=True,
    )
    assert killed.returncode == CRASH_EXIT_STATUS, killed.stderr
    assert (state / "position.json").exists()  # the state is still there
    left = files_of(tmp_path)
    capsys.readouterr()
    assert tail(table, *args) == 2
    command = shlex.join(["deltastream", *reset])
    assert one_line_error(capsys) == (
        f"deltastream: error: {state}/reset.json: a reset of stream 'events' (sink {spec}) was "
        f"started and did not finish: the stream's output and state in {state} may be partly "
        "removed, so the stream cannot resume from them; run the reset again to finish it: "
        + command
    )
    assert files_of(tmp_path) == left
    if kind == "parquet":
        # Even with the reset's record lost, the stream would not resume past the hole.
        record = (state / "reset.json").read_bytes()
        (state / "reset.json").unlink()
        capsys.readouterr()
        assert tail(table, *args) == 2
        line = one_line_error(capsys)
        assert "committed output was removed or changed" in line and "missing: events-" in line
        (state / "reset.json").write_bytes(record)
    assert run(reset) == 0
    assert not (state / "reset.json").exists()
    assert tail(table, *args) == 0
    rows = sink_rows(spec)
    assert Counter(change_key(r) for r in rows) == expected(table, Mode.SNAPSHOT)
    assert len(rows) == sum(expected(table, Mode.SNAPSHOT).values())


def test_a_reset_never_removes_another_streams_output(
    table: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reset of stream B pointed at stream A's output: A's parquet files (its directory
    is shared) and A's jsonl file (B's reset is refused, touching nothing) are kept, and A
    resumes. A reset refused because the stream runs leaves nothing behind either."""
    out_dir, out_file = tmp_path / "out", tmp_path / "a.jsonl"
    common = ("--mode", "snapshot", "--max-rows-per-delivery", "10")
    for spec, state in ((f"parquet:{out_dir}", "a-p"), (f"jsonl:{out_file}", "a-j")):
        assert (
            tail(table, *common, "--name", "a", "--state", str(tmp_path / state), "--sink", spec)
            == 0
        )
    a_files = files_of(out_dir, tmp_path / "a-p")
    assert (
        run(
            [
                "reset",
                "--state",
                str(tmp_path / "b-p"),
                "--sink",
                f"parquet:{out_dir}",
                "--name",
                "b",
            ]
        )
        == 0
    )
    assert files_of(out_dir, tmp_path / "a-p") == a_files

    a_jsonl = out_file.read_bytes()
    b_state = tmp_path / "b-j"
    capsys.readouterr()
    assert (
        run(["reset", "--state", str(b_state), "--sink", f"jsonl:{out_file}", "--name", "b"]) == 2
    )
    assert one_line_error(capsys) == (
        f"deltastream: error: {out_file}: is the output of stream 'a' (state {tmp_path / 'a-j'}), "
        "not of 'b': a reset of 'b' leaves it alone; nothing was touched. To start 'a' over: "
        + StreamRef("a", str(tmp_path / "a-j")).reset_command(f"jsonl:{out_file}")
    )
    assert out_file.read_bytes() == a_jsonl and not b_state.exists()
    # ... nor does stream B take it over by starting on it.
    assert (
        tail(table, *common, "--name", "b", "--state", str(b_state), "--sink", f"jsonl:{out_file}")
        == 2
    )
    assert "has no position" in one_line_error(capsys) and out_file.read_bytes() == a_jsonl
    for spec, state in ((f"parquet:{out_dir}", "a-p"), (f"jsonl:{out_file}", "a-j")):
        assert (
            tail(table, *common, "--name", "a", "--state", str(tmp_path / state), "--sink", spec)
            == 0
        )
        rows = sink_rows(spec)
        assert Counter(change_key(r) for r in rows) == expected(table, Mode.SNAPSHOT)

    # A reset of a running stream (it holds the output's lock) is refused before it records
    # itself: the stream's next start is not blocked by a reset that never began.
    a_state = tmp_path / "a-j"
    running = OutputMarker(tmp_path / ".a.jsonl.deltastream", str(out_file))
    running.acquire(StreamRef("a", str(a_state)))
    try:
        content = out_file.read_bytes()
        capsys.readouterr()
        reset_a = ["reset", "--state", str(a_state), "--sink", f"jsonl:{out_file}", "--name", "a"]
        assert run(reset_a) == 2
        assert "is being written by stream 'a'" in one_line_error(capsys)
    finally:
        running.release()
    assert out_file.read_bytes() == content and not (a_state / "reset.json").exists()
    assert (
        tail(table, *common, "--name", "a", "--state", str(a_state), "--sink", f"jsonl:{out_file}")
        == 0
    )


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_mistyped_name_touches_no_stream(
    table: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue: ``reset --name`` not the stream's used to discard the state and leave the
    parquet output (or discard a jsonl output). The state records its stream's name: a reset,
    a ``tail`` or a ``tail --reset`` of another name is refused, naming both, touching
    nothing; the stream's own name still works."""
    state = tmp_path / "state"
    spec = f"jsonl:{tmp_path / 'out.jsonl'}" if kind == "jsonl" else f"parquet:{tmp_path / 'out'}"
    args = ("--mode", "snapshot", "--max-rows-per-delivery", "10", "--state", str(state))
    args += ("--sink", spec)
    assert tail(table, *args, "--name", "events") == 0
    assert json.loads((state / "position.json").read_text())["stream"] == "events"
    before = files_of(tmp_path)
    capsys.readouterr()
    assert run(["reset", "--state", str(state), "--sink", spec, "--name", "event"]) == 2
    assert capsys.readouterr().err == (
        f"deltastream: error: {state} holds the state of stream 'events', not of 'event': a "
        "reset of 'event' leaves it alone; nothing was touched. To start 'events' over: "
        + StreamRef("events", str(state)).reset_command(spec)
        + "\n"
    )
    assert files_of(tmp_path) == before
    refused = (
        f"deltastream: error: {state} holds the state of stream 'events', not of 'event'; a "
        "state directory belongs to one stream: name the stream 'events', or use another "
        "directory"
    )
    assert tail(table, *args, "--name", "event") == 2
    assert capsys.readouterr().err == refused + "\n"  # printed once, not logged too
    assert files_of(tmp_path) == before
    assert tail(table, *args, "--name", "event", "--reset") == 2
    assert "holds the state of stream 'events', not of 'event'" in one_line_error(capsys)
    assert files_of(tmp_path) == before
    assert run(["reset", "--state", str(state), "--sink", spec, "--name", "events"]) == 0
    assert not (state / "position.json").exists()
    assert tail(table, *args, "--name", "event") == 0  # a new stream now


def test_a_state_without_a_recorded_name_is_taken_over_by_its_stream(
    table: str, tmp_path: Path
) -> None:
    """States written before names were recorded hold none: the stream resumes and records
    its name; from then on another name is refused."""
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    args = ("--mode", "snapshot", "--state", str(state), "--sink", f"jsonl:{out}")
    assert tail(table, *args) == 0
    position = state / "position.json"
    value = json.loads(position.read_text())
    del value["stream"]
    position.write_text(json.dumps(value))
    assert tail(table, *args) == 0
    assert json.loads(position.read_text())["stream"] == "table"
    assert tail(table, *args, "--name", "other") == 2


# ------------------------------------------------------------------ one writer per sink


def test_a_config_with_two_streams_on_one_output_is_refused(tmp_path: Path) -> None:
    def config(sink_a: str, sink_b: str) -> dict[str, Any]:
        return {
            "defaults": {"state_dir": str(tmp_path / "state"), "uri": str(tmp_path / "t")},
            "tables": [{"name": "a", "sink": sink_a}, {"name": "b", "sink": sink_b}],
        }

    out = tmp_path / "out.jsonl"
    for a, b in [
        (f"jsonl:{out}", f"jsonl:{out}"),
        (f"jsonl:{out}", f"jsonl:{tmp_path}/x/../out.jsonl"),
    ]:
        with pytest.raises(InvalidArgumentError, match="streams 'a' and 'b' write to the same"):
            parse_config(config(a, b))
    # Distinct files, one parquet directory for two streams, standard output: accepted.
    parse_config(config(f"jsonl:{out}", f"jsonl:{tmp_path}/other.jsonl"))
    parse_config(config(f"parquet:{tmp_path}/p", f"parquet:{tmp_path}/p"))
    parse_config(config("jsonl:-", "jsonl:-"))
    with pytest.raises(InvalidArgumentError, match="'kafka:x' is not a sink"):
        parse_config(config("kafka:x", "jsonl:-"))


def test_a_second_process_on_the_same_output_fails_clearly(
    table: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.jsonl"
    marker = tmp_path / ".out.jsonl.deltastream"
    args = ["--mode", "follow", "--from", "0", "--sink", f"jsonl:{out}", "--poll-interval", "0.05"]
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deltastream",
            "tail",
            table,
            "--state",
            str(tmp_path / "s1"),
            *args,
        ],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not (marker.exists() and b'"stream"' in marker.read_bytes()):
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.05)
        capsys.readouterr()
        assert tail(table, "--state", str(tmp_path / "s2"), *args) == 2
        line = one_line_error(capsys)
        assert str(out) in line and "being written by stream 'table'" in line
        assert str(tmp_path / "s1") in line
        while out.stat().st_size == 0:  # the first one goes on undisturbed
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.05)
    finally:
        first.terminate()
        assert first.wait(timeout=20) == 0
