"""``_last_checkpoint`` and its checksum (PROTOCOL.md "Last Checkpoint File Schema",
"JSON checksum", "How to URL encode keys and string values")."""

from __future__ import annotations

import glob
import hashlib
import json
import re
from pathlib import Path

import pytest
from conftest import CORPORA

from deltastream.errors import CorruptFileError, CorruptLastCheckpointError
from deltastream.log.last_checkpoint import (
    LastCheckpoint,
    canonical_json,
    json_checksum,
    parse_last_checkpoint,
)

SPEC = Path(__file__).resolve().parents[2] / ".." / "shared" / "spec" / "PROTOCOL.md"
SOURCE = "s3://bucket/tbl/_delta_log/_last_checkpoint"


def md5(s: str) -> str:
    return hashlib.md5(s.encode("utf-8")).hexdigest()


def spec_example() -> tuple[str, str, str]:
    """The JSON, canonical form and checksum of the example in the spec's "JSON checksum"."""
    text = SPEC.resolve().read_text(encoding="utf-8")
    section = text[text.index("### JSON checksum") :]
    example = re.search(r"^Json: `(.*)`\\?$", section, re.M)
    canonical = re.search(r"^Canonicalized form: `(.*)`\\?$", section, re.M)
    checksum = re.search(r"^Checksum is `([0-9a-f]{32})`", section, re.M)
    assert example and canonical and checksum, "spec example not found"
    return example.group(1), canonical.group(1), checksum.group(1)


# --- canonicalisation ------------------------------------------------------------------------


def test_spec_example_canonical_form() -> None:
    example, canonical, _ = spec_example()
    assert canonical_json(json.loads(example)) == canonical


def test_spec_example_checksum() -> None:
    example, canonical, checksum = spec_example()
    assert checksum == "6a92d155a59bf2eecbd4b4ec7fd1f875"
    assert json_checksum(example) == checksum
    assert json_checksum(example.encode("utf-8")) == checksum
    assert md5(canonical) == checksum


def test_spec_example_literals_as_written() -> None:
    # The same example written out here, so the test stands even if the spec text moves.
    example = (
        '{"k0":"\'v 0\'", "checksum": "adsaskfljadfkjadfkj", "k1":{"k2": 2, "k3": ["v3", [1, 2], '
        '{"k4": "v4", "k5": ["v5", "v6", "v7"]}]}}'
    )
    assert canonical_json(json.loads(example)) == (
        '"k0"="%27v%200%27","k1"+"k2"=2,"k1"+"k3"+0="v3","k1"+"k3"+1+0=1,"k1"+"k3"+1+1=2,'
        '"k1"+"k3"+2+"k4"="v4","k1"+"k3"+2+"k5"+0="v5","k1"+"k3"+2+"k5"+1="v6",'
        '"k1"+"k3"+2+"k5"+2="v7"'
    )
    assert json_checksum(example) == "6a92d155a59bf2eecbd4b4ec7fd1f875"


def test_spec_object_example() -> None:
    # Rule 4's example.
    doc = '{"a": 10, "b": {"y": null, "x": "https://delta.io"} }'
    assert canonical_json(json.loads(doc)) == '"a"=10,"b"+"x"="https%3A%2F%2Fdelta.io","b"+"y"=null'


def test_spec_array_example() -> None:
    # Rule 5's example, wrapped in an object.
    assert canonical_json(json.loads('{"a": [null, "hi ho", 2.71]}')) == (
        '"a"+0=null,"a"+1="hi%20ho","a"+2=2.71'
    )


def test_spec_top_level_checksum_example() -> None:
    # Rule 6's example.
    doc = '{"k1": "v1", "checksum": "<anything>", "k3": 23}'
    assert canonical_json(json.loads(doc)) == '"k1"="v1","k3"=23'
    assert json_checksum(doc) == md5('"k1"="v1","k3"=23')


def test_literals() -> None:
    assert canonical_json({"t": True, "f": False, "n": None}) == '"f"=false,"n"=null,"t"=true'


def test_unreserved_characters_are_kept() -> None:
    s = "AZaz09-._~"
    assert canonical_json({s: s}) == f'"{s}"="{s}"'


@pytest.mark.parametrize(
    ("raw", "encoded"),
    [
        (" ", "%20"),
        ("+", "%2B"),
        ("=", "%3D"),
        (",", "%2C"),
        ('"', "%22"),
        ("%", "%25"),
        ("/", "%2F"),
        (":", "%3A"),
        ("*", "%2A"),
        ("'", "%27"),
        ("(", "%28"),
        ("!", "%21"),
        ("\\", "%5C"),
        (">", "%3E"),
        ("\n", "%0A"),
        ("\u00e9", "%C3%A9"),
        ("\u6f22", "%E6%BC%A2"),
        ("\U0001f600", "%F0%9F%98%80"),
        ("\x7f", "%7F"),
    ],
)
def test_reserved_characters_are_percent_encoded_upper_case(raw: str, encoded: str) -> None:
    assert canonical_json({"k": f"a{raw}b"}) == f'"k"="a{encoded}b"'
    assert canonical_json({f"a{raw}b": 1}) == f'"a{encoded}b"=1'


def test_empty_string() -> None:
    assert canonical_json({"k": ""}) == '"k"=""'


@pytest.mark.parametrize(
    "number",
    [
        "1",
        "1.0",
        "1.50",
        "-0",
        "0.0",
        "1e10",
        "1E+10",
        "2.5e-3",
        "12345678901234567890123456789",
        "-9223372036854775809",
        "3.141592653589793238462643383279",
    ],
)
def test_numbers_keep_their_text(number: str) -> None:
    doc = f'{{"version": {number}, "checksum": "x"}}'
    assert json_checksum(doc) == md5(f'"version"={number}')


def test_one_and_one_point_zero_differ() -> None:
    assert json_checksum('{"v": 1}') != json_checksum('{"v": 1.0}')


def test_sorting_is_by_utf8_bytes_of_canonical_paths() -> None:
    doc = json.dumps({"b": 1, "a": {"z": 1, "b": 2}, "B": 3, "a b": 4, "_": 5, "~": 6})
    # '"' (0x22) < '%' (0x25) < 'B' (0x42) < '_' (0x5F) < 'a' < 'b' < '~'
    assert canonical_json(json.loads(doc)) == (
        '"B"=3,"_"=5,"a"+"b"=2,"a"+"z"=1,"a%20b"=4,"b"=1,"~"=6'
    )


def test_array_indices_sort_as_bytes() -> None:
    doc = json.loads(json.dumps({"a": list(range(12))}))
    pairs = canonical_json(doc).split(",")
    paths = [p.split("=")[0] for p in pairs]
    assert paths == sorted(paths, key=lambda p: p.encode())
    assert paths[:4] == ['"a"+0', '"a"+1', '"a"+10', '"a"+11']


def test_arrays_of_objects() -> None:
    doc = '{"parts": [{"name": "p 1", "size": 10}, {"name": "p2", "size": 20, "tags": ["x"]}]}'
    assert canonical_json(json.loads(doc)) == (
        '"parts"+0+"name"="p%201","parts"+0+"size"=10,'
        '"parts"+1+"name"="p2","parts"+1+"size"=20,"parts"+1+"tags"+0="x"'
    )


def test_top_level_checksum_excluded_nested_checksum_kept() -> None:
    doc = {"version": 3, "checksum": "abc", "tags": {"checksum": "nested"}, "l": [{"checksum": 1}]}
    assert canonical_json(doc) == '"l"+0+"checksum"=1,"tags"+"checksum"="nested","version"=3'


def test_checksum_is_independent_of_key_order_and_whitespace() -> None:
    a = '{"version":10,"size":13,"sizeInBytes":24680,"numOfAddFiles":10}'
    b = '{ "numOfAddFiles" : 10 ,\n "sizeInBytes":24680, "size":13,"version":10 }'
    assert json_checksum(a) == json_checksum(b)
    assert json_checksum(a) == md5('"numOfAddFiles"=10,"size"=13,"sizeInBytes"=24680,"version"=10')


def _corpus_last_checkpoints_with_checksum() -> list[Path]:
    out = []
    for name in sorted(glob.glob(str(CORPORA / "**" / "_last_checkpoint"), recursive=True)):
        try:
            obj = json.loads(Path(name).read_bytes())
        except ValueError:
            continue  # the corpora hold deliberately corrupt pointers too
        if isinstance(obj, dict) and "checksum" in obj:
            out.append(Path(name))
    return out


CORPUS_FILES = _corpus_last_checkpoints_with_checksum()


def test_corpora_hold_last_checkpoints_with_checksums() -> None:
    assert len(CORPUS_FILES) >= 40


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: str(p.relative_to(CORPORA)))
def test_corpus_last_checkpoint_checksums_verify(path: Path) -> None:
    data = path.read_bytes()
    obj = json.loads(data)
    assert json_checksum(data) == obj["checksum"]
    parsed = parse_last_checkpoint(str(path), data)
    assert parsed.version == obj["version"]


# --- parse_last_checkpoint -------------------------------------------------------------------


def with_checksum(body: dict[str, object]) -> bytes:
    text = json.dumps(body)
    return json.dumps({**body, "checksum": json_checksum(text)}).encode()


def test_valid_without_checksum() -> None:
    lc = parse_last_checkpoint(SOURCE, b'{"version":10,"size":13}')
    assert lc == LastCheckpoint(version=10, size=13)


def test_valid_with_all_fields_and_checksum() -> None:
    data = with_checksum(
        {
            "version": 20,
            "size": 30,
            "parts": 3,
            "sizeInBytes": 123456,
            "numOfAddFiles": 25,
            "checkpointSchema": {"type": "struct", "fields": [{"name": "txn", "nullable": True}]},
            "tags": {"k": "v w"},
        }
    )
    lc = parse_last_checkpoint(SOURCE, data)
    assert lc == LastCheckpoint(
        version=20, size=30, parts=3, size_in_bytes=123456, num_of_add_files=25
    )


def test_v2_checkpoint_path_extracted() -> None:
    name = "00000000000000000010.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.json"
    data = with_checksum(
        {
            "version": 10,
            "size": 5,
            "v2Checkpoint": {
                "path": name,
                "sizeInBytes": 1234,
                "modificationTime": 1700000000000,
                "nonFileActions": [{"protocol": {"minReaderVersion": 3, "minWriterVersion": 7}}],
                "sidecarFiles": [{"path": "a.parquet", "sizeInBytes": 1, "modificationTime": 2}],
            },
        }
    )
    lc = parse_last_checkpoint(SOURCE, data)
    assert lc.version == 10
    assert lc.v2_checkpoint_path == name


def test_no_v2_checkpoint_path() -> None:
    assert parse_last_checkpoint(SOURCE, b'{"version":1}').v2_checkpoint_path is None


def test_huge_version() -> None:
    lc = parse_last_checkpoint(SOURCE, b'{"version":9223372036854775807}')
    assert lc.version == 9223372036854775807


def test_checksum_in_upper_case_hex_verifies() -> None:
    body = {"version": 1, "size": 2}
    data = json.dumps({**body, "checksum": json_checksum(json.dumps(body)).upper()}).encode()
    assert parse_last_checkpoint(SOURCE, data).version == 1


def corrupt(data: bytes, *words: str) -> str:
    with pytest.raises(CorruptLastCheckpointError) as info:
        parse_last_checkpoint(SOURCE, data)
    err = info.value
    assert isinstance(err, CorruptFileError)
    assert err.path == SOURCE
    msg = str(err)
    assert msg.startswith(SOURCE)
    for w in words:
        assert w.lower() in msg.lower(), (w, msg)
    return msg


@pytest.mark.parametrize(
    "data", [b'{"version": 1', b"", b"not json", b'{"version": 1}}', b"\xff\xfe"]
)
def test_bad_json(data: bytes) -> None:
    corrupt(data, "invalid JSON")


@pytest.mark.parametrize("data", [b"[1]", b"1", b'"version"', b"null"])
def test_not_an_object(data: bytes) -> None:
    corrupt(data, "object")


def test_checksum_mismatch_names_both_checksums() -> None:
    good = with_checksum({"version": 10, "size": 13})
    obj = json.loads(good)
    tampered = json.dumps({**obj, "version": 11}).encode()
    actual = json_checksum(tampered)
    msg = corrupt(tampered, "checksum")
    assert obj["checksum"] in msg
    assert actual in msg
    assert actual != obj["checksum"]


def test_checksum_mismatch_when_checksum_is_garbage() -> None:
    msg = corrupt(b'{"version": 10, "checksum": "0123"}', "checksum")
    assert "0123" in msg and json_checksum(b'{"version": 10}') in msg


def test_checksum_of_wrong_type() -> None:
    corrupt(b'{"version": 10, "checksum": 12}', "checksum")


@pytest.mark.parametrize(
    "data",
    [
        b'{"version": 1, "version": 2}',
        b'{"version": 1, "tags": {"a": "1", "a": "2"}}',
        b'{"version": 1, "size": 1, "size": 1}',
    ],
)
def test_duplicate_keys(data: bytes) -> None:
    # PROTOCOL.md "JSON checksum" rule 7: such JSON is invalid.
    corrupt(data, "duplicate")


def test_missing_version() -> None:
    corrupt(b'{"size": 13}', "version")


def test_null_version() -> None:
    corrupt(b'{"version": null, "size": 13}', "version")


@pytest.mark.parametrize("value", ['"10"', "10.5", "1.0", "1e3", "true", "[10]", '{"v": 10}'])
def test_non_integer_version(value: str) -> None:
    msg = corrupt(f'{{"version": {value}}}'.encode(), "version")
    assert "integer" in msg


@pytest.mark.parametrize("value", ["-1", "-100"])
def test_negative_version(value: str) -> None:
    msg = corrupt(f'{{"version": {value}}}'.encode(), "negative")
    assert value in msg


@pytest.mark.parametrize("field", ["size", "parts", "sizeInBytes", "numOfAddFiles"])
def test_non_integer_optional_fields(field: str) -> None:
    corrupt(f'{{"version": 1, "{field}": "x"}}'.encode(), field)


def test_zero_parts() -> None:
    corrupt(b'{"version": 1, "parts": 0}', "parts")


def test_deeply_nested_json() -> None:
    depth = 100_000
    corrupt(b'{"version": 1, "tags": ' + b"[" * depth + b"]" * depth + b"}", "invalid JSON")
