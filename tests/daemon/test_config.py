"""The ``serve`` configuration file: every key, defaults, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltastream.daemon.service.config import load_config, parse_config
from deltastream.daemon.stream.tailer import Mode, OnMissingFile, OnMissingVersions, OnSchemaChange
from deltastream.errors import InvalidArgumentError

FULL = """
[server]
http = "0.0.0.0:9000"
log_format = "json"
log_level = "debug"
shutdown_grace = 5
work_dir = "/tmp/ds-work"

[defaults]
state_dir = "/var/lib/deltastream/"
poll_interval = 2.5
storage_options = { region = "eu-west-1" }

[[tables]]
name = "orders"
uri = "s3://lake/orders"
sink = "jsonl:/data/orders.jsonl"
mode = "follow"
from = "42"
storage_options = { region = "us-east-1", sqs_queue_url = "https://sqs.example.com/1/q" }
columns = ["id", "amount"]
on_schema_change = "continue"
on_missing_versions = "resume-from-checkpoint"
on_missing_file = "skip"
infer_without_cdf = true
max_rows_per_delivery = 5000
checkpoint_every_versions = 10
checkpoint_every_seconds = 30
notifications = false

[[tables]]
name = "events"
uri = "/data/events"
sink = "parquet:/data/out/events"
state = "/elsewhere/events"
from = "2026-01-01T00:00:00Z"
"""


def test_full_configuration(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(FULL)
    config = load_config(path)
    assert config.http_address == "0.0.0.0:9000"
    assert (config.log_format, config.log_level, config.shutdown_grace) == ("json", "debug", 5.0)
    assert config.work_dir == "/tmp/ds-work"
    orders, events = config.streams
    t = orders.tail
    assert orders.sink == "jsonl:/data/orders.jsonl"
    assert (t.name, t.uri, t.state) == ("orders", "s3://lake/orders", "/var/lib/deltastream/orders")
    assert t.mode is Mode.FOLLOW and t.start.version == 42
    assert t.storage_options["region"] == "us-east-1"  # the table's own options win whole
    assert t.columns == ("id", "amount")
    assert t.on_schema_change is OnSchemaChange.CONTINUE
    assert t.on_missing_versions is OnMissingVersions.RESUME_FROM_CHECKPOINT
    assert t.on_missing_file is OnMissingFile.SKIP
    assert t.infer_without_cdf and not t.notifications
    assert (t.max_rows_per_delivery, t.poll_interval) == (5000, 2.5)
    assert (t.checkpoint_every_versions, t.checkpoint_every_seconds) == (10, 30.0)
    e = events.tail
    assert e.state == "/elsewhere/events" and e.mode is Mode.SNAPSHOT_AND_FOLLOW
    assert e.start.timestamp_ms == 1767225600000
    assert e.storage_options == {"region": "eu-west-1"}


def test_defaults() -> None:
    config = parse_config(
        {"tables": [{"name": "t", "uri": "/t", "sink": "jsonl:-", "state": "/s"}]}
    )
    assert config.http_address == "127.0.0.1:9464"
    assert config.streams[0].tail.mode is Mode.SNAPSHOT_AND_FOLLOW
    assert config.streams[0].tail.start.version is None


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({}, "at least one"),
        ({"tables": [{"uri": "/t", "sink": "jsonl:-", "state": "/s"}]}, "missing 'name'"),
        ({"tables": [{"name": "t", "uri": "/t", "sink": "jsonl:-"}]}, "needs 'state'"),
        (
            {"tables": [{"name": "t", "uri": "/t", "sink": "x", "state": "/s", "polling": 1}]},
            r"unknown key\(s\) \['polling'\]",
        ),
        (
            {"tables": [{"name": "t", "uri": "/t", "sink": "x", "state": "/s", "mode": "tail"}]},
            "'mode' must be one of 'snapshot', 'follow', 'snapshot-and-follow'",
        ),
        ({"server": {"port": 1}, "tables": []}, r"\[server\]: unknown key"),
        (
            {"tables": [{"name": "a b", "uri": "/t", "sink": "x", "state": "/s"}]},
            "may only hold letters",
        ),
        (
            {"tables": [{"name": "t", "uri": "/t", "sink": "x", "state": "/s", "from": "soon"}]},
            "not an ISO-8601 timestamp",
        ),
    ],
)
def test_errors_name_the_problem(document: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        parse_config(document)


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[[tables]\nname=")
    with pytest.raises(InvalidArgumentError, match=r"bad.toml: not valid TOML"):
        load_config(path)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"mode": "tail"}, "'mode' must be one of 'snapshot', 'follow', 'snapshot-and-follow'"),
        ({"name": 5}, "'name' must be a string, not 5"),
        ({"uri": 5}, "'uri' must be a string, not 5"),
        ({"notifications": "false"}, "'notifications' must be true or false, not 'false'"),
    ],
)
def test_errors_name_the_place_once(entry: dict[str, object], message: str) -> None:
    table = {"name": "a", "uri": "/t", "sink": "jsonl:-", "state": "/s", **entry}
    with pytest.raises(InvalidArgumentError) as e:
        parse_config({"tables": [table]}, "bad5.toml")
    text = str(e.value)
    assert text.count("bad5.toml") == 1 and message in text
    where = "bad5.toml [[tables]] #1" if "name" in entry else "bad5.toml [[tables]] #1 (a)"
    assert text.startswith(f"{where}: ")


def test_server_errors_name_the_section_once() -> None:
    # One prefix for [server] too (it used to read "c.toml: c.toml: 'http' must …").
    table = {"name": "a", "uri": "/t", "sink": "jsonl:-", "state": "/s"}
    document = {"server": {"http": 9464}, "tables": [table]}
    with pytest.raises(InvalidArgumentError) as e:
        parse_config(document, "c.toml")
    assert str(e.value) == "c.toml [server]: 'http' must be a string, not 9464"


def test_every_sink_spec_is_checked_when_the_file_loads() -> None:
    tables = [
        {"name": "a", "uri": "/t", "sink": "jsonl:/out/a.jsonl", "state": "/s/a"},
        {"name": "b", "uri": "/t", "sink": "kafka:x", "state": "/s/b"},
    ]
    with pytest.raises(InvalidArgumentError) as e:
        parse_config({"tables": tables}, "c.toml")
    assert str(e.value).startswith(
        "c.toml [[tables]] #2 (b): sink 'kafka:x' is not a sink "
        "(known kinds: jsonl, parquet, http, https, exec, delta, postgresql, postgres): accepted "
        "forms are jsonl:PATH"
    )


@pytest.mark.parametrize(
    ("http", "message"),
    [
        ("9464", "c.toml [server]: 'http' must be HOST:PORT (e.g. 127.0.0.1:9464), not '9464'"),
        ("localhost", "c.toml [server]: 'http' must be HOST:PORT (e.g. 127.0.0.1:9464), not"),
        ("http://127.0.0.1:9464", "c.toml [server]: 'http' must be HOST:PORT"),
        (
            "127.0.0.1:99999",
            "c.toml [server]: 'http' '127.0.0.1:99999': the port must be a number from 0 to "
            "65535, not '99999'",
        ),
        ("127.0.0.1:", "the port must be a number from 0 to 65535, not ''"),
    ],
)
def test_the_http_address_is_checked_when_the_file_loads(http: str, message: str) -> None:
    table = {"name": "a", "uri": "/t", "sink": "jsonl:-", "state": "/s"}
    with pytest.raises(InvalidArgumentError) as e:
        parse_config({"server": {"http": http}, "tables": [table]}, "c.toml")
    assert str(e.value).startswith("c.toml [server]: 'http' ") and message in str(e.value)


@pytest.mark.parametrize("http", ["127.0.0.1:9464", ":0", "[::1]:9464", "0.0.0.0:1", ""])
def test_good_http_addresses(http: str) -> None:
    table = {"name": "a", "uri": "/t", "sink": "jsonl:-", "state": "/s"}
    config = parse_config({"server": {"http": http}, "tables": [table]})
    assert config.http_address == (http or None)
