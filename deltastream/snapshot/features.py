"""The reader-feature gate: may deltastream read a table with this protocol?

Readers must implement every feature in ``readerFeatures`` (reader version 3) and every
feature implied by older reader versions (version 2 implies column mapping). A table that
needs anything else is refused with :class:`~deltastream.errors.UnsupportedFeatureError`
naming the feature, before any data is returned.
"""

from __future__ import annotations

from deltastream.errors import UnsupportedFeatureError
from deltastream.log.actions import Protocol

__all__ = [
    "KNOWN_READER_FEATURES",
    "MAX_READER_VERSION",
    "SUPPORTED_READER_FEATURES",
    "check_readable",
]

MAX_READER_VERSION = 3

#: Every reader (reader-writer) table feature deltastream knows of, with what it means.
#: The first five are the reader features of the Delta protocol specification; the others
#: are features used by current engines whose specifications are not final.
KNOWN_READER_FEATURES: dict[str, str] = {
    "columnMapping": "logical column names mapped to physical names or field ids",
    "deletionVectors": "rows soft-deleted through deletion vectors",
    "timestampNtz": "the timestamp_ntz (timestamp without time zone) type",
    "v2Checkpoint": "UUID-named V2 checkpoints with sidecar files",
    "vacuumProtocolCheck": "VACUUM must check the writer protocol (nothing for readers to do)",
    "typeWidening": "column types widened in place (older files hold narrower types)",
    "typeWidening-preview": "preview of typeWidening",
    "variantType": "the semi-structured variant type",
    "variantType-preview": "preview of variantType",
    "variantShredding": "variant columns stored shredded into typed sub-columns",
    "variantShredding-preview": "preview of variantShredding",
    "catalogManaged": "commits are ratified by a catalog; the file listing is not authoritative",
    "catalogOwned-preview": "preview of catalogManaged",
    "geospatial": "geometry and geography types",
}

#: Reader features deltastream implements.
SUPPORTED_READER_FEATURES = frozenset(
    {
        "columnMapping",
        "deletionVectors",
        "timestampNtz",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        # Files keep their narrower types; the data reader casts every column to the table's
        # type, which is what type widening asks of readers.
        "typeWidening",
        "typeWidening-preview",
        # The variant type: the data reader returns a variant column as its binary encoding
        # (metadata, value), reassembling shredded files (deltastream.read.variant). A table
        # may list the feature without having a variant column (delta-rs adds it to every
        # table it creates with deletion vectors); it then reads like any other.
        "variantType",
        "variantType-preview",
        "variantShredding",
        "variantShredding-preview",
    }
)


def check_readable(table_uri: str, protocol: Protocol) -> None:
    """Raise :class:`UnsupportedFeatureError` unless deltastream can read ``protocol``."""
    version = protocol.min_reader_version
    if version < 1:
        raise UnsupportedFeatureError(
            table_uri, f"readerVersion {version}", "not a valid reader version"
        )
    if version > MAX_READER_VERSION:
        raise UnsupportedFeatureError(
            table_uri,
            f"readerVersion {version}",
            f"deltastream implements reader versions 1 to {MAX_READER_VERSION}",
        )
    if version < 3:
        return  # versions 1 and 2 list no features; column mapping (v2) is supported
    for feature in protocol.reader_features or ():
        if feature in SUPPORTED_READER_FEATURES:
            continue
        if feature in KNOWN_READER_FEATURES:
            detail = f"{KNOWN_READER_FEATURES[feature]}; deltastream does not implement it"
        else:
            detail = "unknown to deltastream"
        raise UnsupportedFeatureError(table_uri, feature, detail)
