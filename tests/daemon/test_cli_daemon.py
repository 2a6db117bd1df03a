"""``deltastream tail``, ``serve`` and ``demo`` as separate processes: signals stop them
cleanly with exit status 0 and the state persisted; errors print one line and exit 2."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import write_deltalake
from tailing import Writer, batch, create_table, expected_changes, wait_for_output

from deltastream.cli import _build_parser, _tail_config
from deltastream.daemon.stream.tailer import Mode, StartFrom

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "deltastream", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def wait_for(condition: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def jsonl_rows(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_tail_delivers_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    uri, out, state = str(tmp_path / "t"), tmp_path / "out.jsonl", tmp_path / "state"
    create_table(uri)
    Writer(uri, commits=4).run()
    proc = start(
        "tail", uri, "--sink", f"jsonl:{out}", "--state", str(state),
        "--mode", "follow", "--from", "0", "--poll-interval", "0.1",
    )  # fmt: skip
    try:
        expected = expected_changes(uri, 0, 4)
        wait_for(lambda: len(jsonl_rows(out)) >= sum(expected.values()))
        write_deltalake(uri, batch([900]), mode="append")  # version 5, while running
        wait_for(lambda: any(r["id"] == 900 for r in jsonl_rows(out)))
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
        assert time.monotonic() - began < 10
    finally:
        proc.kill()
    _, stderr = proc.communicate()
    assert code == 0, stderr
    position = json.loads((state / "position.json").read_text())
    assert position["position"] == {"version": 6, "snapshot": False, "offset": 0}
    assert position["sink"]["bytes"] == out.stat().st_size
    got = [(r["_commit_version"], r["_change_type"], r["id"], r["name"], r["part"])
           for r in jsonl_rows(out)]  # fmt: skip
    assert sorted(got, key=str) == sorted(expected_changes(uri, 0, 5).elements(), key=str)


def test_tail_error_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """The stream's error is printed once: the error line, not also an ERROR log line;
    with JSON logs, the structured record stays for the machines that read them."""
    uri = tmp_path / "none"
    args = ("tail", str(uri), "--sink", "jsonl:-", "--state", str(tmp_path / "s"))
    proc = start(*args)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    line = f"deltastream: error: {uri}: not a Delta table: no such directory"
    assert stderr == line + "\n"
    proc = start(*args, "--log-format", "json")
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    record, last = stderr.splitlines()
    assert last == line
    fields = json.loads(record)
    assert (fields["level"], fields["message"], fields["error_class"]) == (
        "error",
        f"none: stream stopped: {uri}: not a Delta table: no such directory",
        "TableNotFoundError",
    )


def test_a_start_the_table_has_not_reached_names_its_latest_version(tmp_path: Path) -> None:
    """``--from`` past the log, in each mode: one line naming the latest version (one rule:
    following may start at the next commit, a snapshot only at a version the log has)."""
    uri = str(tmp_path / "t")
    create_table(uri)
    for i in range(3):
        write_deltalake(uri, batch([100 + i]), mode="append")  # versions 1..3
    refused = {
        ("follow", "999"): "cannot follow from version 999",
        ("follow", "5"): "cannot follow from version 5",
        ("snapshot", "999"): "cannot take the snapshot of version 999",
        ("snapshot", "4"): "cannot take the snapshot of version 4",
        ("snapshot-and-follow", "999"): "cannot take the snapshot of version 999",
    }

    def tail(mode: str, version: str) -> subprocess.Popen[str]:
        state = tmp_path / f"state-{mode}-{version}"
        return start(
            "tail", uri, "--sink", "jsonl:-", "--state", str(state), "--mode", mode,
            "--from", version, "--available-now",
        )  # fmt: skip

    for (mode, version), what in refused.items():
        proc = tail(mode, version)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 2, (mode, version)
        assert stderr == f"deltastream: error: {uri}: {what}: the latest version is 3\n"
    # The next commit, version 4, is where a stream that follows may start.
    proc = tail("follow", "4")
    stdout, _ = proc.communicate(timeout=60)
    assert (proc.returncode, stdout) == (0, "")


def test_serve_follows_several_tables_and_stops_on_sigint(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    create_table(a, rows=3)
    create_table(b, rows=4)
    config = tmp_path / "deltastream.toml"
    config.write_text(
        f"""
[server]
http = "127.0.0.1:0"

[defaults]
state_dir = "{tmp_path / "state"}"
poll_interval = 0.1

[[tables]]
name = "a"
uri = "{a}"
sink = "jsonl:{tmp_path / "a.jsonl"}"

[[tables]]
name = "b"
uri = "{b}"
sink = "parquet:{tmp_path / "b-out"}"

[[tables]]
name = "broken"
uri = "{tmp_path / "missing"}"
sink = "jsonl:{tmp_path / "broken.jsonl"}"
"""
    )
    proc = start("serve", "--config", str(config), "--log-format", "json")
    try:
        wait_for(lambda: len(jsonl_rows(tmp_path / "a.jsonl")) == 3)
        wait_for(lambda: len(list((tmp_path / "b-out").glob("b-*.parquet"))) == 1)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=10)
    finally:
        proc.kill()
    _, stderr = proc.communicate()
    assert code == 0, stderr
    logs = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert any(e["level"] == "error" and "broken" in e["message"] for e in logs)
    assert any("SIGINT received" in e["message"] for e in logs)


def test_demo_prints_changes_as_they_come(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "deltastream", "demo", "--path", str(tmp_path / "demo"),
         "--duration", "4", "--interval", "0.4"],
        capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("deltastream demo: following")
    kinds = {line.split()[1] for line in lines[1:-1]}
    assert "insert" in kinds and len(kinds) >= 2, proc.stdout
    assert lines[-1].startswith("deltastream demo:") and "commits written" in lines[-1]


def test_tail_options_reach_the_stream_config() -> None:
    args = _build_parser().parse_args(
        [
            "tail",
            "s3://lake/t",
            "--sink",
            "jsonl:-",
            "--state",
            "/var/lib/ds/t",
            "--mode",
            "follow",
            "--from-timestamp",
            "2026-11-01T00:00:00Z",
            "--checkpoint-every-versions",
            "50",
            "--checkpoint-every-seconds",
            "30",
            "--storage-option",
            "region=eu-west-1",
        ]
    )
    (stream,) = _tail_config(args).streams
    assert stream.tail.mode is Mode.FOLLOW
    assert stream.tail.start == StartFrom(timestamp_ms=1_793_491_200_000)
    assert (stream.tail.checkpoint_every_versions, stream.tail.checkpoint_every_seconds) == (
        50,
        30.0,
    )
    assert stream.tail.storage_options == {"region": "eu-west-1"}
    assert (
        _tail_config(
            _build_parser().parse_args(["tail", "/t", "--sink", "jsonl:-", "--state", "/s"])
        )
        .streams[0]
        .tail.start
        == StartFrom()
    )


def test_from_and_from_timestamp_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _build_parser().parse_args(
            [
                "tail",
                "/t",
                "--sink",
                "jsonl:-",
                "--state",
                "/s",
                "--from",
                "3",
                "--from-timestamp",
                "2026-11-01",
            ]
        )
    assert "not allowed with argument" in capsys.readouterr().err


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltastream", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def the_error(done: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a command that failed as docs/cli/index.md says: exit status 2,
    one ``deltastream: error:`` line, no traceback."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "ExceptionGroup" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("deltastream: error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_an_http_port_in_use_fails_at_start_before_any_stream(tmp_path: Path) -> None:
    uri, out, state = str(tmp_path / "t"), tmp_path / "out.jsonl", tmp_path / "state"
    create_table(uri)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_cli(
            "tail", uri, "--sink", f"jsonl:{out}", "--state", str(state),
            "--http", f"127.0.0.1:{port}",
        )  # fmt: skip
    assert the_error(done) == (
        f"deltastream: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert not out.exists() and not state.exists()  # nothing started


def test_a_malformed_http_address_fails_at_start(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    done = run_cli(
        "tail", uri, "--sink", "jsonl:-", "--state", str(tmp_path / "s"), "--http", "localhost"
    )
    assert the_error(done) == (
        "deltastream: error: --http must be HOST:PORT (e.g. 127.0.0.1:9464), not 'localhost'"
    )
    config = tmp_path / "c.toml"
    config.write_text(
        f'[server]\nhttp = "9464"\n\n[[tables]]\nname = "t"\nuri = "{uri}"\n'
        f'sink = "jsonl:-"\nstate = "{tmp_path / "s"}"\n'
    )
    assert the_error(run_cli("serve", "--config", str(config))) == (
        f"deltastream: error: {config} [server]: 'http' must be HOST:PORT "
        "(e.g. 127.0.0.1:9464), not '9464'"
    )


@pytest.mark.parametrize(
    ("state", "sink", "message"),
    [
        (
            "/proc/nope",
            "jsonl:-",
            "/proc/nope: cannot use as the state directory of stream 't': No such file",
        ),
        (
            "{blocked}/state",
            "jsonl:-",
            "{blocked}/state: cannot use as the state directory of stream 't': Not a directory",
        ),
        (
            "{tmp}/s",
            "jsonl:{blocked}/out.jsonl",
            "{blocked}: cannot use as the directory of the output of stream 't': it is a file, "
            "not a directory",
        ),
        (
            "{tmp}/s",
            "parquet:{blocked}/out",
            "{blocked}/out: cannot use as the output directory of stream 't': Not a directory",
        ),
        (
            "{tmp}/s",
            "jsonl:{tmp}",
            "{tmp}: the output of stream 't' (jsonl:{tmp}) is a directory; a jsonl sink "
            "writes a file",
        ),
    ],
)
def test_an_unusable_state_or_sink_location_fails_at_start(
    tmp_path: Path, state: str, sink: str, message: str
) -> None:
    """Not a stream retrying a storage error for ever: exit 2 at once, naming the place."""
    uri = str(tmp_path / "t")
    create_table(uri)
    blocked = tmp_path / "a-file"  # a regular file: nothing can be created under it
    blocked.write_text("")
    names = {"tmp": str(tmp_path), "blocked": str(blocked)}
    done = run_cli(
        "tail", uri, "--mode", "snapshot", "--state", state.format(**names),
        "--sink", sink.format(**names),
    )  # fmt: skip
    assert the_error(done).startswith(f"deltastream: error: {message.format(**names)}")


def test_an_unknown_sink_kind_is_one_error_before_anything_starts(tmp_path: Path) -> None:
    uri, state = str(tmp_path / "t"), tmp_path / "s"
    create_table(uri)
    known = "(known kinds: jsonl, parquet, http, https, exec, delta, postgresql, postgres)"
    error = the_error(run_cli("tail", uri, "--sink", "kafka:x", "--state", str(state)))
    assert error.startswith(f"deltastream: error: sink 'kafka:x' is not a sink {known}: ")
    assert not state.exists()
    config = tmp_path / "c.toml"
    config.write_text(
        f'[[tables]]\nname = "t"\nuri = "{uri}"\nsink = "kafka:x"\nstate = "{state}"\n'
    )
    error = the_error(run_cli("serve", "--config", str(config)))
    assert error.startswith(f"deltastream: error: {config} [[tables]] #1 (t): sink 'kafka:x'")


def test_tail_into_a_closed_stdout_ends_quietly(tmp_path: Path) -> None:
    """``deltastream tail T --sink jsonl:- | head``: the stream ends (it used to retry for
    ever), with status 141 and no error or traceback."""
    uri = str(tmp_path / "t")
    create_table(uri)
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltastream", "tail", uri, "--sink", "jsonl:-",
         "--state", str(tmp_path / "s")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 141, stderr
    assert "Traceback" not in stderr and "deltastream: error:" not in stderr


def demo(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "demo", "--path", str(path), "--duration", "1", "--interval", "0.3", *args, timeout=120
    )


def test_demo_refuses_a_directory_it_did_not_create(tmp_path: Path) -> None:
    table = tmp_path / "mine"
    create_table(str(table))  # someone's Delta table
    before = sorted(p.relative_to(table) for p in table.rglob("*"))
    error = the_error(demo(table))
    assert error == (
        f"deltastream: error: {table}: not a directory the demo created (it is not empty and "
        "has no .deltastream-demo file); choose another --path, or pass --force to use it anyway"
    )
    assert sorted(p.relative_to(table) for p in table.rglob("*")) == before  # untouched
    # --force uses it, but still deletes nothing it did not create.
    (table / "state").mkdir()
    error = the_error(demo(table, "--force"))
    assert "already holds state, which the demo did not create" in error
    (table / "state").rmdir()
    done = demo(table, "--force")
    assert done.returncode == 0, done.stderr
    assert (table / ".deltastream-demo").is_file() and (table / "table" / "_delta_log").is_dir()
    assert {p.relative_to(table) for p in table.rglob("*")} >= set(before)


def test_demo_reuses_its_own_directory_and_only_what_it_created(tmp_path: Path) -> None:
    path = tmp_path / "demo"
    assert demo(path).returncode == 0
    assert (path / ".deltastream-demo").is_file()
    (path / "notes.txt").write_text("mine")
    first = {p.name for p in (path / "table").rglob("*.parquet")}
    assert first
    done = demo(path)  # no --force needed: the marker says the directory is the demo's
    assert done.returncode == 0, done.stderr
    assert (path / "notes.txt").read_text() == "mine"
    assert lines_of(done)[0] == f"deltastream demo: following {path / 'table'} " + (
        "(a writer commits every 0.3s)"
    )
    assert first.isdisjoint(p.name for p in (path / "table").rglob("*.parquet"))  # replaced


def lines_of(done: subprocess.CompletedProcess[str]) -> list[str]:
    return done.stdout.splitlines()


def test_a_config_error_names_its_place_once(tmp_path: Path) -> None:
    config = tmp_path / "bad5.toml"
    config.write_text(
        '[[tables]]\nname = "a"\nuri = "/t"\nsink = "jsonl:-"\nstate = "/s"\nmode = "tail"\n'
    )
    assert the_error(run_cli("serve", "--config", str(config))) == (
        f"deltastream: error: {config} [[tables]] #1 (a): 'mode' must be one of 'snapshot', "
        "'follow', 'snapshot-and-follow', not 'tail'"
    )


def run_until(path: Path, line: str, *args: str) -> list[str]:
    """Run ``deltastream *args`` (JSON logs on stderr, in ``path``) until it logs ``line``,
    stop it with SIGTERM; the messages it logged."""
    with path.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deltastream", *args, "--log-format", "json"],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=ENV,
        )
    try:
        wait_for_output(proc, path, lambda text: line in text)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, path.read_text()
    finally:
        proc.kill()
        proc.wait()
    return [json.loads(text)["message"] for text in path.read_text().splitlines()]


def test_tail_follow_logs_one_start_line(tmp_path: Path) -> None:
    """A new ``follow`` stream says where it starts, as a resumed one does: one line each."""
    uri, state = str(tmp_path / "t"), str(tmp_path / "state")
    create_table(uri)  # version 0
    args = ("tail", uri, "--sink", "jsonl:-", "--state", state, "--mode", "follow")
    first = run_until(tmp_path / "first.log", "starting at", *args)
    assert first == [
        "t: starting at v1 (new stream)",
        "SIGTERM received: stopping",
        "t: saved the table state at version 0",
        "t: stopped at v1",
    ]
    again = run_until(tmp_path / "again.log", "resuming at", *args)
    assert again == [
        "t: resuming at v1 (epoch 2)",
        "SIGTERM received: stopping",
        "t: stopped at v1",
    ]
