"""A mirror keyed on ``_row_id`` (``key=_row_id``) of a table without a key: rows that repeat
whole are told apart by their row ids, so the mirror (delta and PostgreSQL sinks) stays the
source's rows, row ids and row commit versions included, through updates with and without
``cdc`` files, a copy-on-write delete and an ``OPTIMIZE`` (which commits no data change: its
rows keep their materialized ids); and the tailer's own streams with row ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mirror_targets import Mirror
from row_tracking_tables import KeylessHistory
from tailing import deliver_through, small_deliveries

import deltastream as ds
from deltastream.daemon.sinks import CallbackSink, parse_sink
from deltastream.daemon.stream.config import Mode, StartFrom
from deltastream.daemon.stream.tailer import Tailer

pytestmark = pytest.mark.anyio

COLUMNS = ("id", "value", "_row_id", "_row_commit_version")


def source_rows(uri: str, version: int) -> list[tuple[Any, ...]]:
    return sorted(
        tuple(r.values())
        for r in ds.read_rows(uri, version=version, row_ids=True).read_all().to_pylist()
    )


@pytest.fixture(params=["delta", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Mirror:
    postgres = request.getfixturevalue("postgres") if request.param == "postgresql" else None
    return Mirror(request.param, tmp_path, postgres, COLUMNS, key="_row_id")


@pytest.mark.parametrize("cdf", [True, False], ids=["cdc-files", "no-change-data"])
async def test_a_keyless_table_mirrored_by_row_id(
    tmp_path: Path, target: Mirror, cdf: bool
) -> None:
    """With cdc files the stream starts from the snapshot of version 1; without change data
    it follows from version 0, inferring each version's changes (exact, by row id)."""
    history = KeylessHistory(tmp_path / "source", cdf=cdf)
    uri = history.t.uri
    latest = history.first()
    start: dict[str, Any] = (
        {"mode": Mode.SNAPSHOT_AND_FOLLOW, "start": StartFrom(version=1)}
        if cdf
        else {"infer_without_cdf": True}
    )
    # Two rows per delivery: versions are applied in parts.
    cfg = small_deliveries(uri, tmp_path / "state", max_rows_per_delivery=2, **start)
    assert not cfg.row_ids  # the sink's key asks for them
    await deliver_through(cfg, parse_sink(target.spec), latest)
    assert target.rows() == source_rows(uri, latest) == sorted(KeylessHistory.AT_3)
    latest = history.second()
    await deliver_through(cfg, parse_sink(target.spec), latest)
    assert target.rows() == source_rows(uri, latest) == sorted(KeylessHistory.AT_5)


async def test_a_stream_with_row_ids(tmp_path: Path) -> None:
    """``row_ids`` on a stream into any sink: the snapshot's rows and then the changes, each
    with its row id; the OPTIMIZE delivers nothing."""
    history = KeylessHistory(tmp_path / "source", cdf=True)
    history.first()
    latest = history.second()
    seen: list[tuple[Any, ...]] = []

    def record(delivery: Any) -> None:
        for b in delivery.batches:
            seen.extend(
                (r["_commit_version"], r["_change_type"], r["value"], r["_row_id"])
                for r in b.to_pylist()
            )

    cfg = small_deliveries(
        history.t.uri,
        tmp_path / "state",
        mode=Mode.SNAPSHOT_AND_FOLLOW,
        start=StartFrom(version=2),
        row_ids=True,
    )
    await deliver_through(cfg, CallbackSink(record, description="record"), latest)
    assert sorted(seen) == sorted(
        [
            (2, "insert", "a", 0),
            (2, "insert", "b", 2),
            (2, "insert", "a", 3),
            (2, "insert", "z", 1),
            (4, "delete", "a", 3),
            (5, "update_preimage", "a", 0),
            (5, "update_preimage", "z", 1),
            (5, "update_postimage", "q", 0),
            (5, "update_postimage", "q", 1),
        ]
    )


async def test_a_mirror_keyed_on_row_ids_of_a_table_without_row_tracking(
    tmp_path: Path,
) -> None:
    """The stream stops with the error naming the table and the setting."""
    source = tmp_path / "source"
    history = KeylessHistory(source, cdf=False)
    history.t.enabled = False
    history.first()
    cfg = small_deliveries(history.t.uri, tmp_path / "state")
    sink = parse_sink(f"delta:{tmp_path / 'mirror'}?mode=merge&key=_row_id")
    with pytest.raises(ds.InvalidArgumentError) as caught:
        await Tailer(cfg, sink).run()
    await sink.aclose()
    assert str(caught.value) == (
        f"{history.t.uri}: row ids were asked for, but the table does not enable row "
        "tracking at version 0 (delta.enableRowTracking is not set, not 'true'): its rows "
        "have no stable row ids"
    )
