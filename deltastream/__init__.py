"""deltastream: follow a Delta Lake table as it changes.

The public API: open a table, load snapshots (by version or timestamp), read its rows and
its change data feed, and the errors.
"""

from typing import TYPE_CHECKING, Any

from deltastream.changes.api import read_changes, read_rows, table_changes, table_rows
from deltastream.changes.stream import BatchStream
from deltastream.errors import (
    ChangeDataError,
    ChangeDataNotEnabledError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    CorruptCommitError,
    CorruptFileError,
    CorruptLastCheckpointError,
    CorruptVersionChecksumError,
    DataFileError,
    DataFileNotFoundError,
    DeletionVectorError,
    DeltaStreamError,
    IncompleteCheckpointError,
    InvalidArgumentError,
    InvalidTableStateError,
    LogError,
    MissingVersionsError,
    ObjectNotFoundError,
    SchemaChangeError,
    StorageError,
    TableNotFoundError,
    TimestampOutOfRangeError,
    UnsupportedFeatureError,
    VersionNotFoundError,
)
from deltastream.log.actions import (
    AddCDCFile,
    AddFile,
    CommitInfo,
    DeletionVectorDescriptor,
    DomainMetadata,
    Metadata,
    Protocol,
    RemoveFile,
    Txn,
)
from deltastream.snapshot.snapshot import Snapshot
from deltastream.snapshot.table import Table, open_table, read_snapshot
from deltastream.snapshot.timestamps import TimestampSearch
from deltastream.storage import ObjectStore, open_store

if TYPE_CHECKING:
    from deltastream.storage.s3 import S3Options

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "S3Options":  # imported lazily: see deltastream.storage
        from deltastream.storage.s3 import S3Options

        return S3Options
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AddCDCFile",
    "AddFile",
    "BatchStream",
    "ChangeDataError",
    "ChangeDataNotEnabledError",
    "ChecksumMismatchError",
    "CommitInfo",
    "CorruptCheckpointError",
    "CorruptCommitError",
    "CorruptFileError",
    "CorruptLastCheckpointError",
    "CorruptVersionChecksumError",
    "DataFileError",
    "DataFileNotFoundError",
    "DeletionVectorDescriptor",
    "DeletionVectorError",
    "DeltaStreamError",
    "DomainMetadata",
    "IncompleteCheckpointError",
    "InvalidArgumentError",
    "InvalidTableStateError",
    "LogError",
    "Metadata",
    "MissingVersionsError",
    "ObjectNotFoundError",
    "ObjectStore",
    "Protocol",
    "RemoveFile",
    "S3Options",
    "SchemaChangeError",
    "Snapshot",
    "StorageError",
    "Table",
    "TableNotFoundError",
    "TimestampOutOfRangeError",
    "TimestampSearch",
    "Txn",
    "UnsupportedFeatureError",
    "VersionNotFoundError",
    "__version__",
    "open_store",
    "open_table",
    "read_changes",
    "read_rows",
    "read_snapshot",
    "table_changes",
    "table_rows",
]
