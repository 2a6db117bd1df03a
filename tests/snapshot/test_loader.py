"""Loading snapshots from hand-built logs: every defect the loader must detect or survive,
checkpoint fallbacks, time travel by version, and how few requests a load costs."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import anyio
import logbuilder as lb
import pytest

import deltastream as ds
from deltastream.log.version_checksum import parse_version_checksum
from deltastream.snapshot.loader import load_snapshot
from deltastream.storage.local import LocalStore

P, M = lb.protocol(), lb.metadata()


def load(root: Path, version: int | None = None, **kw: object) -> ds.Snapshot:
    return ds.read_snapshot(str(root), version, **kw)  # type: ignore[arg-type]


def paths(snap: ds.Snapshot) -> set[str]:
    return set(snap.files.column("path").to_pylist())


def ten_commits(w: lb.LogWriter) -> None:
    """Versions 0..9: file i added at version i, file i-3 removed at version i."""
    w.commit(0, lb.commit_info(), P, M, lb.add("part=a/f0.parquet"))
    for v in range(1, 10):
        actions = [lb.commit_info(), lb.add(f"part=a/f{v}.parquet")]
        if v >= 3:
            actions.append(lb.remove(f"part=a/f{v - 3}.parquet"))
        w.commit(v, *actions)


def live_at(version: int) -> set[str]:
    return {f"part=a/f{i}.parquet" for i in range(max(0, version - 2), version + 1)}


def checkpoint_actions(version: int) -> list[dict[str, object]]:
    return [P, M, *[lb.add(p) for p in sorted(live_at(version))]]


# --- not a table -------------------------------------------------------------------------


def test_missing_directory_is_not_a_table(tmp_path: Path) -> None:
    with pytest.raises(ds.TableNotFoundError, match="not a Delta table"):
        load(tmp_path / "nope")


def test_empty_log_is_not_a_table(tmp_path: Path) -> None:
    (tmp_path / "_delta_log").mkdir()
    (tmp_path / "_delta_log" / "notes.txt").write_text("hi")
    with pytest.raises(ds.TableNotFoundError) as info:
        load(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_plain_parquet_directory_is_not_a_table(tmp_path: Path) -> None:
    (tmp_path / "part-0.parquet").write_bytes(b"PAR1")
    with pytest.raises(ds.TableNotFoundError):
        load(tmp_path)


# --- corrupt commits ---------------------------------------------------------------------


def test_truncated_commit_line_names_file_and_line(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    p = w.path(f"{7:020d}.json")
    p.write_bytes(p.read_bytes()[:-25])  # cut inside the last action
    with pytest.raises(ds.CorruptCommitError) as info:
        load(tmp_path)
    msg = str(info.value)
    assert p.name in msg and "line 3" in msg and "invalid JSON" in msg
    assert load(tmp_path, 6).version == 6  # versions before it still load


def test_non_json_commit_line(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    w.commit(0, P, M)
    w.raw(
        f"{1:020d}.json",
        b'{"add": {"path": "x", "size": 1, "partitionValues": {}}}\nnot json at all\n',
    )
    with pytest.raises(
        ds.CorruptCommitError, match=r"00000000000000000001\.json: line 2: invalid JSON"
    ):
        load(tmp_path)


# --- checkpoints -------------------------------------------------------------------------


def test_truncated_checkpoint_falls_back_to_commits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    (cp,) = w.checkpoint(8, checkpoint_actions(8))
    w.last_checkpoint(8)
    cp.write_bytes(cp.read_bytes()[: cp.stat().st_size // 2])
    with caplog.at_level(logging.WARNING):
        snap = load(tmp_path)
    assert snap.version == 9 and paths(snap) == live_at(9)
    assert snap.segment.checkpoint_version is None
    assert any(
        cp.name in r.getMessage() and "falling back" in r.getMessage() for r in caplog.records
    )


def test_truncated_checkpoint_falls_back_to_older_checkpoint(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    w.checkpoint(4, checkpoint_actions(4))
    (cp8,) = w.checkpoint(8, checkpoint_actions(8))
    cp8.write_bytes(b"PAR1 definitely not parquet PAR1")
    for v in range(4):  # commits before the older checkpoint were cleaned up
        w.path(f"{v:020d}.json").unlink()
    snap = load(tmp_path)
    assert snap.segment.checkpoint_version == 4 and paths(snap) == live_at(9)


def test_truncated_checkpoint_without_fallback_is_an_error(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    (cp,) = w.checkpoint(8, checkpoint_actions(8))
    cp.write_bytes(cp.read_bytes()[:100])
    for v in range(8):
        w.path(f"{v:020d}.json").unlink()
    with pytest.raises(ds.CorruptCheckpointError) as info:
        load(tmp_path)
    msg = str(info.value)
    assert cp.name in msg and "not a readable parquet file" in msg and "missing commit" in msg


def test_missing_checkpoint_part_is_ignored(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    parts = w.checkpoint(8, checkpoint_actions(8), parts=3)
    parts[1].unlink()
    snap = load(tmp_path)
    assert snap.segment.checkpoint_version is None and paths(snap) == live_at(9)


def test_missing_checkpoint_part_without_fallback_is_an_error(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    parts = w.checkpoint(8, checkpoint_actions(8), parts=3)
    w.last_checkpoint(8, parts=3)
    parts[2].unlink()
    for v in range(8):
        w.path(f"{v:020d}.json").unlink()
    with pytest.raises(
        ds.IncompleteCheckpointError, match=r"checkpoint 8 has 2 of 3 parts \(part\(s\) 3 missing\)"
    ):
        load(tmp_path)


def test_multi_part_checkpoint_is_used(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    w.checkpoint(8, checkpoint_actions(8), parts=3)
    snap = load(tmp_path)
    assert snap.segment.checkpoint_version == 8 and len(snap.segment.checkpoint) == 3
    assert [f.version for f in snap.segment.replay] == [9]
    assert paths(snap) == live_at(9)


def test_v2_checkpoint_with_sidecars(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    v2 = lb.protocol(3, 7, ["v2Checkpoint"], ["v2Checkpoint"])
    w.commit(0, v2, M, *[lb.add(f"part=a/f{i}.parquet") for i in range(6)])
    w.v2_checkpoint(0, [v2, M, *[lb.add(f"part=a/f{i}.parquet") for i in range(6)]], sidecars=3)
    w.commit(1, lb.remove("part=a/f0.parquet"))
    snap = load(tmp_path)
    assert snap.segment.checkpoint_version == 0
    assert paths(snap) == {f"part=a/f{i}.parquet" for i in range(1, 6)}


def test_v2_checkpoint_with_missing_sidecar(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    v2 = lb.protocol(3, 7, ["v2Checkpoint"], ["v2Checkpoint"])
    w.commit(0, v2, M, lb.add("part=a/f0.parquet"))
    w.commit(1, lb.add("part=a/f1.parquet"))
    w.v2_checkpoint(1, [v2, M, lb.add("part=a/f0.parquet"), lb.add("part=a/f1.parquet")])
    sidecar = next((tmp_path / "_delta_log" / "_sidecars").iterdir())
    sidecar.unlink()
    assert paths(load(tmp_path)) == {"part=a/f0.parquet", "part=a/f1.parquet"}  # via commits
    w.path(f"{0:020d}.json").unlink()
    with pytest.raises(ds.CorruptCheckpointError, match=f"sidecar .*{sidecar.name}.* is missing"):
        load(tmp_path)


def test_checkpoint_without_protocol_is_an_invalid_state(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    w.checkpoint(8, [M, *[lb.add(p) for p in sorted(live_at(8))]])
    with pytest.raises(
        ds.InvalidTableStateError, match=r"no protocol action .* checkpoint of version 8"
    ):
        load(tmp_path)


# --- _last_checkpoint --------------------------------------------------------------------


def test_last_checkpoint_pointing_at_missing_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    w.checkpoint(4, checkpoint_actions(4))
    w.last_checkpoint(8)  # there is no checkpoint 8
    with caplog.at_level(logging.WARNING):
        snap = load(tmp_path)
    assert snap.segment.checkpoint_version == 4 and paths(snap) == live_at(9)
    assert any(
        "points at checkpoint 8, which is not in the log" in r.getMessage() for r in caplog.records
    )


def test_last_checkpoint_pointing_at_missing_checkpoint_without_fallback(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    w.last_checkpoint(8)
    for v in range(3):
        w.path(f"{v:020d}.json").unlink()
    with pytest.raises(ds.MissingVersionsError) as info:
        load(tmp_path)
    assert info.value.missing == (0, 1, 2)


def test_last_checkpoint_with_bad_checksum_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    w.checkpoint(8, checkpoint_actions(8))
    p = w.last_checkpoint(8)
    body = json.loads(p.read_text())
    body["version"] = 4  # content changed, checksum not updated
    p.write_text(json.dumps(body))
    with caplog.at_level(logging.WARNING):
        snap = load(tmp_path)
    assert snap.segment.checkpoint_version == 8 and paths(snap) == live_at(9)
    assert any("checksum mismatch" in r.getMessage() for r in caplog.records)


def test_stale_last_checkpoint_still_finds_newer_checkpoint(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    w.checkpoint(4, checkpoint_actions(4))
    w.checkpoint(8, checkpoint_actions(8))
    w.last_checkpoint(4)
    snap = load(tmp_path)
    assert snap.segment.checkpoint_version == 8


# --- gaps, features, versions ------------------------------------------------------------


def test_version_gap_names_the_missing_version(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    w.path(f"{6:020d}.json").unlink()
    with pytest.raises(ds.MissingVersionsError, match=r"missing commit version\(s\) 6 ") as info:
        load(tmp_path)
    assert info.value.missing == (6,)
    assert load(tmp_path, 5).version == 5


def test_unknown_reader_feature(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    w.commit(
        0, lb.protocol(3, 7, ["deletionVectors", "blahabl"], ["deletionVectors", "blahabl"]), M
    )
    with pytest.raises(ds.UnsupportedFeatureError, match="'blahabl'") as info:
        load(tmp_path)
    assert info.value.feature == "blahabl"


def test_protocol_upgrade_to_unsupported_feature_fails_only_from_that_version(
    tmp_path: Path,
) -> None:
    w = lb.LogWriter(tmp_path)
    w.commit(0, P, M, lb.add("part=a/x.parquet"))
    w.commit(1, lb.protocol(3, 7, ["geospatial"], ["geospatial"]))
    assert load(tmp_path, 0).num_files == 1
    with pytest.raises(ds.UnsupportedFeatureError, match="geospatial"):
        load(tmp_path)


@pytest.mark.parametrize(
    "features",
    [
        ["variantType"],
        ["variantType-preview"],
        ["variantType", "variantShredding"],
        ["variantType", "variantShredding-preview"],
        ["deletionVectors", "variantType"],  # what delta-rs 1.6 writes with deletion vectors
    ],
    ids=",".join,
)
def test_protocol_upgrade_to_variant_features_still_loads(
    tmp_path: Path, features: list[str]
) -> None:
    # The variant features are implemented: a table listing them (with or without a
    # variant column) loads like any other.
    w = lb.LogWriter(tmp_path)
    w.commit(0, P, M, lb.add("part=a/x.parquet"))
    w.commit(1, lb.protocol(3, 7, features, features))
    snap = load(tmp_path)
    assert snap.num_files == 1
    assert list(snap.protocol.reader_features or ()) == features


def test_time_travel_by_version(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    w.checkpoint(5, checkpoint_actions(5))
    for v in range(10):
        assert paths(load(tmp_path, v)) == live_at(v)
    with pytest.raises(ds.VersionNotFoundError, match=r"available versions are 0\.\.9"):
        load(tmp_path, 10)
    for v in range(5):
        w.path(f"{v:020d}.json").unlink()
    with pytest.raises(
        ds.VersionNotFoundError, match=r"cannot load version 3: available versions are 5\.\.9"
    ):
        load(tmp_path, 3)
    assert paths(load(tmp_path, 5)) == live_at(5)


def test_negative_version_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ds.InvalidArgumentError):
        load(tmp_path, -1)


# --- log compactions ---------------------------------------------------------------------


def test_reconciled_compaction_replaces_commits(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    # A correct compaction of 3..6: last action per file, each file once.
    w.raw(
        f"{3:020d}.{6:020d}.compacted.json",
        "".join(
            json.dumps(a) + "\n"
            for a in [
                *(lb.add(f"part=a/f{i}.parquet") for i in range(3, 7)),
                *(lb.remove(f"part=a/f{i}.parquet") for i in range(0, 4)),
            ]
        ).encode(),
    )
    snap = load(tmp_path)
    assert [f.name for f in snap.segment.replay][3] == f"{3:020d}.{6:020d}.compacted.json"
    assert paths(snap) == live_at(9)


def test_unreconciled_compaction_falls_back_to_commits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    # Newest-first concatenation: replaying it in order would resurrect removed files.
    body = b"".join(w.path(f"{v:020d}.json").read_bytes() for v in range(6, 2, -1))
    w.raw(f"{3:020d}.{6:020d}.compacted.json", body)
    with caplog.at_level(logging.WARNING):
        snap = load(tmp_path)
    assert paths(snap) == live_at(9)
    assert any("not a reconciled log compaction" in r.getMessage() for r in caplog.records)


# --- checksums, timestamps, request counts -----------------------------------------------


def test_version_checksum_validation(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    w.commit(0, P, M, lb.add("part=a/x.parquet", size=10), lb.add("part=a/y.parquet", size=32))
    crc = {
        "tableSizeBytes": 42,
        "numFiles": 2,
        "numMetadata": 1,
        "numProtocol": 1,
        "protocol": P["protocol"],
        "metadata": M["metaData"],
    }
    w.raw(f"{0:020d}.crc", json.dumps(crc).encode())
    assert load(tmp_path, validate_checksum=True).num_files == 2
    crc["tableSizeBytes"] = 43
    w.raw(f"{0:020d}.crc", json.dumps(crc).encode())
    with pytest.raises(
        ds.ChecksumMismatchError,
        match="'tableSizeBytes' differs: checksum file has 43, log replay gives 42",
    ):
        load(tmp_path, validate_checksum=True)
    assert load(tmp_path).num_files == 2  # validation is opt-in
    checksum = parse_version_checksum("x", json.dumps(crc).encode())
    assert checksum.num_files == 2


def test_checksum_in_commit_timestamp_is_checked_where_the_rule_takes_it(tmp_path: Path) -> None:
    def crc(root: Path, metadata: dict[str, object], protocol: dict[str, object]) -> None:
        lb.LogWriter(root).raw(
            f"{0:020d}.crc",
            json.dumps(
                {
                    "tableSizeBytes": 0,
                    "numFiles": 0,
                    "numMetadata": 1,
                    "numProtocol": 1,
                    "protocol": protocol["protocol"],
                    "metadata": metadata["metaData"],
                    "inCommitTimestampOpt": 1_700_000_000_999,
                }
            ).encode(),
        )

    ict = lb.metadata(configuration={"delta.enableInCommitTimestamps": "true"})
    ict_protocol = lb.protocol(1, 7, None, ["inCommitTimestamp"])
    lb.LogWriter(tmp_path).commit(0, lb.commit_info(ict=1_700_000_000_000), ict_protocol, ict)
    crc(tmp_path, ict, ict_protocol)
    with pytest.raises(ds.ChecksumMismatchError, match="'inCommitTimestampOpt' differs"):
        load(tmp_path, validate_checksum=True)
    # Without in-commit timestamps the snapshot's timestamp is the file time: not compared.
    plain = tmp_path / "plain"
    lb.LogWriter(plain).commit(0, P, M, mtime_ms=1_234_567_000)
    crc(plain, M, P)
    assert load(plain, validate_checksum=True).timestamp_ms == 1_234_567_000


def test_in_commit_timestamp_is_the_snapshot_timestamp(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ict = lb.metadata(configuration={"delta.enableInCommitTimestamps": "true"})
    w.commit(
        0,
        lb.commit_info(ict=1_700_000_000_000),
        lb.protocol(1, 7, None, ["inCommitTimestamp"]),
        ict,
    )
    w.commit(1, lb.commit_info(ict=1_700_000_000_500), lb.add("part=a/x.parquet"), mtime_ms=5)
    assert load(tmp_path).timestamp_ms == 1_700_000_000_500
    plain = tmp_path / "plain"
    lb.LogWriter(plain).commit(0, P, M, mtime_ms=1_234_567_000)
    assert load(plain).timestamp_ms == 1_234_567_000


def test_latest_snapshot_costs_one_list_and_no_old_commits(tmp_path: Path) -> None:
    w = lb.LogWriter(tmp_path)
    ten_commits(w)
    w.checkpoint(8, checkpoint_actions(8))
    w.last_checkpoint(8)
    store = LocalStore(tmp_path)
    snap = anyio.run(load_snapshot, store)
    assert paths(snap) == live_at(9)
    assert store.stats.list_requests == 1
    # _last_checkpoint, the checkpoint and commit 9: nothing older is read.
    assert store.stats.get_requests == 3


def test_paths_with_special_characters(tmp_path: Path) -> None:
    root = tmp_path / "my table=1 %20 é"
    w = lb.LogWriter(root)
    w.commit(0, P, M, lb.add("part=a%20b/f%25x.parquet", part="a b"))
    snap = load(root)
    assert paths(snap) == {"part=a%20b/f%25x.parquet"}
    shutil.rmtree(root)
