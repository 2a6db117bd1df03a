"""Mid-stream events: schema changes, protocol changes, commits lost to log retention, data
files vacuumed before they were read. Each either stops the stream with an error naming
what happened (after delivering everything before it) or, when configured, carries on."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest
from cdf_tables import upgraded_without_cdf_feature
from deltalake import DeltaTable, write_deltalake
from mapping_tables import append, history, history_changes, ordered, rename_column, rows
from tailing import (
    Collector,
    Writer,
    batch,
    change_key,
    create_table,
    expected_changes,
    fast,
    run_until_delivered,
)

from deltastream.daemon.delivery import Position
from deltastream.daemon.stream.tailer import (
    Mode,
    OnMissingFile,
    OnMissingVersions,
    OnSchemaChange,
    StartFrom,
    TailConfig,
    Tailer,
)
from deltastream.errors import (
    ChangeDataNotEnabledError,
    DataFileNotFoundError,
    MissingVersionsError,
    SchemaChangeError,
    UnsupportedFeatureError,
)


def follow(tmp_path: Path, uri: str, **changes: Any) -> TailConfig:
    return fast(
        TailConfig(
            name="t",
            uri=uri,
            state=str(tmp_path / "state"),
            mode=Mode.FOLLOW,
            start=StartFrom(version=0),
        ),
        **changes,
    )


async def run_expecting(config: TailConfig, collector: Collector) -> Tailer:
    """Run a tailer that must stop by itself with an error (raised to the caller)."""
    tailer = Tailer(config, collector.sink())
    with anyio.fail_after(30):
        await tailer.run()
    raise AssertionError(f"the tailer stopped without an error at {tailer.position}")


def commit(uri: str, version: int, *actions: dict[str, Any]) -> None:
    path = Path(uri, "_delta_log", f"{version:020d}.json")
    with open(path, "x") as f:
        f.write("\n".join(json.dumps(a) for a in actions) + "\n")


# ---------------------------------------------------------------- schema changes


@pytest.mark.anyio
async def test_additive_schema_change_continues_with_the_new_schema(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = str(tmp_path / "t")
    create_table(uri, rows=3)
    extra = batch([7]).append_column("score", pa.array([9.5]))
    write_deltalake(uri, extra, mode="append", schema_mode="merge")
    write_deltalake(uri, extra.set_column(0, "id", pa.array([8], pa.int64())), mode="append")
    collector = Collector()
    with caplog.at_level(logging.INFO, logger="deltastream"):
        await run_until_delivered(follow(tmp_path, uri), collector, 2)
    assert "version 1 adds column 'score'; continuing with the new schema" in caplog.text
    by_id = {r["id"]: r for r in collector.rows}
    assert "score" not in by_id[0]
    assert by_id[7]["score"] == 9.5 and by_id[8]["score"] == 9.5
    # The schema changes at a delivery boundary.
    schemas = [d.schema.names for d in collector.deliveries if d.num_rows]
    assert schemas[0][:3] == ["id", "name", "part"] and "score" not in schemas[0]
    assert "score" in schemas[-1]


def _drop_name_column(uri: str) -> None:
    write_deltalake(
        uri,
        pa.table({"id": pa.array([50], pa.int64()), "part": pa.array(["p0"])}),
        mode="overwrite",
        schema_mode="overwrite",
        partition_by=["part"],
    )


@pytest.mark.anyio
async def test_non_additive_schema_change_stops_after_delivering_what_came_before(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t")
    create_table(uri, rows=3)
    write_deltalake(uri, batch([3]), mode="append")
    _drop_name_column(uri)  # version 2
    collector = Collector()
    with pytest.raises(SchemaChangeError, match="version 2 drops column 'name'") as info:
        await run_expecting(follow(tmp_path, uri), collector)
    assert info.value.version == 2
    # (delta-rs reads older versions with the latest schema, without 'name'.)
    assert collector.counter(["id"]) == expected_changes(uri, 0, 1, columns=["id"])
    assert collector.deliveries[-1].end == Position(2)
    # A restart stops at the same place, delivering nothing again.
    again = Collector()
    with pytest.raises(SchemaChangeError):
        await run_expecting(follow(tmp_path, uri), again)
    assert again.rows == []
    # The message's advice, followed: the rest, once.
    assert "set on_schema_change to 'continue' and restart the stream" in str(info.value)
    rest = Collector()
    config = follow(tmp_path, uri, on_schema_change=OnSchemaChange.CONTINUE)
    await run_until_delivered(config, rest, 2)
    assert rest.counter(["id"]) == expected_changes(uri, 2, 2, columns=["id"])


@pytest.mark.anyio
async def test_non_additive_schema_change_can_be_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = str(tmp_path / "t")
    create_table(uri, rows=3)
    _drop_name_column(uri)
    collector = Collector()
    config = follow(tmp_path, uri, on_schema_change=OnSchemaChange.CONTINUE)
    with caplog.at_level(logging.WARNING, logger="deltastream"):
        await run_until_delivered(config, collector, 1)
    assert "version 1 drops column 'name'; continuing with the new schema" in caplog.text
    after = [r for r in collector.rows if r["_commit_version"] == 1]
    assert Counter((r["_change_type"], r["id"]) for r in after) == Counter(
        [("delete", 0), ("delete", 1), ("delete", 2), ("insert", 50)]
    )
    assert all("name" not in r for r in after)


@pytest.mark.anyio
async def test_column_rename_under_column_mapping_is_non_additive(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri, rows=2)
    first_commit = Path(uri, "_delta_log", f"{0:020d}.json").read_text()  # noqa: ASYNC240
    first = [json.loads(line) for line in first_commit.splitlines()]
    metadata = next(a["metaData"] for a in first if "metaData" in a)
    schema = json.loads(metadata["schemaString"])
    schema["fields"][1]["name"] = "label"
    renamed = {**metadata, "schemaString": json.dumps(schema)}
    commit(uri, 1, {"metaData": renamed})
    with pytest.raises(SchemaChangeError, match="drops column 'name'"):
        await run_expecting(follow(tmp_path, uri), Collector())


def _rows(collector: Collector) -> list[dict[str, Any]]:
    """What a stream delivered, ``_commit_timestamp`` left out, in ``ordered`` order."""
    found = [{k: v for k, v in r.items() if k != "_commit_timestamp"} for r in collector.rows]
    return sorted(found, key=ordered)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["name", "id"])
@pytest.mark.parametrize("on_schema_change", [OnSchemaChange.STOP, OnSchemaChange.CONTINUE])
async def test_turning_column_mapping_on_is_no_schema_change(
    tmp_path: Path,
    mode: str,
    on_schema_change: OnSchemaChange,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """v2 turns the mapping on (physical names = the names): the logical schema is the
    same, the files before it are read unmapped, the stream goes on without a word."""
    uri = str(tmp_path / "t")
    history(uri, mode)
    collector = Collector()
    config = follow(tmp_path, uri, on_schema_change=on_schema_change)
    with caplog.at_level(logging.INFO, logger="deltastream"):
        await run_until_delivered(config, collector, 4)
    assert _rows(collector) == history_changes()
    assert "with the new schema" not in caplog.text


@pytest.mark.anyio
async def test_a_rename_after_turning_column_mapping_on_stops_the_stream_unless_followed(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "t")
    history(uri, "name")
    rename_column(uri, "id", "key")  # v5
    append(uri, rows([5], id_name="key"))  # v6
    collector = Collector()
    with pytest.raises(SchemaChangeError) as info:
        await run_expecting(follow(tmp_path, uri), collector)
    assert info.value.version == 5
    assert str(info.value) == (
        f"{uri}: version 5 renames column 'id' to 'key': a non-additive schema change; the "
        "stream stops before it, with every version before it delivered: set "
        "on_schema_change to 'continue' and restart the stream to go on from its state with "
        "the new schema (nothing is lost or delivered twice)"
    )
    assert _rows(collector) == history_changes()
    v6 = {"key": 5, "part": "x", "s": {"a": 5}, "_change_type": "insert", "_commit_version": 6}
    # The advice, followed literally: the same stream restarted goes on from its state.
    resumed = Collector()
    same = follow(tmp_path, uri, on_schema_change=OnSchemaChange.CONTINUE)
    await run_until_delivered(same, resumed, 6)
    assert _rows(resumed) == [v6]
    followed = Collector()
    config = follow(tmp_path / "continued", uri, on_schema_change=OnSchemaChange.CONTINUE)
    await run_until_delivered(config, followed, 6)
    assert _rows(followed) == [*history_changes(), v6]
    # A stream started after the rename reads with the new name from its start; so does
    # one started at the rename itself, which delivered nothing of the schema before it.
    for start in (6, 5):
        later = Collector()
        config = replace(follow(tmp_path / f"later{start}", uri), start=StartFrom(version=start))
        await run_until_delivered(config, later, 6)
        assert _rows(later) == [v6]


# ---------------------------------------------------------------- protocol


@pytest.mark.anyio
async def test_unsupported_reader_feature_stops_naming_it(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri, rows=2)
    write_deltalake(uri, batch([5]), mode="append")
    before = expected_changes(uri, 0, 1)
    commit(
        uri,
        2,
        {
            "protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": ["teleportation"],
                "writerFeatures": ["teleportation"],
            }
        },
    )
    collector = Collector()
    with pytest.raises(UnsupportedFeatureError, match="'teleportation'") as info:
        await run_expecting(follow(tmp_path, uri), collector)
    assert info.value.feature == "teleportation"
    assert collector.counter() == before


@pytest.mark.anyio
async def test_changes_without_the_feed_stop_unless_inferred(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, batch(range(4)), partition_by=["part"])  # no change data feed
    DeltaTable(uri).delete("id = 1")
    first = Collector()
    with pytest.raises(ChangeDataNotEnabledError, match=r"version\(s\) 1") as caught:
        await run_expecting(follow(tmp_path, uri), first)
    assert str(caught.value).endswith(
        "; the stream stops before it, with every version before it delivered: set "
        "infer_without_cdf and restart the stream to go on from its state (nothing is lost or "
        "delivered twice)"
    )
    assert {r["_commit_version"] for r in first.rows} == {0}
    # The advice, followed literally: the same stream goes on from version 1.
    collector = Collector()
    await run_until_delivered(follow(tmp_path, uri, infer_without_cdf=True), collector, 1)
    assert {r["_commit_version"] for r in collector.rows} == {1}
    assert (
        Counter(r["_change_type"] for r in collector.rows if r["_commit_version"] == 1)["delete"]
        >= 1
    )


# ---------------------------------------------------------------- log retention


async def _tail_to(tmp_path: Path, uri: str, version: int, **changes: Any) -> Collector:
    collector = Collector()
    await run_until_delivered(follow(tmp_path, uri, **changes), collector, version)
    return collector


def _remove_commits(uri: str, versions: range) -> None:
    for v in versions:
        os.unlink(Path(uri, "_delta_log", f"{v:020d}.json"))


@pytest.mark.anyio
async def test_commits_removed_before_they_were_read_stop_the_stream(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    Writer(uri, commits=2).run()
    await _tail_to(tmp_path, uri, 2)
    Writer(uri, commits=6, first_id=3000).run()  # versions 3..8
    DeltaTable(uri).create_checkpoint()  # at 8
    _remove_commits(uri, range(3, 6))
    with pytest.raises(MissingVersionsError, match=r"missing commit version\(s\) 3-5") as info:
        await run_expecting(follow(tmp_path, uri), Collector())
    assert info.value.missing == (3, 4, 5)
    assert str(info.value).endswith(
        "set on_missing_versions to 'resume-from-checkpoint' and restart the stream to go on "
        "from the oldest checkpoint after them (the changes of the removed versions are not "
        "delivered; nothing else is lost or delivered twice))"
    )
    # The advice, followed literally: the same stream goes on from the oldest commit after
    # the removed ones (6; the table state from the checkpoint at 8).
    collector = Collector()
    skip = OnMissingVersions.RESUME_FROM_CHECKPOINT
    await run_until_delivered(follow(tmp_path, uri, on_missing_versions=skip), collector, 8)
    assert collector.counter() == expected_changes(uri, 6, 8)


@pytest.mark.anyio
async def test_commits_removed_can_resume_from_the_oldest_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    Writer(uri, commits=2).run()
    await _tail_to(tmp_path, uri, 2)
    Writer(uri, commits=3, first_id=3000).run()  # versions 3..5
    DeltaTable(uri).create_checkpoint()  # at 5
    Writer(uri, commits=3, first_id=4000).run()  # versions 6..8
    _remove_commits(uri, range(3, 5))
    collector = Collector()
    with caplog.at_level(logging.WARNING, logger="deltastream"):
        await run_until_delivered(
            follow(tmp_path, uri, on_missing_versions=OnMissingVersions.RESUME_FROM_CHECKPOINT),
            collector,
            8,
        )
    # Version 5's commit is still there: only 3 and 4 are gone, and 5 is delivered.
    assert "versions skipped: 3..4" in caplog.text
    assert collector.counter() == expected_changes(uri, 5, 8)


@pytest.mark.anyio
@pytest.mark.parametrize("saved_state", [True, False], ids=["saved-state", "no-saved-state"])
async def test_resuming_from_a_checkpoint_skips_exactly_the_versions_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, saved_state: bool
) -> None:
    """Issue 22, case 3: stopped after version 3; log cleanup removed commits 0..12 and
    left the checkpoint of version 13 with 13.json and after. Versions 4..12 are gone;
    version 13 is readable from its commit (``changes --from 13 --to 13`` reads it), so it
    is delivered, and the skipped versions are named exactly. With the stream's own saved
    table state (the follow path finds the gap) and without it (the start finds it)."""
    uri = str(tmp_path / "t")
    create_table(uri)
    Writer(uri, commits=3).run()  # versions 1..3
    await _tail_to(tmp_path, uri, 3)
    Writer(uri, commits=10, first_id=3000).run()  # versions 4..13
    DeltaTable(uri).create_checkpoint()  # at 13
    Writer(uri, commits=2, first_id=4000).run()  # versions 14..15
    expected = expected_changes(uri, 13, 15)
    _remove_commits(uri, range(0, 13))
    if not saved_state:
        shutil.rmtree(tmp_path / "state" / "snapshots")
    collector = Collector()
    with caplog.at_level(logging.WARNING, logger="deltastream"):
        await run_until_delivered(
            follow(tmp_path, uri, on_missing_versions=OnMissingVersions.RESUME_FROM_CHECKPOINT),
            collector,
            15,
        )
    skipped = [r.getMessage() for r in caplog.records if "versions skipped" in r.getMessage()]
    assert skipped == [
        "t: commits from version 4 were removed from the log before they were read; resuming "
        "at version 13 (the table state from the checkpoint of version 13); versions "
        "skipped: 4..12"
    ]
    assert collector.counter() == expected
    assert {r["_commit_version"] for r in collector.rows} == {13, 14, 15}


@pytest.mark.anyio
async def test_a_stream_resumed_inside_retained_commits_follows_on_with_the_checkpoints_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Commits 0..4 removed, 5..12 kept, the oldest checkpoint at 10: a stream stopped
    after version 2 skips 3 and 4 only, delivers 5..12 from their commits, and takes the
    table state from the checkpoint when it reaches version 10 (a saved state it can use
    later proves the state is right: the restart after it replays nothing wrong)."""
    uri = str(tmp_path / "t")
    create_table(uri)
    Writer(uri, commits=2).run()  # versions 1..2
    await _tail_to(tmp_path, uri, 2)
    Writer(uri, commits=8, first_id=3000).run()  # versions 3..10
    DeltaTable(uri).create_checkpoint()  # at 10
    Writer(uri, commits=2, first_id=4000).run()  # versions 11..12
    expected = expected_changes(uri, 5, 12)
    _remove_commits(uri, range(0, 5))
    collector = Collector()
    config = follow(
        tmp_path,
        uri,
        on_missing_versions=OnMissingVersions.RESUME_FROM_CHECKPOINT,
        checkpoint_every_versions=1,
    )
    with caplog.at_level(logging.WARNING, logger="deltastream"):
        tailer = await run_until_delivered(config, collector, 12)
    assert (
        "resuming at version 5 (the table state from the checkpoint of version 10); "
        "versions skipped: 3..4"
    ) in caplog.text
    assert collector.counter() == expected
    # The table state the stream saved at 12 is the table's own at 12.
    table = tailer._follower.table
    assert table is not None and table.version == 12
    live = sorted(table.to_log_state().files.column("path").to_pylist())
    adds = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
    assert live == sorted(adds.column("path").to_pylist())


# ---------------------------------------------------------------- vacuumed files


def _added_files(uri: str, version: int) -> list[str]:
    lines = Path(uri, "_delta_log", f"{version:020d}.json").read_text().splitlines()
    return [json.loads(line)["add"]["path"] for line in lines if '"add"' in line]


@pytest.mark.anyio
async def test_vacuumed_data_file_stops_naming_file_and_version(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    await _tail_to(tmp_path, uri, 0)
    write_deltalake(uri, batch([100, 101, 102]), mode="append")  # version 1
    gone = _added_files(uri, 1)[0]
    os.unlink(Path(uri, gone))
    with pytest.raises(DataFileNotFoundError, match=r"\(named by version 1\)") as info:
        await run_expecting(follow(tmp_path, uri), Collector())
    assert info.value.path.endswith(gone) and info.value.version == 1


@pytest.mark.anyio
async def test_vacuumed_data_file_can_be_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = str(tmp_path / "t")
    create_table(uri)
    await _tail_to(tmp_path, uri, 0)
    write_deltalake(uri, batch([100, 101, 102]), mode="append")  # version 1, 3 files
    write_deltalake(uri, batch([200]), mode="append")  # version 2
    gone = _added_files(uri, 1)[0]
    kept = set(_added_files(uri, 1)) - {gone}
    os.unlink(Path(uri, gone))
    collector = Collector()
    with caplog.at_level(logging.WARNING, logger="deltastream"):
        tailer = await run_until_delivered(
            follow(tmp_path, uri, on_missing_file=OnMissingFile.SKIP), collector, 2
        )
    assert f"skipping {Path(uri, gone)} (named by version 1)" in caplog.text
    assert tailer.metrics.skipped_files == 1
    ids = sorted(r["id"] for r in collector.rows)
    assert 200 in ids and len([i for i in ids if i >= 100 and i < 200]) == len(kept)
    assert {change_key(r)[0] for r in collector.rows} == {1, 2}


@pytest.mark.anyio
async def test_a_rewrite_while_the_feed_was_not_in_force_stops_the_stream(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    upgraded_without_cdf_feature(table)  # v2 rewrites a file: only the table property is on
    config = fast(
        TailConfig(
            name="t",
            uri=table,
            state=str(tmp_path / "state"),
            mode=Mode.FOLLOW,
            start=StartFrom(version=0),
            notifications=False,
        )
    )
    collected = Collector()
    with pytest.raises(ChangeDataNotEnabledError) as caught:
        await Tailer(config, collected.sink()).run()
    assert caught.value.versions == (2,)
    assert Counter((r["_commit_version"], r["_change_type"]) for r in collected.rows) == {
        (0, "insert"): 50
    }
