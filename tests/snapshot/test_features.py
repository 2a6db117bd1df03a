"""The reader gate (PROTOCOL.md "Table Features", "Reader Version Requirements",
"Valid Feature Names in Table Features")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deltastream.errors import DeltaStreamError, UnsupportedFeatureError
from deltastream.log.actions import Protocol
from deltastream.snapshot.features import (
    KNOWN_READER_FEATURES,
    MAX_READER_VERSION,
    SUPPORTED_READER_FEATURES,
    check_readable,
)

SPEC = (Path(__file__).resolve().parents[2] / ".." / "shared" / "spec" / "PROTOCOL.md").resolve()
URI = "s3://bucket/tbl"


def spec_feature_table() -> dict[str, str]:
    """Feature name -> "Readers or Writers?" column, from the spec's appendix table."""
    text = SPEC.read_text(encoding="utf-8")
    start = text.index("## Valid Feature Names in Table Features")
    end = text.index("\n## ", start + 1)
    out: dict[str, str] = {}
    for line in text[start:end].splitlines():
        m = re.match(r"^\[.*?\]\(.*?\)\s*\|\s*`([^`]+)`\s*\|\s*(.+?)\s*$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


SPEC_FEATURES = spec_feature_table()
SPEC_READER_FEATURES = sorted(
    name for name, who in SPEC_FEATURES.items() if who.lower() == "readers and writers"
)


def proto(reader: int, features: list[str] | None = None) -> Protocol:
    writer = 7 if reader == 3 else 2
    return Protocol(
        min_reader_version=reader,
        min_writer_version=writer,
        reader_features=None if features is None else tuple(features),
        writer_features=None if features is None else tuple(features),
    )


def refused(protocol: Protocol) -> UnsupportedFeatureError:
    with pytest.raises(UnsupportedFeatureError) as info:
        check_readable(URI, protocol)
    err = info.value
    assert isinstance(err, DeltaStreamError)
    assert URI in str(err)
    return err


# --- the spec table ---------------------------------------------------------------------------


def test_spec_table_parsed() -> None:
    assert len(SPEC_FEATURES) >= 15
    assert SPEC_FEATURES["appendOnly"] == "Writers only"


def test_spec_has_five_reader_features() -> None:
    assert (
        sorted(
            [
                "columnMapping",
                "deletionVectors",
                "timestampNtz",
                "v2Checkpoint",
                "vacuumProtocolCheck",
            ]
        )
        == SPEC_READER_FEATURES
    )


@pytest.mark.parametrize("feature", SPEC_READER_FEATURES)
def test_every_spec_reader_feature_is_supported(feature: str) -> None:
    assert feature in SUPPORTED_READER_FEATURES
    assert feature in KNOWN_READER_FEATURES
    check_readable(URI, proto(3, [feature]))


def test_all_spec_reader_features_together() -> None:
    check_readable(URI, proto(3, SPEC_READER_FEATURES))


def test_supported_features_are_known() -> None:
    assert set(KNOWN_READER_FEATURES) >= SUPPORTED_READER_FEATURES


# --- versions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("reader", [1, 2])
def test_legacy_reader_versions_pass(reader: int) -> None:
    check_readable(URI, proto(reader))


def test_reader_version_3_without_features_passes() -> None:
    check_readable(URI, proto(3, []))


def test_reader_version_3_with_supported_features_passes() -> None:
    check_readable(URI, proto(3, ["deletionVectors", "columnMapping"]))


def test_max_reader_version() -> None:
    assert MAX_READER_VERSION == 3


@pytest.mark.parametrize("reader", [4, 99])
def test_newer_reader_version_refused(reader: int) -> None:
    err = refused(proto(reader))
    assert f"readerVersion {reader}" in str(err)
    assert err.feature == f"readerVersion {reader}"


@pytest.mark.parametrize("reader", [0, -1])
def test_invalid_reader_version_refused(reader: int) -> None:
    err = refused(proto(reader))
    assert f"readerVersion {reader}" in str(err)


# --- features ---------------------------------------------------------------------------------


@pytest.mark.parametrize("feature", sorted(set(KNOWN_READER_FEATURES) - SUPPORTED_READER_FEATURES))
def test_known_unsupported_feature_refused(feature: str) -> None:
    err = refused(proto(3, ["deletionVectors", feature]))
    assert err.feature == feature
    assert repr(feature) in str(err)
    assert "does not implement" in str(err)


def test_unknown_feature_refused() -> None:
    err = refused(proto(3, ["columnMapping", "blahabl"]))
    assert err.feature == "blahabl"
    assert "'blahabl'" in str(err)
    assert "unknown" in str(err)


def test_writer_only_feature_listed_as_reader_feature_is_refused() -> None:
    # A writer-only feature has nothing to do in readerFeatures; it is not a reader
    # feature deltastream implements.
    err = refused(proto(3, ["appendOnly"]))
    assert err.feature == "appendOnly"


def test_feature_names_are_case_sensitive() -> None:
    err = refused(proto(3, ["DeletionVectors"]))
    assert err.feature == "DeletionVectors"


# --- the variant type ---------------------------------------------------------------------

#: The reader features of Delta's "Variant Data Type" and "Variant Shredding" protocol RFCs
#: (accepted), with the preview names Spark's Delta writes.
VARIANT_FEATURES = [
    "variantType",
    "variantType-preview",
    "variantShredding",
    "variantShredding-preview",
]


@pytest.mark.parametrize("feature", VARIANT_FEATURES)
def test_variant_features_are_supported(feature: str) -> None:
    assert feature in SUPPORTED_READER_FEATURES
    assert feature in KNOWN_READER_FEATURES
    check_readable(URI, proto(3, [feature]))


def test_variant_features_together_with_others() -> None:
    # As the corpora's Spark and delta-rs tables list them.
    check_readable(URI, proto(3, ["deletionVectors", "variantShredding-preview", "variantType"]))
    check_readable(URI, proto(3, ["columnMapping", "deletionVectors", "variantType"]))


def test_variant_feature_names_are_exact() -> None:
    err = refused(proto(3, ["VariantType"]))
    assert err.feature == "VariantType"
