"""Every table in ../shared/corpora: snapshots agree with INDEX.md, with delta-rs, with the
writers' version checksums and with the expected rows; broken logs raise the right errors."""

from __future__ import annotations

import glob
import json
import logging
import os
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from corpus import CorpusTable, corpus_tables
from deltalake import DeltaTable

import deltastream as ds
from deltastream.snapshot.features import MAX_READER_VERSION, SUPPORTED_READER_FEATURES

TABLES = corpus_tables()

_GOLDEN = "delta/connectors/golden-tables/src/main/resources/golden"
_KERNEL = "delta-kernel-rs/golden_data"

#: Broken logs, with the error a correct reader raises and why.
BROKEN: dict[str, tuple[type[Exception], str]] = {
    **{
        p: (ds.MissingVersionsError, "commit 1 is missing between 0 and 2")
        for p in (f"{_KERNEL}/versions-not-contiguous/delta", f"{_GOLDEN}/versions-not-contiguous")
    },
    "delta-rs/crates/core/tests/data_err_logs/table_c": (
        ds.MissingVersionsError,
        "commit 12 is missing after checkpoint 10",
    ),
    **{
        f"{base}/deltalog-state-reconstruction-{case}": (ds.InvalidTableStateError, case)
        for base in (_GOLDEN, f"{_KERNEL}")
        for case in (
            "from-checkpoint-missing-metadata",
            "from-checkpoint-missing-protocol",
            "without-metadata",
            "without-protocol",
        )
    },
    **{
        p: (ds.InvalidTableStateError, "the log has no metaData action")
        for p in (
            f"{_KERNEL}/data-reader-absolute-paths-escaped-chars/delta",
            f"{_GOLDEN}/data-reader-absolute-paths-escaped-chars",
        )
    },
    "delta-kernel-rs/data/crc-malformed": (ds.TableNotFoundError, "the log holds only a .crc file"),
}
# The kernel-rs copies live one directory deeper.
BROKEN = {
    (k + "/delta" if k.startswith(_KERNEL) and "/deltalog-state" in k else k): v
    for k, v in BROKEN.items()
}

#: Tables whose version checksum file disagrees with their own log.
BAD_CHECKSUM = {
    "delta-kernel-rs/data/crc-full": "the .crc claims 10 files; the only commit adds none",
}

#: delta-rs cannot open these (it requires metaData.schemaString, which old writers omit).
DELTALAKE_CANNOT_READ = {
    f"{_KERNEL}/deltalog-commit-info/delta",
    f"{_KERNEL}/update-deleted-directory/delta",
    f"{_GOLDEN}/canonicalized-paths-normal-a",
    f"{_GOLDEN}/canonicalized-paths-normal-b",
    f"{_GOLDEN}/canonicalized-paths-special-a",
    f"{_GOLDEN}/canonicalized-paths-special-b",
    f"{_GOLDEN}/corrupted-last-checkpoint",
    f"{_GOLDEN}/deltalog-commit-info",
    f"{_GOLDEN}/update-deleted-directory",
}

#: Tables where delta-rs is known to be wrong and Delta's reference answer is used instead:
#: a remove written as ``file:/abs`` or ``file:///abs`` removes the add of ``/abs`` (paths
#: are canonicalised), so no file is live (Delta's golden-table test expects an empty table;
#: delta-kernel-rs skips these tables as a known path-canonicalisation bug).
REFERENCE_OVERRIDES: dict[str, int] = {
    f"{_KERNEL}/canonicalized-paths-{case}/delta": 0
    for case in ("normal-a", "normal-b", "special-a", "special-b")
}


def expected_error(t: CorpusTable) -> type[Exception] | None:
    if t.path in BROKEN:
        return BROKEN[t.path][0]
    if t.reader_version is not None and t.reader_version > MAX_READER_VERSION:
        return ds.UnsupportedFeatureError
    if t.reader_version == 3 and (t.reader_features or frozenset()) - SUPPORTED_READER_FEATURES:
        return ds.UnsupportedFeatureError
    return None


READABLE = [t for t in TABLES if expected_error(t) is None]


def test_index_lists_every_table() -> None:
    assert len(TABLES) >= 300
    for path in set(BROKEN) | set(BAD_CHECKSUM) | DELTALAKE_CANNOT_READ | set(REFERENCE_OVERRIDES):
        assert any(t.path == path for t in TABLES), f"{path} is not in INDEX.md"


@pytest.mark.parametrize("table", TABLES, ids=str)
def test_snapshot_agrees_with_index(table: CorpusTable, caplog: pytest.LogCaptureFixture) -> None:
    error = expected_error(table)
    if error is not None:
        with pytest.raises(error) as info:
            ds.read_snapshot(str(table.location))
        assert str(table.location) in str(info.value) or table.path in str(info.value)
        return
    snap = ds.read_snapshot(str(table.location), validate_checksum=table.path not in BAD_CHECKSUM)
    if table.last_version is not None:
        assert snap.version == table.last_version
    assert snap.protocol.min_reader_version == table.reader_version
    assert snap.protocol.min_writer_version == table.writer_version
    assert frozenset(snap.protocol.reader_features or ()) == (table.reader_features or frozenset())
    assert frozenset(snap.protocol.writer_features or ()) == (table.writer_features or frozenset())
    keys = zip(
        snap.files.column("path").to_pylist(),
        snap.files.column("deletionVector").to_pylist(),
        strict=True,
    )
    assert len({(p, json.dumps(dv, sort_keys=True)) for p, dv in keys}) == snap.num_files
    if table.path in REFERENCE_OVERRIDES:
        assert snap.num_files == REFERENCE_OVERRIDES[table.path]


@pytest.mark.parametrize("path", sorted(BAD_CHECKSUM))
def test_checksum_mismatch_is_reported(path: str) -> None:
    location = str(CORPORA_ROOT / path)
    ds.read_snapshot(location)  # the log itself is fine
    with pytest.raises(ds.ChecksumMismatchError, match="numFiles"):
        ds.read_snapshot(location, validate_checksum=True)


def _deltalake_files(dt: DeltaTable) -> set[tuple[str, int, int]]:
    adds = pa.table(dt.get_add_actions(flatten=False))
    return set(
        zip(
            adds.column("path").to_pylist(),
            adds.column("size_bytes").to_pylist(),
            adds.column("modification_time").to_pylist(),
            strict=True,
        )
    )


def _our_files(snap: ds.Snapshot) -> set[tuple[str, int, int]]:
    f = snap.files
    return set(
        zip(
            f.column("path").to_pylist(),
            f.column("size").to_pylist(),
            f.column("modificationTime").to_pylist(),
            strict=True,
        )
    )


#: delta-rs refuses tables with type widening (deltastream reads them; tests/changes checks
#: their rows against their own parquet files instead).
DELTALAKE_UNSUPPORTED_FEATURES = frozenset({"typeWidening", "typeWidening-preview"})

ORACLE = [
    t
    for t in READABLE
    if t.path not in DELTALAKE_CANNOT_READ | set(REFERENCE_OVERRIDES)
    and not (t.reader_features or frozenset()) & DELTALAKE_UNSUPPORTED_FEATURES
]


def test_oracle_covers_most_tables() -> None:
    assert len(ORACLE) >= 250


@pytest.mark.parametrize("table", ORACLE, ids=str)
def test_every_version_agrees_with_deltalake(table: CorpusTable) -> None:
    """Version, protocol, metadata and live files agree with delta-rs at every version the
    log can reconstruct."""
    location = str(table.location)
    latest = ds.read_snapshot(location)
    versions: list[int] = [latest.version]
    if table.last_version is not None:
        every = list(range(table.first_version or 0, latest.version + 1))
        # Long histories: both ends in full, and evenly spaced versions in between.
        versions = (
            every
            if len(every) <= 60
            else every[:25] + every[25 : -25 : len(every) // 10] + every[-25:]
        )
    compared = 0
    for version in versions:
        try:
            dt = DeltaTable(location, version=version)
        except Exception as e:
            if "schemaString" in str(e):
                # delta-rs's own limitation (see DELTALAKE_CANNOT_READ): we read it anyway.
                assert ds.read_snapshot(location, version).metadata.schema_string is None
            else:
                # delta-rs cannot reconstruct this version; neither can we.
                with pytest.raises(ds.DeltaStreamError):
                    ds.read_snapshot(location, version)
            continue
        snap = ds.read_snapshot(location, version)
        assert snap.version == dt.version() == version
        proto = dt.protocol()
        assert snap.protocol.min_reader_version == proto.min_reader_version
        assert snap.protocol.min_writer_version == proto.min_writer_version
        assert set(snap.protocol.reader_features or ()) == set(proto.reader_features or ())
        assert set(snap.protocol.writer_features or ()) == set(proto.writer_features or ())
        md = dt.metadata()
        assert snap.metadata.id == md.id
        assert list(snap.metadata.partition_columns) == list(md.partition_columns)
        assert dict(snap.metadata.configuration) == dict(md.configuration)
        assert _our_files(snap) == _deltalake_files(dt)
        compared += 1
    assert compared >= 1


CORPORA_ROOT = TABLES[0].location.parents[len(Path(TABLES[0].path).parts) - 1]


def _expected_cases() -> list[tuple[str, int | None, str]]:
    cases: list[tuple[str, int | None, str]] = []
    for exp in sorted(glob.glob(str(CORPORA_ROOT / _KERNEL / "*" / "expected"))):
        cases.append((os.path.join(os.path.dirname(exp), "delta"), None, exp))
    for exp in sorted(glob.glob(str(CORPORA_ROOT / "dat/out/reader_tests/generated/*/expected/*"))):
        name = os.path.basename(exp)
        base = os.path.dirname(os.path.dirname(exp))
        cases.append(
            (os.path.join(base, "delta"), None if name == "latest" else int(name[1:]), exp)
        )
    return cases


def _expected_rows(directory: str) -> int:
    files = glob.glob(os.path.join(directory, "**", "*.parquet"), recursive=True)
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


EXPECTED = _expected_cases()


def test_expected_results_are_found() -> None:
    assert len(EXPECTED) >= 60


@pytest.mark.parametrize(("table", "version", "expected"), EXPECTED, ids=lambda x: str(x))
def test_live_files_hold_the_expected_rows(table: str, version: int | None, expected: str) -> None:
    """The live files' record counts (from stats, or from the data files' footers) minus
    the rows their deletion vectors delete equal the rows Spark (or DAT) read."""
    snap = ds.read_snapshot(table, version)
    if version is not None:
        meta = json.loads(Path(expected, "table_version_metadata.json").read_text())
        assert snap.version == meta["version"]
        assert snap.protocol.min_reader_version == meta["min_reader_version"]
    rows = 0
    for path, stats in zip(
        snap.files.column("path").to_pylist(), snap.files.column("stats").to_pylist(), strict=True
    ):
        if stats is not None and "numRecords" in json.loads(stats):
            rows += json.loads(stats)["numRecords"]
        else:  # no JSON stats (struct-only stats): count the data file's rows
            rows += pq.ParquetFile(os.path.join(table, unquote(path))).metadata.num_rows
    dv = snap.files.column("deletionVector")
    if dv.null_count < len(dv):
        rows -= pc.sum(pc.struct_field(dv, "cardinality")).as_py()
    assert rows == _expected_rows(expected)


def test_corrupt_last_checkpoint_is_recovered_by_listing(caplog: pytest.LogCaptureFixture) -> None:
    table = CORPORA_ROOT / _KERNEL / "corrupted-last-checkpoint-kernel" / "delta"
    with caplog.at_level(logging.WARNING):
        snap = ds.read_snapshot(str(table))
    assert snap.version == 11
    assert any(
        "_last_checkpoint" in r.getMessage() and "invalid JSON" in r.getMessage()
        for r in caplog.records
    )
