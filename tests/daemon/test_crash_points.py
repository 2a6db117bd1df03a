"""Exactly-once at every crash point, not just under random kills.

Each test stops a tailer process at one named point of the delivery protocol (see
:mod:`deltastream.daemon.crashpoints`), once, and three times in a row (the third run resumes
from what two crashes left), each time after a little progress, inside one version (a
version of 60 rows delivered 4 rows at a time) and inside one snapshot, for every sink; then
lets it finish and compares what the sink holds with the rows of a run that never crashed
(itself checked against delta-rs):

* ``jsonl`` and ``parquet``: exactly the reference rows, in order (0 lost, 0 repeated);
* ``delta`` and ``postgresql`` (change logs): exactly the reference rows (as a multiset: a
  table has no order); ``delta-merge`` and ``postgresql-merge`` (mirrors): exactly the rows
  the reference changes leave, applied one by one;
* ``http``, ``exec`` and the callback: every row at least once, and every repeat in a
  delivery with the same idempotency key and the same rows (so a receiver that drops keys it
  has seen gets exactly the reference rows).

Then the reset (``deltastream reset``), stopped at each of its points (after it recorded
itself; after each output file it removed, or the transaction or Delta commit that emptied a
target table; after the state), once and twice in a row, for every sink: the stream refuses
to start (``ResetIncompleteError``, touching nothing) until the reset is run again, and then
delivers every row from the start exactly as the reference run.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from crashpoint_child import CALLBACK, STREAM, Job, change_tuple, run_job
from deltalake import DeltaTable, write_deltalake
from postgres_server import PostgresServer
from tailing import CDF, SMALL_GROUPS, batch

from deltastream.daemon.crashpoints import CRASH_EXIT_STATUS, POINTS

Row = tuple[Any, ...]
LATEST = 3


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    """v0: 10 rows; v1: 60 rows in 15 row groups; v2: an update; v3: a delete."""
    uri = str(tmp_path_factory.mktemp("crash-points") / "table")
    write_deltalake(uri, batch(range(10)), partition_by=["part"], configuration=CDF)
    write_deltalake(uri, batch(range(100, 160)), mode="append", writer_properties=SMALL_GROUPS)
    t = DeltaTable(uri)
    t.update(
        predicate="id % 4 = 1",
        updates={"name": "concat(name, '+')"},
        writer_properties=SMALL_GROUPS,
    )
    DeltaTable(uri).delete("id % 7 = 0", writer_properties=SMALL_GROUPS)
    assert DeltaTable(uri).version() == LATEST
    return uri


MODES = {
    # Follow from version 1: crashes land inside version 1 (15 deliveries) and after it.
    "version": ("follow", "1"),
    # The snapshot of version 3 as inserts: crashes land inside the snapshot.
    "snapshot": ("snapshot", str(LATEST)),
}


def job(table: str, work: Path, mode: str, sink: str) -> Job:
    kind, start = MODES[mode]
    return Job(
        uri=table, state=str(work / "state"), sink=sink, mode=kind, start=start, latest=LATEST
    )


def jsonl_rows(path: Path) -> list[Row]:
    return [change_tuple(json.loads(line)) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(table: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Row]]:
    """The rows of a run that never crashed, per mode, checked against delta-rs."""
    rows: dict[str, list[Row]] = {}
    for mode in MODES:
        work = tmp_path_factory.mktemp(f"reference-{mode}")
        assert run_job(job(table, work, mode, f"jsonl:{work / 'out.jsonl'}")) == 0
        rows[mode] = jsonl_rows(work / "out.jsonl")
    cdf = pa.table(DeltaTable(table).load_cdf(starting_version=1, ending_version=LATEST))
    assert sorted(rows["version"]) == sorted(change_tuple(r) for r in cdf.to_pylist())
    snapshot = DeltaTable(table).to_pyarrow_table().to_pylist()
    assert sorted(rows["snapshot"]) == sorted(
        change_tuple({**r, "_commit_version": LATEST, "_change_type": "insert"}) for r in snapshot
    )
    assert len(rows["version"]) > 60 and len(rows["snapshot"]) >= 60
    return rows


# ---------------------------------------------------------------------------- receivers


@dataclass
class HttpReceiver:
    """Records every POSTed delivery: (Idempotency-Key, rows)."""

    deliveries: list[tuple[str, list[Row]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                rows = [change_tuple(r) for r in body["rows"]]
                with receiver.lock:
                    receiver.deliveries.append((self.headers["Idempotency-Key"], rows))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture(scope="module")
def http_server() -> Iterator[tuple[str, HttpReceiver]]:
    receiver = HttpReceiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), receiver.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", receiver
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------- sinks


@dataclass
class SinkKind:
    name: str
    exactly_once: bool
    #: Crash points this sink passes.
    points: frozenset[str]
    #: Whether a reset removes its output (files one by one, a table's rows in one
    #: transaction), passing ``reset.output-file``.
    reset_removes_output: bool = False


#: The points a reset passes (the other points are the delivery protocol's).
RESET_POINTS = frozenset(p for p in POINTS if p.startswith("reset."))
DELIVERY_POINTS = POINTS - RESET_POINTS
AT_LEAST_ONCE_POINTS = DELIVERY_POINTS - {"sink.after-fsync"}
SINKS = {
    "jsonl": SinkKind("jsonl", True, DELIVERY_POINTS, reset_removes_output=True),
    "parquet": SinkKind("parquet", True, DELIVERY_POINTS, reset_removes_output=True),
    # The target's commit is the write: there is no fsync of the sink's own. A reset
    # removes the rows and releases the stream's txn in one commit.
    "delta": SinkKind("delta", True, AT_LEAST_ONCE_POINTS, reset_removes_output=True),
    "delta-merge": SinkKind("delta-merge", True, AT_LEAST_ONCE_POINTS, reset_removes_output=True),
    "http": SinkKind("http", False, AT_LEAST_ONCE_POINTS),
    "exec": SinkKind("exec", False, AT_LEAST_ONCE_POINTS),
    "callback": SinkKind("callback", False, AT_LEAST_ONCE_POINTS),
    # The rows and the position in one transaction: sink.after-write is inside it,
    # sink.after-fsync after its COMMIT.
    "postgresql": SinkKind("postgresql", True, DELIVERY_POINTS, reset_removes_output=True),
    "postgresql-merge": SinkKind(
        "postgresql-merge", True, DELIVERY_POINTS, reset_removes_output=True
    ),
}

#: The pass at which a run crashes: late enough that each run makes progress first.
NTH_PASS = {
    "sink.before-write": 2,
    "sink.after-write": 2,
    "sink.after-fsync": 2,
    "state.before-commit": 2,
    "state.after-commit": 2,
    "delivery.between": 1,
    "snapshot.file": 3,
    "state.snapshot-write": 1,
    "state.snapshot-prune": 1,
}
assert set(NTH_PASS) == DELIVERY_POINTS


#: Crashes in a row before a run may finish. Two in a row is not a case of its own: the
#: three-crash case passes through it (its third run resumes from what two crashes left, and
#: crashes in turn), and finishing from it would cost three more runs per point.
IN_A_ROW = (1, 3)


def crash_counts(mode: str, point: str) -> tuple[int, ...]:
    # A finished snapshot stream saves its table state once, and once a saved state is
    # committed there is nothing left to save: those points can be crashed at only once.
    if point == "state.snapshot-prune" or (mode == "snapshot" and point.startswith("state.")):
        return (1,) if point.startswith("state.snapshot-") else IN_A_ROW
    return IN_A_ROW


def cases() -> Iterator[Any]:
    for sink in SINKS.values():
        for mode in MODES:
            for point in sorted(sink.points):
                if point == "snapshot.file" and mode != "snapshot":
                    continue
                yield pytest.param(sink.name, mode, point, id=f"{sink.name}-{mode}-{point}")


@pytest.fixture(scope="module")
def pg_url(postgres: PostgresServer) -> str:
    """A database for the module's PostgreSQL sinks (each test its own tables)."""
    return postgres.url(postgres.create_database("crash"))


def pg_table(out: Path) -> str:
    """The target table of the PostgreSQL sink whose work directory is ``out``."""
    return "t_" + hashlib.sha256(str(out).encode()).hexdigest()[:16]


def sink_spec(kind: str, out: Path, http_url: str, pg_url: str = "") -> str:
    if kind == "postgresql":
        return f"{pg_url}?table={pg_table(out)}"
    if kind == "postgresql-merge":
        return f"{pg_url}?table={pg_table(out)}&mode=merge&key=id"
    if kind == "jsonl":
        return f"jsonl:{out / 'out.jsonl'}"
    if kind == "parquet":
        return f"parquet:{out / 'parquet'}"
    if kind == "delta":
        return f"delta:{out / 'delta'}"
    if kind == "delta-merge":
        return f"delta:{out / 'mirror'}?mode=merge&key=id"
    if kind == "http":
        return http_url
    if kind == "exec":
        # Keep each batch with its idempotency key (one pair per successful run).
        dest = shlex.quote(str(out / "exec"))
        return (
            f'exec:n="$(date +%s%N)-$$"; printf %s "$DELTASTREAM_IDEMPOTENCY_KEY" > {dest}/"$n".key'
            f' && cp "$DELTASTREAM_BATCH_PATH" {dest}/"$n".parquet'
        )
    return f"{CALLBACK}{out / 'callback.jsonl'}"


def exactly_once_rows(kind: str, out: Path, pg_url: str = "") -> list[Row]:
    if kind.startswith("postgresql"):
        import psycopg

        columns = "_commit_version, _change_type, id, name, part"
        if kind == "postgresql-merge":
            columns = "id, name, part"
        with psycopg.connect(pg_url) as db:
            found = db.execute(f"SELECT {columns} FROM {pg_table(out)}").fetchall()
        return sorted(tuple(r) for r in found)
    if kind == "jsonl":
        return jsonl_rows(out / "out.jsonl")
    if kind == "delta":
        rows = DeltaTable(str(out / "delta")).to_pyarrow_table().to_pylist()
        return sorted(change_tuple(r) for r in rows)
    if kind == "delta-merge":
        rows = DeltaTable(str(out / "mirror")).to_pyarrow_table().to_pylist()
        return sorted((r["id"], r["name"], r["part"]) for r in rows)
    directory = out / "parquet"
    assert not list(directory.glob(".*.tmp")), "temporary files left behind"
    files = sorted(p for p in directory.iterdir() if p.suffix == ".parquet")
    return [change_tuple(r) for f in files for r in pq.read_table(f).to_pylist()]


def expected_rows(kind: str, reference: list[Row]) -> list[Row]:
    """What an exactly-once sink of ``kind`` holds after the ``reference`` rows."""
    if kind in ("postgresql", "delta"):
        return sorted(reference)
    if kind.endswith("-merge"):  # each change applied in turn: a mirror
        mirror: dict[int, Row] = {}
        for _, change, key, *rest in reference:
            if change == "delete":
                mirror.pop(key, None)
            elif change != "update_preimage":
                mirror[key] = (key, *rest)
        return sorted(mirror.values())
    return reference


def keyed_deliveries(kind: str, out: Path, receiver: HttpReceiver) -> list[tuple[str, list[Row]]]:
    if kind == "http":
        return list(receiver.deliveries)
    if kind == "exec":
        return [
            (
                key.read_text(),
                [change_tuple(r) for r in pq.read_table(key.with_suffix(".parquet")).to_pylist()],
            )
            for key in sorted((out / "exec").glob("*.key"))
        ]
    lines = (out / "callback.jsonl").read_text().splitlines()
    return [(d["key"], [tuple(r) for r in d["rows"]]) for d in (json.loads(line) for line in lines)]


def check_at_least_once(deliveries: list[tuple[str, list[Row]]], expected: list[Row]) -> None:
    by_key: dict[str, list[list[Row]]] = defaultdict(list)
    for key, rows in deliveries:
        if rows:
            by_key[key].append(rows)
    for key, versions in by_key.items():
        assert all(rows == versions[0] for rows in versions), f"{key}: repeated with other rows"
    # The key names the delivery's start and end position: in key order, the distinct
    # deliveries are the stream, each row exactly once.
    distinct = [by_key[key][0] for key in sorted(by_key, key=lambda k: k.split(":", 1)[1])]
    assert [row for rows in distinct for row in rows] == expected


# ---------------------------------------------------------------------------- the tests


@pytest.mark.parametrize(("sink", "mode", "point"), list(cases()))
def test_every_crash_point_once_and_three_times_in_a_row(
    sink: str,
    mode: str,
    point: str,
    table: str,
    reference: dict[str, list[Row]],
    http_server: tuple[str, HttpReceiver],
    pg_url: str,
    tmp_path: Path,
) -> None:
    url, receiver = http_server
    for crashes in crash_counts(mode, point):
        work = tmp_path / f"crashes-{crashes}"
        (work / "exec").mkdir(parents=True)
        with receiver.lock:
            receiver.deliveries.clear()
        base = job(table, work, mode, sink_spec(sink, work, url, pg_url))
        for i in range(crashes):
            status = run_job(replace(base, crash=f"{point}:{NTH_PASS[point]}"))
            assert status == CRASH_EXIT_STATUS, f"run {i + 1} did not reach {point}: {status}"
        assert run_job(base) == 0
        if SINKS[sink].exactly_once:
            expected = expected_rows(sink, reference[mode])
            assert exactly_once_rows(sink, work, pg_url) == expected, f"{crashes} crash(es)"
        else:
            check_at_least_once(keyed_deliveries(sink, work, receiver), reference[mode])


#: The ``max_rows_per_delivery`` of a stream's successive runs: 4-row deliveries (one batch
#: each), then 12-row ones (three batches reach 10), then the sink's own (a million: the rest
#: at once), so that every restart groups the rows after it otherwise than the run before.
REGROUPED = (4, 10, None)


def commit_rows(target: Path) -> list[int]:
    """The rows each commit of a Delta table added, in order, but a restarted stream's
    claims of the table (a commit of its epoch alone, with no rows)."""
    sizes, before = [], 0
    history = {h["version"]: h for h in DeltaTable(str(target)).history()}
    for version in range(DeltaTable(str(target)).version() + 1):
        rows = DeltaTable(str(target), version=version).to_pyarrow_table().num_rows
        if history[version].get("deltastream.operation") == "claim":
            assert rows == before
            continue
        sizes.append(rows - before)
        before = rows
    return sizes


@pytest.mark.parametrize("point", ["delivery.between", "state.before-commit"])
def test_a_restart_with_other_delivery_bounds_delivers_each_row_once(
    point: str, table: str, reference: dict[str, list[Row]], tmp_path: Path
) -> None:
    """Delivery boundaries need not survive a restart: the delta sink's stream, stopped
    between two deliveries of a version (state committed) or with the target's commit made
    and the state's not (the target's txn is ahead: the stream resumes there), then run with
    another ``max_rows_per_delivery`` each time, holds each row exactly once."""
    base = job(table, tmp_path, "version", sink_spec("delta", tmp_path, ""))
    *crashing, last = REGROUPED
    for rows in crashing:
        crash = f"{point}:{NTH_PASS[point]}"
        assert run_job(replace(base, crash=crash, rows_per_delivery=rows)) == CRASH_EXIT_STATUS
    assert run_job(replace(base, rows_per_delivery=last)) == 0
    assert exactly_once_rows("delta", tmp_path) == expected_rows("delta", reference["version"])
    sizes = commit_rows(tmp_path / "delta")
    # One batch, then three, then the rest in one commit (after a crash after the target's
    # commit, the commit the crashed run made is kept, and not repeated).
    head = [4, 12] if point == "delivery.between" else [4, 4, 12, 12]
    assert sizes[: len(head)] == head and len(sizes) == len(head) + 1, sizes
    assert sum(sizes) == len(reference["version"])


def test_every_point_is_covered() -> None:
    covered = {(s, p) for s, _, p in (c.values for c in cases())}
    for kind in SINKS.values():
        assert {p for s, p in covered if s == kind.name} == kind.points
    reset_covered = {(s, p) for s, p, _ in (c.values for c in reset_cases())}
    for kind in SINKS.values():
        expected = (
            RESET_POINTS if kind.reset_removes_output else RESET_POINTS - {"reset.output-file"}
        )
        assert {p for s, p in reset_covered if s == kind.name} == expected


def test_a_repeat_after_new_commits_keeps_its_deliveries_and_keys(tmp_path: Path) -> None:
    """An at-least-once delivery that ended where a round ended is repeated whole, with the
    same key, even when more versions were committed before the restart (the restarted round
    would otherwise run on into them and end elsewhere)."""
    uri = str(tmp_path / "table")
    write_deltalake(uri, batch(range(10)), partition_by=["part"], configuration=CDF)
    write_deltalake(uri, batch([100]), mode="append")  # v1: one row, one short delivery
    work = tmp_path / "work"
    spec = f"{CALLBACK}{work / 'callback.jsonl'}"
    follow = Job(uri=uri, state=str(work / "state"), sink=spec, mode="follow", start="1", latest=1)
    assert run_job(replace(follow, crash="state.before-commit:1")) == CRASH_EXIT_STATUS
    write_deltalake(uri, batch([200, 201]), mode="append")  # v2, before the restart
    assert run_job(replace(follow, latest=2)) == 0
    (key1, rows1), (key2, rows2), (_, rows3) = keyed_deliveries("callback", work, HttpReceiver())
    assert key1 == key2 and rows1 == rows2 == [(1, "insert", 100, "x100", "p1")]
    assert sorted(rows3) == [(2, "insert", 200, "x200", "p2"), (2, "insert", 201, "x201", "p0")]


# ---------------------------------------------------------------------------- resets

#: Which pass of a reset point to crash at: the per-file point after the first, the second
#: and the twentieth of the parquet sink's files (the jsonl sink has one file).
RESET_PASSES = {
    "jsonl": {"reset.marked": (1,), "reset.output-file": (1,), "reset.state": (1,)},
    "parquet": {"reset.marked": (1,), "reset.output-file": (1, 2, 20), "reset.state": (1,)},
    # One transaction empties the table and removes the stream's offsets row.
    "postgresql": {"reset.marked": (1,), "reset.output-file": (1,), "reset.state": (1,)},
    "postgresql-merge": {"reset.marked": (1,), "reset.output-file": (1,), "reset.state": (1,)},
    # One Delta commit removes every row and releases the stream's txn.
    "delta": {"reset.marked": (1,), "reset.output-file": (1,), "reset.state": (1,)},
    "delta-merge": {"reset.marked": (1,), "reset.output-file": (1,), "reset.state": (1,)},
}


def reset_cases() -> Iterator[Any]:
    for sink in SINKS.values():
        passes = RESET_PASSES.get(sink.name, {"reset.marked": (1,), "reset.state": (1,)})
        for point, nths in passes.items():
            for nth in nths:
                yield pytest.param(sink.name, point, nth, id=f"{sink.name}-{point}-{nth}")


def output_files(work: Path) -> dict[str, bytes]:
    """Every file of the stream's output and state, and its bytes."""
    return {
        str(p.relative_to(work)): p.read_bytes()
        for p in sorted(work.rglob("*"))
        if p.is_file() and p.name != "error.json"
    }


@pytest.mark.parametrize(("sink", "point", "nth"), list(reset_cases()))
def test_a_reset_killed_at_each_point_blocks_the_stream_until_run_again(
    sink: str,
    point: str,
    nth: int,
    table: str,
    reference: dict[str, list[Row]],
    http_server: tuple[str, HttpReceiver],
    pg_url: str,
    tmp_path: Path,
) -> None:
    url, receiver = http_server
    (tmp_path / "exec").mkdir()
    spec = sink_spec(sink, tmp_path, url, pg_url)
    stream = job(table, tmp_path, "version", spec)
    reset = replace(stream, action="reset")
    assert run_job(stream) == 0
    files = len(list((tmp_path / "parquet").glob("*.parquet"))) if sink == "parquet" else 1
    assert sink != "parquet" or files > 20
    # Killed once, then killed again at the same point by the rerun, where the rerun still
    # passes it (the files the first run removed are gone).
    crashes = 2 if point != "reset.output-file" or files - nth >= nth else 1
    for i in range(crashes):
        status = run_job(replace(reset, crash=f"{point}:{nth}"))
        assert status == CRASH_EXIT_STATUS, f"reset {i + 1} did not reach {point}: {status}"
    before = output_files(tmp_path)
    error_file = tmp_path / "error.json"
    assert run_job(replace(stream, error_file=str(error_file))) == 1
    state = stream.state
    command = ["deltastream", "reset", "--state", state, "--sink", spec, "--name", STREAM]
    assert json.loads(error_file.read_text()) == {
        "class": "ResetIncompleteError",
        "message": (
            f"{state}/reset.json: a reset of stream {STREAM!r} (sink {spec}) was started and "
            f"did not finish: the stream's output and state in {state} may be partly removed, "
            "so the stream cannot resume from them; run the reset again to finish it: "
            + shlex.join(command)
        ),
    }
    assert output_files(tmp_path) == before, "the refused start touched something"
    assert run_job(reset) == 0  # finishes it
    assert not (Path(state) / "reset.json").exists()
    assert not list(Path(state).glob(".*.tmp"))
    if sink.startswith(("delta", "postgresql")):  # the target table stays, emptied
        assert exactly_once_rows(sink, tmp_path, pg_url) == []
    # Delivered again from the start, each row once (what at-least-once sinks received
    # before the reset is theirs to keep: only the new run is compared).
    with receiver.lock:
        receiver.deliveries.clear()
    for old in [*(tmp_path / "exec").iterdir(), tmp_path / "callback.jsonl"]:
        old.unlink(missing_ok=True)
    assert run_job(stream) == 0
    if SINKS[sink].exactly_once:
        expected = expected_rows(sink, reference["version"])
        assert exactly_once_rows(sink, tmp_path, pg_url) == expected
    else:
        check_at_least_once(keyed_deliveries(sink, tmp_path, receiver), reference["version"])


def replaced_cases() -> Iterator[Any]:
    for sink in ("jsonl", "parquet"):
        for point in sorted(DELIVERY_POINTS - {"snapshot.file"}):
            yield pytest.param(sink, point, id=f"{sink}-{point}")


@pytest.mark.parametrize(("sink", "point"), list(replaced_cases()))
def test_a_table_replaced_after_a_crash_at_each_point_stops_the_stream_with_its_rows_only(
    sink: str,
    point: str,
    table: str,
    reference: dict[str, list[Row]],
    tmp_path: Path,
) -> None:
    """Issue 22: the replaced-table check in the crash-point matrix. Killed at a point of
    the delivery protocol, then the table deleted and written anew at its path (with more
    versions than the stream had read): the restart brings the output back to the committed
    position, as any restart does, and stops with ``TableReplacedError``: the output is a
    prefix of the old table's rows, none of the new table's."""
    uri = str(tmp_path / "table")
    shutil.copytree(table, uri)
    old = DeltaTable(uri).metadata().id
    stream = job(uri, tmp_path, "version", sink_spec(sink, tmp_path, ""))
    assert run_job(replace(stream, crash=f"{point}:{NTH_PASS[point]}")) == CRASH_EXIT_STATUS
    shutil.rmtree(uri)
    write_deltalake(uri, batch(range(5000, 5010), "new"), partition_by=["part"], configuration=CDF)
    for v in range(1, LATEST + 3):
        write_deltalake(uri, batch([5000 + 10 * v], "new"), mode="append")
    new = DeltaTable(uri).metadata().id
    error_file = tmp_path / "error.json"
    assert run_job(replace(stream, error_file=str(error_file))) == 1
    error = json.loads(error_file.read_text())
    assert error["class"] == "TableReplacedError", error
    assert error["message"].startswith(f"{uri}: the table was replaced: the table id at version ")
    assert f"the reader followed table {old}, the table there now is {new}; " in error["message"]
    rows = exactly_once_rows(sink, tmp_path)
    assert rows == reference["version"][: len(rows)]  # committed rows only, none repeated
    assert json.loads((tmp_path / "state" / "position.json").read_text())["table_id"] == old
