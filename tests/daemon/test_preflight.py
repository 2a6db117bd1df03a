"""Start-up checks (daemon/service/preflight.py): what a stream cannot fix by retrying is found
before any stream starts, and nothing is left behind by the checking."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltastream.daemon.service.preflight import check_service
from deltastream.daemon.service.supervisor import ServiceConfig, StreamConfig
from deltastream.daemon.sinks import CallbackSink
from deltastream.daemon.stream.config import tail_config
from deltastream.errors import InvalidArgumentError


def service(
    state: str, sink: str, *, work_dir: str | None = None, name: str = "t"
) -> ServiceConfig:
    stream = StreamConfig(tail_config(name, "/table", state, {}), sink)
    return ServiceConfig(streams=(stream,), http_address=None, work_dir=work_dir)


def test_local_locations_are_created_and_left_clean(tmp_path: Path) -> None:
    state, out, parquet = tmp_path / "a" / "state", tmp_path / "b" / "o.jsonl", tmp_path / "c"
    check_service(service(str(state), f"jsonl:{out}"))
    check_service(service(str(state) + "2", f"parquet:{parquet}", work_dir=str(tmp_path / "w")))
    assert state.is_dir() and out.parent.is_dir() and parquet.is_dir()
    assert (tmp_path / "w").is_dir()
    # The probe files are gone; the sink's output itself is not created.
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.parametrize(
    "state",
    [
        "s3://no-such-bucket/state",
        "gs://no-such-bucket/state",
        "az://no-such-container/state",
        "abfss://c@noaccount.dfs.core.windows.net/state",
    ],
)
def test_locations_on_object_stores_are_left_to_the_streams(state: str) -> None:
    # No bucket, no endpoint: checking must not try to reach anything.
    check_service(service(state, "jsonl:-"))


@pytest.mark.parametrize(
    ("table", "state", "shared"),
    [
        ("s3://b/t", "s3://b/state", True),
        ("gs://b/t", "gs://b/state", True),
        ("az://c/t", "abfss://c@a.dfs.core.windows.net/state", True),
        ("s3://b/t", "gs://b/state", False),
        ("gs://b/t", "/var/state", False),
        ("/data/t", "/var/state", False),
    ],
)
def test_the_state_store_takes_the_table_options_only_on_the_same_kind_of_store(
    table: str, state: str, shared: bool
) -> None:
    options = {"endpoint_url": "http://127.0.0.1:1"}
    config = tail_config("t", table, state, {"storage_options": options})
    assert dict(config.resolved_state_options) == (options if shared else {})


def test_an_unusable_work_dir_is_named(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(InvalidArgumentError) as e:
        check_service(service(str(tmp_path / "s"), "jsonl:-", work_dir=str(blocked / "w")))
    assert str(e.value) == (
        f"{blocked}/w: cannot use as work_dir (the exec sinks' batch files): Not a directory"
    )


def test_local_state_with_storage_options_is_refused() -> None:
    stream = StreamConfig(
        tail_config("t", "/table", "/var/tmp/s", {"state_storage_options": {"region": "x"}}),
        "jsonl:-",
    )
    with pytest.raises(InvalidArgumentError, match="only apply to tables in object stores"):
        check_service(ServiceConfig(streams=(stream,), http_address=None))


def test_sinks_given_as_objects_are_checked_instead_of_their_specs(tmp_path: Path) -> None:
    config = service(str(tmp_path / "s"), "demo:print")  # no sink spec: a Python sink
    with pytest.raises(InvalidArgumentError, match="'demo:print' is not a sink"):
        check_service(config)
    check_service(config, {"t": CallbackSink(print, description="demo:print")})


@pytest.mark.anyio
async def test_the_python_tail_runs_the_same_checks_before_it_starts(tmp_path: Path) -> None:
    """Not an ExceptionGroup from a running service: one InvalidArgumentError, nothing made."""
    import socket

    from tailing import create_table

    import deltastream as ds

    uri = str(tmp_path / "t")
    create_table(uri)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InvalidArgumentError, match=f"127.0.0.1:{port}"):
            await ds.tail(
                uri,
                f"jsonl:{tmp_path / 'out.jsonl'}",
                state=str(tmp_path / "state"),
                http_address=f"127.0.0.1:{port}",
            )
    assert not (tmp_path / "out.jsonl").exists()
    with pytest.raises(InvalidArgumentError, match="state directory"):
        await ds.tail(uri, "jsonl:-", state="/proc/nope")
