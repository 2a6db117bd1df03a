"""Tables, written by delta-rs, on which the change data feed's rules are easy to get wrong."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.table import TableFeatures

__all__ = ["upgraded_without_cdf_feature"]


def upgraded_without_cdf_feature(uri: str) -> None:
    """v0: 50 rows, ``delta.enableChangeDataFeed=true`` at protocol (1, 4); v1: deletion
    vectors added, which upgrades the protocol to (3, 7) without ``changeDataFeed`` among the
    writer features (as delta-rs does); v2: 10 rows deleted. From v1 on the feed is not in
    force, and indeed v2 has no ``cdc`` files: its one file is rewritten with 40 rows."""
    write_deltalake(
        uri,
        pa.table({"id": pa.array(range(50), pa.int64())}),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    DeltaTable(uri).alter.add_feature(
        [TableFeatures.DeletionVectors], allow_protocol_versions_increase=True
    )
    DeltaTable(uri).delete("id < 10")
    protocol = DeltaTable(uri).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (3, 7)
    assert "changeDataFeed" not in (protocol.writer_features or [])
