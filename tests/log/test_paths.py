"""``parse_log_key``: which objects under ``_delta_log`` are log files, and what they are.

File naming follows PROTOCOL.md "Delta Log Entries", "Checkpoints", "Sidecar Files",
"Log Compaction Files", "Last Checkpoint File" and "Version Checksum File".
"""

from __future__ import annotations

import pytest

from deltastream.errors import CorruptFileError
from deltastream.log.paths import (
    LAST_CHECKPOINT_KEY,
    LogFile,
    LogFileKind,
    commit_key,
    parse_log_key,
    version_prefix,
)
from deltastream.storage.base import ObjectMeta

UUID = "80a083e8-7026-4e79-81be-64bd76c43a11"


def parse(key: str, size: int = 123, mtime: int = 1_700_000_000_000) -> LogFile | None:
    return parse_log_key(ObjectMeta(key=key, size=size, last_modified_ms=mtime))


def v(n: int) -> str:
    return f"{n:020d}"


# --- recognised file kinds -------------------------------------------------------------


def test_commit() -> None:
    f = parse(f"_delta_log/{v(7)}.json", size=55, mtime=42)
    assert f is not None
    assert f.kind is LogFileKind.COMMIT
    assert f.version == 7
    assert f.size == 55
    assert f.last_modified_ms == 42
    assert f.format == "json"
    assert f.end_version is None and f.part is None and f.num_parts is None
    assert f.name == f"{v(7)}.json"
    assert f.key == f"_delta_log/{v(7)}.json"
    assert not f.is_checkpoint


def test_commit_version_zero_and_large_version() -> None:
    f0 = parse(f"_delta_log/{v(0)}.json")
    assert f0 is not None and f0.kind is LogFileKind.COMMIT and f0.version == 0
    big = 2**63 - 1  # the largest version a Delta log can hold (a 64-bit long)
    fb = parse(f"_delta_log/{big:020d}.json")
    assert fb is not None and fb.version == big
    with pytest.raises(CorruptFileError, match="beyond the largest"):
        parse(f"_delta_log/{big + 1:020d}.json")


def test_classic_checkpoint() -> None:
    f = parse(f"_delta_log/{v(10)}.checkpoint.parquet")
    assert f is not None
    assert f.kind is LogFileKind.CHECKPOINT
    assert f.version == 10
    assert f.format == "parquet"
    assert f.part is None and f.num_parts is None
    assert f.is_checkpoint


@pytest.mark.parametrize("part", [1, 2, 3])
def test_multipart_checkpoint_parts(part: int) -> None:
    f = parse(f"_delta_log/{v(10)}.checkpoint.{part:010d}.{3:010d}.parquet")
    assert f is not None
    assert f.kind is LogFileKind.MULTIPART_CHECKPOINT
    assert f.version == 10
    assert f.part == part
    assert f.num_parts == 3
    assert f.format == "parquet"
    assert f.is_checkpoint


def test_multipart_checkpoint_large_part_numbers() -> None:
    f = parse(f"_delta_log/{v(5)}.checkpoint.{1234:010d}.{99999:010d}.parquet")
    assert f is not None
    assert (f.part, f.num_parts) == (1234, 99999)


@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_uuid_checkpoint(fmt: str) -> None:
    f = parse(f"_delta_log/{v(10)}.checkpoint.{UUID}.{fmt}")
    assert f is not None
    assert f.kind is LogFileKind.UUID_CHECKPOINT
    assert f.version == 10
    assert f.format == fmt
    assert f.is_checkpoint


def test_uuid_checkpoint_upper_case_uuid() -> None:
    f = parse(f"_delta_log/{v(3)}.checkpoint.{UUID.upper()}.json")
    assert f is not None and f.kind is LogFileKind.UUID_CHECKPOINT and f.version == 3


def test_compaction() -> None:
    f = parse(f"_delta_log/{v(4)}.{v(6)}.compacted.json")
    assert f is not None
    assert f.kind is LogFileKind.COMPACTION
    assert f.version == 4
    assert f.end_version == 6
    assert f.format == "json"
    assert not f.is_checkpoint


def test_compaction_of_a_single_version() -> None:
    f = parse(f"_delta_log/{v(4)}.{v(4)}.compacted.json")
    assert f is not None
    assert f.kind is LogFileKind.COMPACTION
    assert (f.version, f.end_version) == (4, 4)


def test_crc() -> None:
    f = parse(f"_delta_log/{v(9)}.crc")
    assert f is not None
    assert f.kind is LogFileKind.CRC
    assert f.version == 9
    assert not f.is_checkpoint


def test_last_checkpoint() -> None:
    f = parse("_delta_log/_last_checkpoint", size=77)
    assert f is not None
    assert f.kind is LogFileKind.LAST_CHECKPOINT
    assert f.key == LAST_CHECKPOINT_KEY
    assert f.size == 77
    assert not f.is_checkpoint


def test_sidecar() -> None:
    name = "3a0d65cd-4056-49b8-937b-95f9e3ee90e5.parquet"
    f = parse(f"_delta_log/_sidecars/{name}")
    assert f is not None
    assert f.kind is LogFileKind.SIDECAR
    assert f.format == "parquet"
    assert f.name == name
    assert not f.is_checkpoint


def test_sidecar_with_non_uuid_name() -> None:
    # The spec only requires sidecar names to be unique, not UUIDs.
    f = parse("_delta_log/_sidecars/some-unique-name.parquet")
    assert f is not None and f.kind is LogFileKind.SIDECAR


# --- not part of the log ---------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        # temporary / hidden files written next to commits
        f"_delta_log/.{v(1)}.json.tmp",
        f"_delta_log/{v(1)}.json.tmp",
        f"_delta_log/.{v(1)}.json",
        f"_delta_log/.{v(1)}.checkpoint.parquet.crc",
        f"_delta_log/{v(1)}.json.crc",
        f"_delta_log/.{v(1)}.crc.crc",
        f"_delta_log/{v(1)}.json.0f6f4e2c-1b0d-4a52-9f1a-8d3b1f1e7a65.tmp",
        # versions that are not 20 digits
        "_delta_log/1.json",
        f"_delta_log/{1:019d}.json",
        f"_delta_log/{1:021d}.json",
        f"_delta_log/{1:019d}.checkpoint.parquet",
        f"_delta_log/{1:019d}.crc",
        "_delta_log/0000000000000000000a.json",
        # staged commits of catalog-managed tables and other subdirectories
        f"_delta_log/_commits/{v(1)}.{UUID}.json",
        f"_delta_log/_commits/{v(1)}.json",
        f"_delta_log/sub/{v(1)}.json",
        # compaction with end < start
        f"_delta_log/{v(6)}.{v(4)}.compacted.json",
        # compaction with a malformed range
        f"_delta_log/{v(4)}.{6:019d}.compacted.json",
        f"_delta_log/{v(4)}.compacted.json",
        # multi-part checkpoint with part 0, part > total, or bad padding
        f"_delta_log/{v(10)}.checkpoint.{0:010d}.{3:010d}.parquet",
        f"_delta_log/{v(10)}.checkpoint.{4:010d}.{3:010d}.parquet",
        f"_delta_log/{v(10)}.checkpoint.{1:010d}.{0:010d}.parquet",
        f"_delta_log/{v(10)}.checkpoint.1.3.parquet",
        # checkpoints in other formats or with malformed UUIDs
        f"_delta_log/{v(10)}.checkpoint.json",
        f"_delta_log/{v(10)}.checkpoint.{UUID}.avro",
        f"_delta_log/{v(10)}.checkpoint.not-a-uuid.json",
        f"_delta_log/{v(10)}.checkpoint.{UUID[:-1]}.json",
        # case matters
        f"_delta_log/{v(1)}.JSON",
        f"_delta_log/{v(1)}.checkpoint.PARQUET",
        # sidecars in nested directories or of the wrong type
        "_delta_log/_sidecars/nested/x.parquet",
        "_delta_log/_sidecars/x.json",
        "_delta_log/_sidecars/x.parquet.tmp",
        # _last_checkpoint look-alikes
        "_delta_log/_last_checkpoint.tmp",
        "_delta_log/._last_checkpoint.crc",
        "_delta_log/_last_checkpoint/x",
        # not under _delta_log at all
        f"{v(1)}.json",
        f"data/_delta_log/{v(1)}.json",
        "part-00000-abc.snappy.parquet",
        "_delta_log/",
        "_delta_log/README",
    ],
)
def test_unrelated_names_are_ignored(key: str) -> None:
    assert parse(key) is None


@pytest.mark.parametrize(
    "digits",
    [
        "\uff10" * 19 + "\uff11",  # FULLWIDTH DIGIT ZERO/ONE
        "\u0660" * 19 + "\u0661",  # ARABIC-INDIC DIGIT ZERO/ONE
        "0" * 19 + "\u0661",
    ],
    ids=["fullwidth", "arabic-indic", "mixed"],
)
def test_non_ascii_digits_are_not_versions(digits: str) -> None:
    # Versions are "zero-padded to 20 digits" (PROTOCOL.md "Delta Log Entries"): ASCII
    # digits. A stray file named with other Unicode digits must not pose as commit 1.
    assert parse(f"_delta_log/{digits}.json") is None
    assert parse(f"_delta_log/{digits}.checkpoint.parquet") is None
    assert parse(f"_delta_log/{digits}.crc") is None


# --- key helpers -----------------------------------------------------------------------


def test_commit_key_and_version_prefix() -> None:
    assert version_prefix(42) == f"_delta_log/{v(42)}"
    assert commit_key(42) == f"_delta_log/{v(42)}.json"
    f = parse(commit_key(42))
    assert f is not None and f.kind is LogFileKind.COMMIT and f.version == 42


def test_every_kind_sorts_after_its_version_prefix() -> None:
    # Listing from version_prefix(n) (start-after) must see every file of versions > n.
    keys = [
        f"_delta_log/{v(11)}.json",
        f"_delta_log/{v(11)}.checkpoint.parquet",
        f"_delta_log/{v(11)}.checkpoint.{1:010d}.{2:010d}.parquet",
        f"_delta_log/{v(11)}.checkpoint.{UUID}.json",
        f"_delta_log/{v(11)}.{v(12)}.compacted.json",
        f"_delta_log/{v(11)}.crc",
    ]
    for key in keys:
        assert key > version_prefix(10)
        f = parse(key)
        assert f is not None and f.version == 11
