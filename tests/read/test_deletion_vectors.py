"""Deletion vectors: Z85, ``u`` paths, both bitmap layouts, the DV file format, loading
through a store, and the row masks readers filter with.

Real DVs come from the corpora (written by Spark's Delta Lake and by delta-kernel-rs); the
expected rows come from the specification's examples, from delta-rs (``QueryBuilder``,
which applies DVs) and from the Spark-written ``expected/`` snapshots of kernel-rs' golden
tables. Broken DVs are made by copying a corpus table and damaging the copy.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import random
import shutil
import struct
import time
import uuid
import zlib
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import CORPORA, S3Bucket
from deltalake import DeltaTable, QueryBuilder
from pyroaring import BitMap, BitMap64

from deltastream.errors import DeletionVectorError, UnsafePathError
from deltastream.log.actions import DeletionVectorDescriptor
from deltastream.read.deletion_vectors import (
    MAGIC_NATIVE,
    MAGIC_PORTABLE,
    decode_z85,
    deleted_rows_mask,
    encode_z85,
    kept_rows,
    load_deletion_vector,
    max_row,
    parse_bitmap,
    parse_dv_file_slice,
    relative_dv_path,
)
from deltastream.storage import LocalStore, open_store
from deltastream.storage.paths import ExternalPaths

SPEC_ROWS = {3, 4, 7, 11, 18, 29}
#: PROTOCOL.md, JSON Example 3 (the RoaringBitmapArray layout, magic written big endian).
PROTOCOL_INLINE = "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L"
#: deletion-vectors-design.md, JSON Example 3 (the protocol's portable layout).
DESIGN_INLINE = "^Bg9^0rr910000000000iXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L"

KERNEL_DATA = CORPORA / "delta-kernel-rs" / "data"
KERNEL_GOLDEN = CORPORA / "delta-kernel-rs" / "golden_data"
SPARK_RESOURCES = CORPORA / "delta" / "spark" / "src" / "test" / "resources" / "delta"

CDF_WITH_DV = KERNEL_DATA / "cdf-table-with-dv"
DV_SMALL = KERNEL_DATA / "table-with-dv-small"
DV_PARTITIONED = KERNEL_GOLDEN / "dv-partitioned-with-checkpoint" / "delta"
DV_KEY_CASES = KERNEL_GOLDEN / "log-replay-dv-key-cases" / "delta"
DV_LARGE = SPARK_RESOURCES / "table-with-dv-large"
DV_SPECIAL_CHAR = SPARK_RESOURCES / "table-with-dv-special-char"
#: Delta's Spark tests rename DV files with this test-only prefix; the log does not name it.
SPARK_TEST_PREFIX = "test%dv%prefix-"

DV_SMALL_DATA = "part-00000-fae5310a-a37d-4e51-827b-c3d5516560ca-c000.snappy.parquet"
DV_SMALL_DV_FILE = "deletion_vector_61d16c75-6994-46b7-a15b-8b538852e50e.bin"


# ------------------------------------------------------------------------------- helpers


def file_actions(table: Path) -> list[tuple[int, str, dict[str, Any]]]:
    """``(version, "add" | "remove", action)`` of every JSON commit, in log order."""
    out = []
    for name in sorted(os.listdir(table / "_delta_log")):
        if not (name.endswith(".json") and name[:20].isdigit() and len(name) == 25):
            continue
        with open(table / "_delta_log" / name) as f:
            for line in f:
                if not line.strip():
                    continue
                action = json.loads(line)
                for kind in ("add", "remove"):
                    if kind in action:
                        out.append((int(name[:20]), kind, action[kind]))
    return out


def dv_actions(table: Path) -> list[tuple[str, DeletionVectorDescriptor]]:
    """``(data file path, descriptor)`` of every add/remove with a DV."""
    return [
        (a["path"], DeletionVectorDescriptor.from_json(a["deletionVector"]))
        for _, _, a in file_actions(table)
        if a.get("deletionVector")
    ]


def num_rows(table: Path, data_path: str) -> int:
    return int(pq.ParquetFile(table / unquote(data_path)).metadata.num_rows)


def active_files(table: Path, upto: int | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """Replay the JSON commits: the live adds keyed by (path, DV unique id)."""
    live: dict[tuple[str, str], dict[str, Any]] = {}
    for version, kind, action in file_actions(table):
        if upto is not None and version > upto:
            break
        dv = action.get("deletionVector")
        key = (action["path"], "" if not dv else DeletionVectorDescriptor.from_json(dv).unique_id)
        if kind == "add":
            live[key] = action
        else:
            live.pop(key, None)
    return live


async def read_with_dvs(table: Path, upto: int | None = None) -> pa.Table:
    """The table's rows (partition columns left out), filtered with our DVs."""
    store = LocalStore(table)
    pieces = []
    for action in active_files(table, upto).values():
        data = pq.read_table(table / unquote(action["path"]))
        if action.get("deletionVector"):
            desc = DeletionVectorDescriptor.from_json(action["deletionVector"])
            bitmap = await load_deletion_vector(store, desc, data_file=action["path"])
            data = data.filter(kept_rows(bitmap, 0, data.num_rows))
        pieces.append(data)
    return pa.concat_tables(pieces)


def delta_rs_rows(table: Path, sql: str, version: int | None = None) -> pa.Table:
    """delta-rs, as an oracle: its DataFusion provider applies deletion vectors."""
    dt = DeltaTable(str(table), version=version)
    return pa.table(QueryBuilder().register("t", dt).execute(sql).read_all())


def portable(rows: Any) -> bytes:
    """A serialized DV in the protocol's layout: LE magic + 64-bit portable bitmap."""
    bitmap = BitMap64(rows)
    bitmap.run_optimize()
    return struct.pack("<I", MAGIC_PORTABLE) + bitmap.serialize()


def native(buckets: dict[int, Any], count: int | None = None) -> bytes:
    """A serialized DV in the RoaringBitmapArray layout (big endian)."""
    n = max(buckets, default=-1) + 1 if count is None else count
    out = struct.pack(">Ii", MAGIC_NATIVE, n)
    for key in range(n):
        chunk = BitMap(buckets.get(key, ())).serialize()
        out += struct.pack(">i", len(chunk)) + chunk
    return out


def frame(bitmap: bytes) -> bytes:
    """One DV as the DV file stores it: BE dataSize, the bitmap, BE CRC-32."""
    return struct.pack(">I", len(bitmap)) + bitmap + struct.pack(">I", zlib.crc32(bitmap))


def write_dv_file(
    root: Path, bitmaps: list[bytes], *, prefix: str = "", version: int = 1
) -> list[DeletionVectorDescriptor]:
    """Write a DV file holding ``bitmaps`` below ``root``; one ``u`` descriptor per DV."""
    dv_id = uuid.uuid4()
    location = relative_dv_path(prefix + encode_z85(dv_id.bytes))
    content = bytes([version])
    descriptors = []
    for bitmap in bitmaps:
        descriptors.append(
            DeletionVectorDescriptor(
                storage_type="u",
                path_or_inline_dv=prefix + encode_z85(dv_id.bytes),
                size_in_bytes=len(bitmap),
                cardinality=len(parse_bitmap(bitmap, "test")),
                offset=len(content),
            )
        )
        content += frame(bitmap)
    (root / location).parent.mkdir(parents=True, exist_ok=True)
    (root / location).write_bytes(content)
    return descriptors


def inline(text: str, size: int, cardinality: int) -> DeletionVectorDescriptor:
    return DeletionVectorDescriptor("i", text, size_in_bytes=size, cardinality=cardinality)


# ------------------------------------------------------------------ specification vectors


def test_protocol_inline_example_uses_the_big_endian_bitmap_array_layout() -> None:
    raw = decode_z85(PROTOCOL_INLINE)
    assert len(raw) == 40
    assert struct.unpack(">I", raw[:4])[0] == MAGIC_NATIVE
    assert set(parse_bitmap(raw, "example")) == SPEC_ROWS


def test_design_doc_inline_example_uses_the_portable_layout() -> None:
    raw = decode_z85(DESIGN_INLINE)
    assert len(raw) == 44
    assert struct.unpack("<I", raw[:4])[0] == MAGIC_PORTABLE
    assert set(parse_bitmap(raw, "example")) == SPEC_ROWS


@pytest.mark.anyio
@pytest.mark.parametrize(("text", "size"), [(PROTOCOL_INLINE, 40), (DESIGN_INLINE, 44)])
async def test_inline_examples_load(tmp_path: Path, text: str, size: int) -> None:
    bitmap = await load_deletion_vector(LocalStore(tmp_path), inline(text, size, 6))
    assert sorted(bitmap) == sorted(SPEC_ROWS)


def test_relative_path_of_the_protocol_example() -> None:
    assert (
        relative_dv_path("ab^-aqEH.-t@S}K{vb[*k^")
        == "ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    )


def test_relative_path_without_prefix() -> None:
    assert relative_dv_path("vBn[lx{q8@P<9BNH/isA") == DV_SMALL_DV_FILE
    dv_id = uuid.uuid4()
    assert relative_dv_path(encode_z85(dv_id.bytes)) == f"deletion_vector_{dv_id}.bin"
    assert relative_dv_path("x9" + encode_z85(dv_id.bytes)) == f"x9/deletion_vector_{dv_id}.bin"


@pytest.mark.parametrize("bad", ["", "vBn[lx{q8@P<9BNH/is", "vBn[lx{q8@P<9BNH/is\x7f", "#####" * 4])
def test_relative_path_rejects_bad_values(bad: str) -> None:
    with pytest.raises(ValueError, match=r"deletion vector path|UUID"):
        relative_dv_path(bad)


# ------------------------------------------------------------------------------------ Z85


def test_z85_rfc_vector() -> None:
    raw = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert encode_z85(raw) == "HelloWorld"
    assert decode_z85("HelloWorld") == raw


def test_z85_round_trip() -> None:
    rng = random.Random(85)
    for n in [0, 4, 8, 16, 400, 4000]:
        data = rng.randbytes(n)
        text = encode_z85(data)
        assert len(text) == n // 4 * 5
        assert decode_z85(text) == data
    extremes = b"\x00" * 4 + b"\xff" * 4
    assert encode_z85(extremes) == "00000%nSc0"
    assert decode_z85("00000%nSc0") == extremes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Hello World", "multiple of 5"),
        ("Hell", "multiple of 5"),
        ("HelloWorld0", "multiple of 5"),
        ("Hello Worl", "invalid Z85 character ' ' at position 5"),
        ('Hello"orld', "invalid Z85 character '\"' at position 5"),
        ("HelloWorlé", "invalid Z85 character 'é' at position 9"),
        ("Hello,orld", "invalid Z85 character ','"),
        ("%%%%%HelloWorld", "exceeds 32 bits"),
        ("HelloWorld%nSc1", "exceeds 32 bits"),
        ("####0", "invalid Z85 group"),
        ("##%%%", "exceeds 2 byte"),
    ],
)
def test_z85_rejects_bad_text(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_z85(text)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_z85_encode_needs_whole_words(n: int) -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        encode_z85(b"x" * n)


def test_z85_padded_tail_of_the_rust_z85_crate() -> None:
    # The Rust z85 crate (used by delta-kernel-rs) encodes a 1-3 byte tail as '#' * missing
    # followed by the tail's digits; cdf-table-with-dv holds such an inline DV.
    assert decode_z85("##093") == b"\x03\x00"
    assert decode_z85("HelloWorld#0003") == decode_z85("HelloWorld") + b"\x00\x00\x03"
    assert decode_z85("###0a") == b"\x0a"
    with pytest.raises(ValueError, match="exceeds 32 bits"):
        decode_z85("##093HelloWorld")  # only the last group may be a padded tail


# ---------------------------------------------------------------------------------- bitmaps


def test_portable_layout_round_trips_every_container_kind() -> None:
    rng = random.Random(7)
    rows = set(rng.sample(range(0, 1 << 20), 3000))  # array containers
    rows |= set(range(200_000, 260_000))  # a run container
    rows |= set(range(400_000, 465_536, 2))  # a bitset container
    rows |= {1 << 32, (1 << 32) + 5, (3 << 32) + 7, (1 << 62) + 1}  # several buckets
    bitmap = parse_bitmap(portable(rows), "test")
    assert isinstance(bitmap, BitMap64)
    assert set(bitmap) == rows


def test_native_layout_with_several_bitmaps() -> None:
    data = native({0: [1, 2, 70_000], 1: [0, 9], 3: range(0, 100_000, 3)})
    expected = {1, 2, 70_000, 1 << 32, (1 << 32) + 9} | {
        (3 << 32) + i for i in range(0, 100_000, 3)
    }
    assert set(parse_bitmap(data, "test")) == expected
    assert set(parse_bitmap(native({}), "test")) == set()
    assert set(parse_bitmap(portable([]), "test")) == set()


def test_unknown_magic_names_the_numbers() -> None:
    data = struct.pack("<I", 1234567) + b"\x00" * 12
    with pytest.raises(DeletionVectorError) as err:
        parse_bitmap(data, "s3://b/t/dv.bin")
    message = str(err.value)
    assert message.startswith("s3://b/t/dv.bin: ")
    assert "1234567" in message
    assert str(MAGIC_PORTABLE) in message and str(MAGIC_NATIVE) in message
    # The portable magic written big endian is not the protocol's format either.
    swapped = struct.unpack("<I", struct.pack(">I", MAGIC_PORTABLE))[0]
    assert swapped == 3520280932
    with pytest.raises(DeletionVectorError, match=f"magic number {swapped} "):
        parse_bitmap(struct.pack(">I", MAGIC_PORTABLE) + decode_z85(DESIGN_INLINE)[4:], "x")


@pytest.mark.parametrize("layout", ["portable", "native"])
def test_every_truncation_is_a_deletion_vector_error(layout: str) -> None:
    data = decode_z85(DESIGN_INLINE if layout == "portable" else PROTOCOL_INLINE)
    for n in range(len(data)):
        with pytest.raises(DeletionVectorError, match="the-source"):
            parse_bitmap(data[:n], "the-source")


@pytest.mark.parametrize("extra", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("layout", ["portable", "native"])
def test_trailing_bytes_are_rejected(layout: str, extra: int) -> None:
    # pyroaring alone accepts some trailing bytes (4 of them, for instance) silently.
    data = decode_z85(DESIGN_INLINE if layout == "portable" else PROTOCOL_INLINE)
    with pytest.raises(DeletionVectorError, match="unexpected byte"):
        parse_bitmap(data + b"\x00" * extra, "src")


def test_native_layout_lengths_must_add_up() -> None:
    good = native({0: [3, 4]})
    (length,) = struct.unpack_from(">i", good, 8)
    cases = {
        "negative count": good[:4] + struct.pack(">i", -1) + good[8:],
        "count too large": good[:4] + struct.pack(">i", 2) + good[8:],
        "length too long": good[:8] + struct.pack(">i", length + 1) + good[12:],
        "length too short": good[:8] + struct.pack(">i", length - 2) + good[12:],
        "negative length": good[:8] + struct.pack(">i", -4) + good[12:],
    }
    for name, data in cases.items():
        with pytest.raises(DeletionVectorError, match="corrupt deletion vector bitmap"):
            parse_bitmap(data, name)


def test_keys_must_leave_the_top_bit_clear() -> None:
    with pytest.raises(DeletionVectorError, match="most significant bit"):
        parse_bitmap(portable([5, 1 << 63]), "src")
    assert max_row(parse_bitmap(portable([(1 << 63) - 1]), "src")) == (1 << 63) - 1


def test_damaged_bitmaps_never_leak_other_exceptions() -> None:
    rng = random.Random(1)
    samples = [
        decode_z85(DESIGN_INLINE),
        decode_z85(PROTOCOL_INLINE),
        portable([*range(0, 5000, 3), 1 << 33]),
        native({0: range(100_000, 170_000), 2: [5]}),
    ]
    outcomes = Counter()
    for data in samples:
        for _ in range(300):
            damaged = bytearray(data)
            for _ in range(rng.randint(1, 3)):
                damaged[rng.randrange(4, len(damaged))] = rng.randrange(256)
            try:
                parse_bitmap(bytes(damaged), "fuzz")
                outcomes["parsed"] += 1
            except DeletionVectorError as e:
                assert str(e).startswith("fuzz: ")
                outcomes["rejected"] += 1
    assert outcomes["rejected"] > 0


# -------------------------------------------------------------------------------- DV files


def test_file_slice_round_trip_and_checks() -> None:
    bitmap = portable([1, 2, 3])
    desc = DeletionVectorDescriptor("u", "x" * 20, len(bitmap), 3, offset=1)
    assert list(parse_dv_file_slice(frame(bitmap), desc, "f")) == [1, 2, 3]
    assert list(parse_dv_file_slice(frame(bitmap) + b"next DV", desc, "f")) == [1, 2, 3]

    with pytest.raises(DeletionVectorError, match="dataSize 42, but the log says sizeInBytes"):
        parse_dv_file_slice(struct.pack(">I", 42) + frame(bitmap)[4:], desc, "f")
    with pytest.raises(DeletionVectorError, match="truncated"):
        parse_dv_file_slice(frame(bitmap)[:-1], desc, "f")
    with pytest.raises(DeletionVectorError, match="truncated"):
        parse_dv_file_slice(b"\x00\x00", desc, "f")
    tampered = bytearray(frame(bitmap))
    tampered[-1] ^= 0x01
    with pytest.raises(DeletionVectorError, match=r"^f: .*fails its checksum"):
        parse_dv_file_slice(bytes(tampered), desc, "f")


@pytest.mark.anyio
async def test_files_holding_several_dvs_and_prefix_directories(tmp_path: Path) -> None:
    bitmaps = [portable([0, 9]), native({0: [1, 2, 3], 1: [4]}), portable(range(0, 300, 7))]
    descriptors = write_dv_file(tmp_path, bitmaps, prefix="q7")
    assert (tmp_path / "q7").is_dir()
    store = LocalStore(tmp_path)
    loaded = [await load_deletion_vector(store, d) for d in descriptors]
    assert [sorted(b) for b in loaded] == [
        [0, 9],
        [1, 2, 3, (1 << 32) + 4],
        list(range(0, 300, 7)),
    ]
    # Two ranged GETs per DV (the version byte and the DV's frame); nothing is cached.
    assert store.stats.get_requests == 2 * len(descriptors)
    await load_deletion_vector(store, descriptors[0])
    assert store.stats.get_requests == 2 * len(descriptors) + 2


# ------------------------------------------------------------------------------- corpora


CORPUS_TABLES = {
    "cdf-table-with-dv": CDF_WITH_DV,
    "dv-partitioned-with-checkpoint": DV_PARTITIONED,
    "kernel-table-with-dv-small": DV_SMALL,
    "log-replay-dv-key-cases": DV_KEY_CASES,
    "compacted-log-files-table": KERNEL_DATA / "compacted-log-files-table",
    "basic-dv-no-checkpoint": CORPORA
    / "delta/kernel/kernel-defaults/src/test/resources/basic-dv-no-checkpoint",
    "delta-rs-table-with-dv-small": CORPORA / "delta-rs/crates/test/tests/data/table-with-dv-small",
}


def strip_spark_test_prefix(source: Path, target: Path) -> Path:
    """Copy a Delta Spark test table, renaming its DV files to the names the log derives."""
    shutil.copytree(source, target)
    for path in target.rglob(SPARK_TEST_PREFIX + "deletion_vector_*.bin"):
        path.rename(path.with_name(path.name[len(SPARK_TEST_PREFIX) :]))
    return target


async def check_every_dv(table: Path) -> Counter[str]:
    """Load every DV the table's commits name; check cardinality and row bounds."""
    store = LocalStore(table)
    kinds: Counter[str] = Counter()
    actions = dv_actions(table)
    assert actions, f"{table} has no deletion vectors"
    for data_path, desc in actions:
        bitmap = await load_deletion_vector(store, desc, data_file=data_path)
        assert len(bitmap) == desc.cardinality > 0
        last = max_row(bitmap)
        assert last is not None and last < num_rows(table, data_path)
        assert int(deleted_rows_mask(bitmap, num_rows(table, data_path)).sum()) == len(bitmap)
        kinds[desc.storage_type] += 1
    return kinds


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(CORPUS_TABLES))
async def test_corpus_dvs_load(name: str) -> None:
    kinds = await check_every_dv(CORPUS_TABLES[name])
    if name == "cdf-table-with-dv":
        assert kinds["u"] == 2 and kinds["i"] == 6


@pytest.mark.anyio
async def test_spark_table_with_dv_large(tmp_path: Path) -> None:
    table = strip_spark_test_prefix(DV_LARGE, tmp_path / "t")
    kinds = await check_every_dv(table)
    assert kinds == {"u": 14}


@pytest.mark.anyio
async def test_spark_test_prefix_is_not_derivable(tmp_path: Path) -> None:
    # Delta's Spark fixtures carry DV files named "test%dv%prefix-deletion_vector_<uuid>.bin",
    # a test-only name the protocol cannot derive from the log: as written, they are missing.
    data_path, desc = dv_actions(DV_LARGE)[0]
    assert len(desc.path_or_inline_dv) == 20  # no random prefix in the log
    expected = DV_LARGE / relative_dv_path(desc.path_or_inline_dv)
    assert (expected.parent / (SPARK_TEST_PREFIX + expected.name)).is_file()
    with pytest.raises(DeletionVectorError) as err:
        await load_deletion_vector(LocalStore(DV_LARGE), desc, data_file=data_path)
    assert err.value.path == str(expected)
    assert "missing" in str(err.value) and data_path in str(err.value)


def test_offset_points_at_the_data_size_field() -> None:
    # table-with-dv-large packs several DVs per file: read raw, the offsets chain exactly
    # as version byte | (dataSize | bitmap | crc)* when offset is the dataSize field.
    by_file: dict[str, set[tuple[int, int]]] = {}
    for _, desc in dv_actions(DV_LARGE):
        assert desc.offset is not None
        by_file.setdefault(desc.path_or_inline_dv, set()).add((desc.offset, desc.size_in_bytes))
    assert max(len(dvs) for dvs in by_file.values()) > 1
    for encoded, dvs in by_file.items():
        name = relative_dv_path(encoded)
        content = (DV_LARGE / (SPARK_TEST_PREFIX + name)).read_bytes()
        assert content[0] == 1
        position = 1
        for offset, size in sorted(dvs):
            assert offset == position
            assert struct.unpack_from(">I", content, offset)[0] == size
            assert struct.unpack_from("<I", content, offset + 4)[0] == MAGIC_PORTABLE
            bitmap = content[offset + 4 : offset + 4 + size]
            assert struct.unpack_from(">I", content, offset + 4 + size)[0] == zlib.crc32(bitmap)
            position = offset + 4 + size + 4
        assert position == len(content)
    # Every other corpus DV file starts its first DV at offset 1, right after the version.
    for table in CORPUS_TABLES.values():
        for _, desc in dv_actions(table):
            if desc.storage_type == "u":
                content = (table / relative_dv_path(desc.path_or_inline_dv)).read_bytes()
                assert content[0] == 1 and desc.offset is not None
                assert struct.unpack_from(">I", content, desc.offset)[0] == desc.size_in_bytes


@pytest.mark.anyio
async def test_absolute_path_dv_of_the_special_char_table(tmp_path: Path) -> None:
    # The fixture's log names its DV as "file:{{FOLDER_WITH_SPECIAL_CHAR}}/test%25dv%25...";
    # Delta's test substitutes a real folder, as done here.
    table = tmp_path / "t"
    shutil.copytree(DV_SPECIAL_CHAR, table)
    folder = table / "folder&with%special char"
    log = table / "_delta_log" / "00000000000000000000.json"
    log.write_text(log.read_text().replace("{{FOLDER_WITH_SPECIAL_CHAR}}", quote(str(folder))))
    [(data_path, desc)] = dv_actions(table)
    assert desc.storage_type == "p" and desc.path_or_inline_dv.startswith("file:/")
    bitmap = await load_deletion_vector(LocalStore(table), desc, data_file=data_path)
    assert len(bitmap) == 5 and max_row(bitmap) < num_rows(table, data_path)
    # The same file named as a plain absolute path and as a file:/// URI.
    dv_file = next(folder.iterdir())
    for location in (quote(str(dv_file)), "file://" + quote(str(dv_file))):
        again = dataclasses.replace(desc, path_or_inline_dv=location)
        assert await load_deletion_vector(LocalStore(table), again) == bitmap


# ------------------------------------------------------------------------ oracle checks


@pytest.mark.anyio
async def test_table_with_dv_small_matches_delta_rs() -> None:
    [(data_path, desc)] = [a for a in dv_actions(DV_SMALL)]
    assert data_path == DV_SMALL_DATA
    expected = delta_rs_rows(DV_SMALL, "select value from t order by value")
    assert expected.num_rows == num_rows(DV_SMALL, data_path) - desc.cardinality
    ours = await read_with_dvs(DV_SMALL)
    assert sorted(ours.column("value").to_pylist()) == expected.column("value").to_pylist()


@pytest.mark.anyio
@pytest.mark.parametrize("version", [1, 3, 4, 5])
async def test_cdf_table_versions_match_delta_rs(version: int) -> None:
    # Version 1 has a 'u' DV, 3 and 4 inline DVs, and 5 the inline DV with a padded tail.
    expected = delta_rs_rows(CDF_WITH_DV, "select value from t order by value", version)
    ours = await read_with_dvs(CDF_WITH_DV, upto=version)
    assert sorted(ours.column("value").to_pylist()) == expected.column("value").to_pylist()
    if version == 5:
        assert 3 not in expected.column("value").to_pylist()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("table", "columns"), [(DV_PARTITIONED, ["col1", "col2"]), (DV_KEY_CASES, ["id"])]
)
async def test_golden_tables_match_spark_expected_rows(table: Path, columns: list[str]) -> None:
    expected = pq.read_table(table.parent / "expected").select(columns)
    ours = (await read_with_dvs(table)).select(columns)
    assert Counter(map(tuple, ours.to_pylist())) == Counter(map(tuple, expected.to_pylist()))
    count = delta_rs_rows(table, "select count(*) as n from t").column("n")[0].as_py()
    assert count == ours.num_rows


# ------------------------------------------------------------------------ broken DV files


@pytest.fixture
def small_copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(DV_SMALL, tmp_path / "table-with-dv-small"))


def small_descriptor(table: Path) -> DeletionVectorDescriptor:
    [(_, desc)] = dv_actions(table)
    return desc


@pytest.mark.anyio
async def test_tampered_bitmap_fails_the_checksum(small_copy: Path) -> None:
    desc = small_descriptor(small_copy)
    dv_file = small_copy / DV_SMALL_DV_FILE
    content = bytearray(dv_file.read_bytes())
    assert desc.offset is not None
    content[desc.offset + 4 + desc.size_in_bytes - 1] ^= 0x01  # last byte of the bitmap
    dv_file.write_bytes(bytes(content))
    with pytest.raises(DeletionVectorError) as err:
        await load_deletion_vector(LocalStore(small_copy), desc, data_file=DV_SMALL_DATA)
    assert "checksum" in str(err.value)
    assert err.value.path == str(dv_file)


@pytest.mark.anyio
async def test_missing_dv_file(small_copy: Path) -> None:
    (small_copy / DV_SMALL_DV_FILE).unlink()
    with pytest.raises(DeletionVectorError) as err:
        await load_deletion_vector(
            LocalStore(small_copy), small_descriptor(small_copy), data_file=DV_SMALL_DATA
        )
    message = str(err.value)
    assert str(small_copy / DV_SMALL_DV_FILE) in message
    assert "missing" in message and DV_SMALL_DATA in message


@pytest.mark.anyio
@pytest.mark.parametrize(("content", "problem"), [(b"\x02", "version 2"), (b"", "empty")])
async def test_wrong_version_byte(small_copy: Path, content: bytes, problem: str) -> None:
    dv_file = small_copy / DV_SMALL_DV_FILE
    dv_file.write_bytes(content + dv_file.read_bytes()[1:] if content else b"")
    with pytest.raises(DeletionVectorError, match=problem):
        await load_deletion_vector(LocalStore(small_copy), small_descriptor(small_copy))


@pytest.mark.anyio
async def test_data_size_must_equal_size_in_bytes(small_copy: Path) -> None:
    desc = small_descriptor(small_copy)
    wrong = dataclasses.replace(desc, size_in_bytes=desc.size_in_bytes + 4)
    with pytest.raises(DeletionVectorError, match=r"dataSize 36, but the log says sizeInBytes 40"):
        await load_deletion_vector(LocalStore(small_copy), wrong)


@pytest.mark.anyio
async def test_offset_past_the_end_is_truncation(small_copy: Path) -> None:
    desc = dataclasses.replace(small_descriptor(small_copy), offset=30)
    with pytest.raises(DeletionVectorError, match=r"dataSize|truncated"):
        await load_deletion_vector(LocalStore(small_copy), desc)
    desc = dataclasses.replace(desc, offset=0)
    with pytest.raises(DeletionVectorError, match="offset 0"):
        await load_deletion_vector(LocalStore(small_copy), desc)


@pytest.mark.anyio
async def test_cardinality_mismatch(small_copy: Path) -> None:
    desc = dataclasses.replace(small_descriptor(small_copy), cardinality=3)
    with pytest.raises(DeletionVectorError) as err:
        await load_deletion_vector(LocalStore(small_copy), desc, data_file=DV_SMALL_DATA)
    assert "holds 2 row(s)" in str(err.value) and "cardinality is 3" in str(err.value)
    inline_desc = inline(DESIGN_INLINE, 44, 5)
    with pytest.raises(DeletionVectorError, match=r"/data\.parquet: .*cardinality is 5"):
        await load_deletion_vector(LocalStore(small_copy), inline_desc, data_file="data.parquet")


@pytest.mark.anyio
async def test_unknown_magic_in_a_dv_file(tmp_path: Path) -> None:
    bogus = struct.pack("<I", 99) + portable([1])[4:]
    [desc] = write_dv_file(tmp_path, [portable([1])])
    dv_file = tmp_path / relative_dv_path(desc.path_or_inline_dv)
    dv_file.write_bytes(b"\x01" + frame(bogus))  # a valid checksum over a bad magic number
    with pytest.raises(DeletionVectorError) as err:
        await load_deletion_vector(LocalStore(tmp_path), desc)
    assert "magic number 99" in str(err.value) and err.value.path == str(dv_file)


@pytest.mark.anyio
async def test_truncated_inline_dv(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    with pytest.raises(DeletionVectorError, match=r"/d\.parquet: .*truncated"):
        await load_deletion_vector(store, inline(DESIGN_INLINE[:-5], 44, 6), data_file="d.parquet")
    with pytest.raises(DeletionVectorError, match="multiple of 5"):
        await load_deletion_vector(store, inline(DESIGN_INLINE[:-1], 44, 6))
    with pytest.raises(DeletionVectorError, match="does not match sizeInBytes 36"):
        await load_deletion_vector(store, inline(DESIGN_INLINE, 36, 6))
    with pytest.raises(DeletionVectorError, match="invalid Z85 character"):
        await load_deletion_vector(store, inline(DESIGN_INLINE[:-5] + "ab cd", 44, 6))
    # A Java-style zero-padded inline DV (size not a multiple of 4) loads.
    raw = portable([7])
    padded = encode_z85(raw + b"\x00" * (-len(raw) % 4))
    assert list(await load_deletion_vector(store, inline(padded, len(raw), 1))) == [7]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "location",
    [
        "file:/elsewhere/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin",
        "/elsewhere/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin",
        "s3://mytable/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin",
        "file://otherhost{root}/dv.bin",
        "file:{root}/../outside/dv.bin",
        "file:{root}",
    ],
)
async def test_absolute_path_outside_the_table(tmp_path: Path, location: str) -> None:
    table = tmp_path / "table"
    table.mkdir()
    location = location.format(root=quote(str(table)))
    desc = DeletionVectorDescriptor("p", location, 34, 1, offset=1)
    with pytest.raises(UnsafePathError) as err:
        await load_deletion_vector(LocalStore(table), desc, data_file="part-0.parquet")
    assert err.value.path == location
    assert "outside the table" in str(err.value) and "part-0.parquet" in str(err.value)
    assert "--allow-external-paths" in str(err.value)


@pytest.mark.anyio
async def test_a_path_stored_dv_must_be_absolute(tmp_path: Path) -> None:
    desc = DeletionVectorDescriptor("p", "relative/dv.bin", 34, 1, offset=1)
    with pytest.raises(DeletionVectorError, match="must be absolute"):
        await load_deletion_vector(LocalStore(tmp_path), desc, data_file="part-0.parquet")


@pytest.mark.anyio
async def test_an_allowed_dv_outside_the_table_is_read(tmp_path: Path) -> None:
    [desc] = write_dv_file(tmp_path / "elsewhere", [portable([1, 5])])
    table = tmp_path / "table"
    table.mkdir()
    location = (
        f"file:{quote(str(tmp_path / 'elsewhere' / relative_dv_path(desc.path_or_inline_dv)))}"
    )
    outside = DeletionVectorDescriptor(
        "p", location, desc.size_in_bytes, desc.cardinality, offset=desc.offset
    )
    store = LocalStore(table)
    with pytest.raises(UnsafePathError):
        await load_deletion_vector(store, outside, data_file="part-0.parquet")
    store.external_paths = ExternalPaths.of([str(tmp_path / "elsewhere")])
    assert list(await load_deletion_vector(store, outside, data_file="part-0.parquet")) == [1, 5]


@pytest.mark.anyio
async def test_relative_path_escaping_the_table(tmp_path: Path) -> None:
    # '.' is a Z85 character, so a random prefix of ".." is well formed but leaves the table.
    table = tmp_path / "table"
    table.mkdir()
    [desc] = write_dv_file(tmp_path, [portable([1])])
    escaping = dataclasses.replace(desc, path_or_inline_dv=".." + desc.path_or_inline_dv)
    assert relative_dv_path(escaping.path_or_inline_dv).startswith("../deletion_vector_")
    with pytest.raises(UnsafePathError, match="outside the table"):
        await load_deletion_vector(LocalStore(table), escaping, data_file="part-0.parquet")


@pytest.mark.anyio
async def test_dvs_on_s3(s3_bucket: S3Bucket) -> None:
    uri = s3_bucket.upload_dir(DV_SMALL, "tables/small dv")
    desc = small_descriptor(DV_SMALL)
    store = open_store(uri, s3_bucket.storage_options)
    async with store:
        bitmap = await load_deletion_vector(store, desc, data_file=DV_SMALL_DATA)
        assert sorted(bitmap) == sorted(
            await load_deletion_vector(LocalStore(DV_SMALL), desc, data_file=DV_SMALL_DATA)
        )
        inside = f"s3://{s3_bucket.name}/tables/small%20dv/{DV_SMALL_DV_FILE}"
        for location in (inside, inside.replace("s3://", "s3a://", 1)):
            absolute = dataclasses.replace(desc, storage_type="p", path_or_inline_dv=location)
            assert await load_deletion_vector(store, absolute) == bitmap
        outside = f"s3://{s3_bucket.name}/tables/other/{DV_SMALL_DV_FILE}"
        with pytest.raises(UnsafePathError, match="outside the table"):
            await load_deletion_vector(
                store, dataclasses.replace(desc, storage_type="p", path_or_inline_dv=outside)
            )
        s3_bucket.server.client().delete_object(
            Bucket=s3_bucket.name, Key=f"tables/small dv/{DV_SMALL_DV_FILE}"
        )
        with pytest.raises(DeletionVectorError, match="missing") as err:
            await load_deletion_vector(store, desc, data_file=DV_SMALL_DATA)
        assert err.value.path == f"{uri}/{DV_SMALL_DV_FILE}"


# ---------------------------------------------------------------------------- row masks


def test_kept_rows_matches_a_reference() -> None:
    rng = np.random.default_rng(3)
    rows = [*np.unique(rng.integers(0, 100_000, 20_000)).tolist(), (1 << 32) + 3]
    bitmap = BitMap64(rows)
    deleted = set(rows)
    for start, length in [(0, 100_000), (0, 1), (99_990, 50), (12_345, 6789), (5, 0)]:
        mask = kept_rows(bitmap, start, length)
        assert isinstance(mask, pa.BooleanArray) and mask.null_count == 0
        assert mask.to_pylist() == [r not in deleted for r in range(start, start + length)]
    high = kept_rows(bitmap, (1 << 32) - 2, 8).to_pylist()
    assert high == [True] * 5 + [False] + [True] * 2
    assert kept_rows(BitMap64(), 10, 3).to_pylist() == [True] * 3
    with pytest.raises(ValueError):
        kept_rows(bitmap, -1, 3)


def test_kept_rows_is_fast_on_large_files() -> None:
    # 100M rows in 1M-row batches against a DV of 10M rows: a per-row Python loop (or
    # materializing the whole DV per batch) takes far longer than this bound.
    bitmap = BitMap64(range(0, 100_000_000, 10))
    batch = 1_000_000
    started = time.perf_counter()
    kept = 0
    for start in range(0, 100_000_000, batch):
        kept += pa.compute.sum(kept_rows(bitmap, start, batch)).as_py()
    elapsed = time.perf_counter() - started
    assert kept == 90_000_000
    assert elapsed < 5.0, f"kept_rows took {elapsed:.1f}s for 100 batches"


def test_deleted_rows_mask_and_max_row() -> None:
    bitmap = BitMap64([0, 3, 9])
    mask = deleted_rows_mask(bitmap, 10)
    assert mask.dtype == np.bool_
    assert np.flatnonzero(mask).tolist() == [0, 3, 9]
    assert max_row(bitmap) == 9
    assert max_row(BitMap64()) is None
    assert not deleted_rows_mask(BitMap64(), 4).any()
    with pytest.raises(ValueError, match="deletes row 9, but the file has 9 rows"):
        deleted_rows_mask(bitmap, 9)


def test_every_corpus_dv_file_is_a_valid_version_1_file() -> None:
    # Each DV file holds: version byte 1, then (dataSize | bitmap | CRC-32) frames to the end.
    # dv-partitioned-with-checkpoint also holds DV files no commit names (left behind by
    # Spark); they are well formed too.
    tables = [*CORPUS_TABLES.values(), DV_LARGE, DV_SPECIAL_CHAR]
    files = [Path(p) for t in tables for p in glob.glob(str(t / "**/*.bin"), recursive=True)]
    assert len(files) >= 20
    for path in files:
        content = path.read_bytes()
        assert content[0] == 1, path
        position = 1
        while position < len(content):
            (size,) = struct.unpack_from(">I", content, position)
            desc = DeletionVectorDescriptor("u", "x" * 20, size, 0, offset=position)
            bitmap = parse_dv_file_slice(content[position:], desc, str(path))
            assert len(bitmap) > 0
            position += 4 + size + 4
        assert position == len(content), path
    for table in CORPUS_TABLES.values():
        for _, desc in dv_actions(table):
            if desc.storage_type == "u":
                assert (table / relative_dv_path(desc.path_or_inline_dv)).is_file()
