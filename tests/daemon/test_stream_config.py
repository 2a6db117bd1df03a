"""The stream options, defined once: the TOML loader, the ``tail`` command line and
``deltastream.tail`` take the same keys with the same defaults, and refuse the same values
(a string for a boolean, NaN, a fractional or negative count), naming the key and the value."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from deltastream.cli import _build_parser, _tail_config, run
from deltastream.daemon import api
from deltastream.daemon.delivery import COMMIT_ROWS_PER_DELIVERY, ROWS_PER_DELIVERY
from deltastream.daemon.service.config import TABLE_KEYS, load_config, parse_config
from deltastream.daemon.service.supervisor import ServiceConfig
from deltastream.daemon.sinks import (
    CallbackSink,
    DeltaSink,
    ExecSink,
    HttpSink,
    JsonlSink,
    ParquetSink,
    PostgresSink,
)
from deltastream.daemon.stream.config import MAX_BYTES_PER_DELIVERY, OPTIONS, TailOptions
from deltastream.daemon.stream.tailer import Mode, OnMissingFile, StartFrom, TailConfig
from deltastream.errors import InvalidArgumentError

IDENTITY = {"name": "t", "uri": "/t", "sink": "jsonl:-", "state": "/s"}
CLI_IDENTITY = ["tail", "/t", "--sink", "jsonl:-", "--state", "/s", "--name", "t"]

SIZE = "must be a number of bytes >= 1 or a size such as 512m or 1g"
#: (key, value, what the message says the value must be): refused by all three front ends.
BAD_VALUES = [
    ("notifications", "false", "must be true or false"),
    ("infer_without_cdf", "no", "must be true or false"),
    ("poll_interval", math.nan, "must be a positive number of seconds"),
    ("poll_interval", math.inf, "must be a positive number of seconds"),
    ("poll_interval", 0, "must be a positive number of seconds"),
    ("poll_interval", -1, "must be a positive number of seconds"),
    ("poll_interval", True, "must be a positive number of seconds"),
    ("safety_poll_interval", 0, "must be a positive number of seconds"),
    ("safety_poll_interval", math.nan, "must be a positive number of seconds"),
    ("max_rows_per_delivery", 1.9, "must be a whole number >= 1"),
    ("max_rows_per_delivery", 0, "must be a whole number >= 1"),
    ("max_rows_per_delivery", -5, "must be a whole number >= 1"),
    ("max_rows_per_delivery", True, "must be a whole number >= 1"),
    ("max_bytes_per_delivery", 0, SIZE),
    ("max_bytes_per_delivery", "0k", SIZE),
    ("max_bytes_per_delivery", "lots", SIZE),
    ("max_bytes_per_delivery", "1.5g", SIZE),
    ("max_bytes_per_delivery", 1.5, SIZE),
    ("max_bytes_per_delivery", True, SIZE),
    ("checkpoint_every_versions", -1, "must be a whole number >= 1"),
    ("checkpoint_every_seconds", -1, "must be a number of seconds >= 0"),
    ("checkpoint_every_seconds", math.nan, "must be a number of seconds >= 0"),
    ("mode", "tail", "must be one of 'snapshot', 'follow', 'snapshot-and-follow'"),
]


def toml_config(**entry: Any) -> TailConfig:
    (stream,) = parse_config({"tables": [{**IDENTITY, **entry}]}, "deltastream.toml").streams
    return stream.tail


def cli_config(*options: str) -> TailConfig:
    (stream,) = _tail_config(_build_parser().parse_args([*CLI_IDENTITY, *options])).streams
    return stream.tail


@pytest.fixture
def api_config(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``deltastream.tail(...)``'s TailConfig, taken from the service it would run."""
    made: list[ServiceConfig] = []

    class Service:
        failures: dict[str, Exception] = {}  # noqa: RUF012

        def __init__(self, config: ServiceConfig, **_: object) -> None:
            made.append(config)

        async def run(self) -> None:
            pass

    monkeypatch.setattr(api, "Service", Service)

    def config(**options: Any) -> TailConfig:
        anyio.run(functools.partial(api.tail, "/t", "jsonl:-", state="/s", name="t", **options))
        return made.pop().streams[0].tail

    yield config


def cli_text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# --- defaults --------------------------------------------------------------------------------


def test_defaults_are_the_same_everywhere(api_config: Any) -> None:
    defaults = TailConfig(name="t", uri="/t", state="/s")
    assert toml_config() == cli_config() == api_config() == defaults
    assert defaults.mode is Mode.SNAPSHOT_AND_FOLLOW and defaults.start == StartFrom()
    assert defaults.safety_poll_interval == 60.0
    assert (defaults.poll_interval, defaults.notifications, defaults.infer_without_cdf) == (
        1.0,
        True,
        False,
    )
    # Rows: the sink's own (resolved_max_rows_per_delivery); bytes: 128 MiB.
    assert defaults.max_rows_per_delivery is None
    assert defaults.max_bytes_per_delivery == MAX_BYTES_PER_DELIVERY == 128 << 20


def test_every_option_is_a_toml_key_a_flag_and_a_keyword(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert set(TailOptions.__annotations__) == set(OPTIONS)
    assert set(TABLE_KEYS) == {"name", "uri", "sink", "state"} | {o.key for o in OPTIONS.values()}
    with pytest.raises(SystemExit):
        run(["tail", "--help"])
    usage = capsys.readouterr().out
    for option in OPTIONS.values():
        assert f"[{option.flag}" in usage, option.flag
    assert OPTIONS["start"].key == "from" and OPTIONS["start"].flag == "--from"


def test_every_option_given_everywhere_is_the_same(api_config: Any) -> None:
    toml = toml_config(
        mode="follow",
        storage_options={"region": "eu-west-1"},
        columns=["id"],
        poll_interval=2,
        safety_poll_interval=30,
        notifications=False,
        on_missing_file="skip",
        infer_without_cdf=True,
        max_rows_per_delivery=10,
        max_bytes_per_delivery="64k",
        checkpoint_every_versions=5,
        checkpoint_every_seconds=0,
        **{"from": 3},
    )
    cli = cli_config(
        "--mode=follow",
        "--from=3",
        "--storage-option=region=eu-west-1",
        "--columns=id",
        "--poll-interval=2",
        "--safety-poll-interval=30",
        "--no-notifications",
        "--on-missing-file=skip",
        "--infer-without-cdf",
        "--max-rows-per-delivery=10",
        "--max-bytes-per-delivery=65536",
        "--checkpoint-every-versions=5",
        "--checkpoint-every-seconds=0",
    )
    python = api_config(
        mode="follow",
        start=3,
        storage_options={"region": "eu-west-1"},
        columns=["id"],
        poll_interval=2,
        safety_poll_interval=30,
        notifications=False,
        on_missing_file=OnMissingFile.SKIP,
        infer_without_cdf=True,
        max_rows_per_delivery=10,
        max_bytes_per_delivery=64 << 10,
        checkpoint_every_versions=5,
        checkpoint_every_seconds=0,
    )
    assert toml == cli == python
    assert toml.start == StartFrom(version=3) and toml.columns == ("id",)
    assert isinstance(toml.poll_interval, float) and toml.poll_interval == 2.0
    assert toml.safety_poll_interval == 30.0


# --- wrong values ----------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "value", "must"), BAD_VALUES)
def test_toml_refuses(key: str, value: object, must: str) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        toml_config(**{key: value})
    assert str(e.value) == f"deltastream.toml [[tables]] #1 (t): {key!r} {must}, not {value!r}"


@pytest.mark.parametrize(("key", "value", "must"), BAD_VALUES)
def test_python_api_refuses(api_config: Any, key: str, value: object, must: str) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        api_config(**{key: value})
    assert str(e.value) == f"{key!r} {must}, not {value!r}"


@pytest.mark.parametrize(
    ("key", "value", "must"), [bad for bad in BAD_VALUES if not isinstance(bad[1], str)]
)
def test_cli_refuses(
    key: str, value: object, must: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = OPTIONS[key].flag
    text = cli_text(value)
    assert run([*CLI_IDENTITY, f"{flag}={text}"]) == 2
    err = capsys.readouterr().err
    assert err == f"deltastream: error: {flag!r} {must}, not {text!r}\n"


@pytest.mark.parametrize("text", ["1.9", "0", "-5", "true", "1e3", ""])
def test_cli_refuses_counts(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*CLI_IDENTITY, f"--max-rows-per-delivery={text}"]) == 2
    assert capsys.readouterr().err == (
        f"deltastream: error: '--max-rows-per-delivery' must be a whole number >= 1, not {text!r}\n"
    )


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("134217728", 128 << 20),
        ("128m", 128 << 20),
        ("128MiB", 128 << 20),
        ("128 MB", 128 << 20),
        ("1g", 1 << 30),
        ("512k", 512 << 10),
        ("1", 1),
    ],
)
def test_sizes_are_numbers_or_text_with_a_unit(api_config: Any, text: str, size: int) -> None:
    """The rule of deltastream.sizes (the Spark source's maxBytesPerTrigger takes the same)."""
    assert cli_config(f"--max-bytes-per-delivery={text}").max_bytes_per_delivery == size
    assert toml_config(max_bytes_per_delivery=text).max_bytes_per_delivery == size
    assert api_config(max_bytes_per_delivery=text).max_bytes_per_delivery == size
    assert toml_config(max_bytes_per_delivery=size).max_bytes_per_delivery == size


@pytest.mark.parametrize("text", ["0", "-1", "1.5m", "lots", "1e9", "", "true"])
def test_cli_refuses_sizes(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*CLI_IDENTITY, f"--max-bytes-per-delivery={text}"]) == 2
    assert capsys.readouterr().err == (
        f"deltastream: error: '--max-bytes-per-delivery' {SIZE}, not {text!r}\n"
    )


def test_rows_per_delivery_are_the_sinks_unless_given(tmp_path: Path) -> None:
    """Unset, a stream's deliveries hold the rows its sink works best with (a costly commit
    per delivery: a million; else 100,000, as the --help says); given, the setting wins."""
    pytest.importorskip("deltalake")
    pytest.importorskip("psycopg")
    commits = [DeltaSink(str(tmp_path / "d")), PostgresSink("postgresql://h/db?table=t")]
    others = [
        JsonlSink(str(tmp_path / "o.jsonl")),
        ParquetSink(str(tmp_path / "p")),
        HttpSink("http://localhost:1/"),
        ExecSink("true"),
        CallbackSink(print),
    ]
    unset, given = (
        TailConfig(name="t", uri="/t", state="/s"),
        cli_config("--max-rows-per-delivery=7"),
    )
    for sink in commits:
        assert unset.resolved_max_rows_per_delivery(sink) == COMMIT_ROWS_PER_DELIVERY == 1_000_000
    for sink in others:
        assert unset.resolved_max_rows_per_delivery(sink) == ROWS_PER_DELIVERY == 100_000
    for sink in commits + others:
        assert given.resolved_max_rows_per_delivery(sink) == 7
    text = OPTIONS["max_rows_per_delivery"].help
    assert "1000000 for the delta and postgresql sinks" in text and "100000 for the others" in text


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "0", "-1", "soon"])
def test_cli_refuses_poll_intervals(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*CLI_IDENTITY, f"--poll-interval={text}"]) == 2
    assert capsys.readouterr().err == (
        f"deltastream: error: '--poll-interval' must be a positive number of seconds, "
        f"not {text!r}\n"
    )


@pytest.mark.parametrize("argv", [["--no-notifications=false"], ["--infer-without-cdf=no"]])
def test_cli_switches_take_no_value(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _build_parser().parse_args([*CLI_IDENTITY, *argv])
    assert e.value.code == 2
    assert "ignored explicit argument" in capsys.readouterr().err


def test_cli_start_errors_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*CLI_IDENTITY, "--from", "soon"]) == 2
    assert "'--from': not an ISO-8601 timestamp: 'soon'" in capsys.readouterr().err
    assert run([*CLI_IDENTITY, "--from-timestamp", "soon"]) == 2
    assert "'--from-timestamp': not an ISO-8601 timestamp: 'soon'" in capsys.readouterr().err


def test_unknown_python_keyword(api_config: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"unknown option\(s\) \['polling'\]"):
        api_config(polling=1)


def test_toml_message_names_file_entry_key_and_value(tmp_path: Path) -> None:
    path = tmp_path / "deltastream.toml"
    path.write_text(
        "[[tables]]\n"
        'name = "customers"\nuri = "/c"\nsink = "jsonl:/c.jsonl"\nstate = "/s/c"\n'
        "[[tables]]\n"
        'name = "orders"\nuri = "/o"\nsink = "jsonl:/o.jsonl"\nstate = "/s/o"\n'
        "poll_interval = nan\n"
    )
    with pytest.raises(InvalidArgumentError) as e:
        load_config(path)
    assert str(e.value) == (
        f"{path} [[tables]] #2 (orders): 'poll_interval' must be a positive number of "
        "seconds, not nan"
    )


def test_a_wrong_default_is_reported_as_the_defaults() -> None:
    document = {"defaults": {"max_rows_per_delivery": 2.5}, "tables": [IDENTITY]}
    with pytest.raises(InvalidArgumentError) as e:
        parse_config(document, "c.toml")
    assert str(e.value) == (
        "c.toml [defaults]: 'max_rows_per_delivery' must be a whole number >= 1, not 2.5"
    )


def test_toml_start_forms() -> None:
    assert toml_config(**{"from": 42}).start == StartFrom(version=42)
    assert toml_config(**{"from": "latest"}).start == StartFrom()
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert toml_config(**{"from": at}).start == StartFrom(timestamp_ms=1767225600000)
    with pytest.raises(InvalidArgumentError, match=r"'from' must be 'latest', a version"):
        toml_config(**{"from": -1})


def test_storage_option_values_are_text() -> None:
    t = toml_config(storage_options={"max_attempts": 5, "allow_http": True})
    assert t.storage_options == {"max_attempts": "5", "allow_http": "true"}
    with pytest.raises(InvalidArgumentError, match="'storage_options' must be a table of strings"):
        toml_config(storage_options={"nested": {"a": "b"}})


def test_replace_checks_too() -> None:
    config = TailConfig(name="t", uri="/t", state="/s")
    assert dataclasses.replace(config, poll_interval=0.05).poll_interval == 0.05
    with pytest.raises(InvalidArgumentError, match="'poll_interval' must be a positive"):
        dataclasses.replace(config, poll_interval=math.nan)
    with pytest.raises(InvalidArgumentError, match="'name' may only hold letters"):
        dataclasses.replace(config, name="a b")


def test_secrets_in_options_never_show_in_reprs() -> None:
    """Storage options carry keys and tokens (and http headers bearer tokens): a config's
    repr (in a log line, a traceback, a debugger) shows none of them."""
    config = TailConfig(
        name="orders",
        uri="s3://lake/orders",
        state="s3://lake/state",
        storage_options={"secret_access_key": "S3CRET-TABLE"},
        state_storage_options={"secret_access_key": "S3CRET-STATE"},
        http_headers={"Authorization": "Bearer T0KEN"},
    )
    shown = repr(config) + str(config)
    for secret in ("S3CRET-TABLE", "S3CRET-STATE", "T0KEN"):
        assert secret not in shown
    assert "orders" in shown
    assert config.storage_options == {"secret_access_key": "S3CRET-TABLE"}  # still there
