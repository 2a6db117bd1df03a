"""deltastream: follow a Delta Lake table as it changes.

The public API: open a table, load snapshots (by version or timestamp), read its rows and
its change data feed; follow it (:func:`tail`, :class:`Tailer`, :class:`Service`) into sinks;
and the errors.
"""

from typing import TYPE_CHECKING, Any

from deltastream._version import __version__
from deltastream.changes.api import read_changes, table_changes
from deltastream.daemon.api import tail
from deltastream.daemon.config import load_config
from deltastream.daemon.delivery import Delivery, Position, Sink, StreamRef
from deltastream.daemon.reset import reset_stream
from deltastream.daemon.service import Service, ServiceConfig, StreamConfig
from deltastream.daemon.sinks import (
    CallbackSink,
    DeltaSink,
    ExecSink,
    HttpSink,
    JsonlSink,
    ParquetSink,
    PostgresSink,
    parse_sink,
)
from deltastream.daemon.tailer import (
    Mode,
    OnMissingFile,
    OnMissingVersions,
    OnSchemaChange,
    StartFrom,
    TailConfig,
    Tailer,
)
from deltastream.errors import (
    ChangeDataError,
    ChangeDataNotEnabledError,
    ChecksumMismatchError,
    CorruptCheckpointError,
    CorruptCommitError,
    CorruptFileError,
    CorruptLastCheckpointError,
    CorruptVersionChecksumError,
    DataChangeInStreamError,
    DataFileError,
    DataFileNotFoundError,
    DeletionVectorError,
    DeltaStreamError,
    HttpStatusError,
    IncompleteCheckpointError,
    InvalidArgumentError,
    InvalidTableStateError,
    LogError,
    LogFileTooLargeError,
    MissingVersionsError,
    ObjectNotFoundError,
    OutputClosedError,
    PreconditionFailedError,
    ResetIncompleteError,
    SchemaChangeError,
    SinkError,
    SinkInUseError,
    SinkRecoveryError,
    SinkRejectedError,
    SinkSchemaError,
    StateConflictError,
    StorageError,
    TableNotFoundError,
    TableReplacedError,
    TimestampOutOfRangeError,
    UnsafePathError,
    UnsupportedFeatureError,
    VersionNotFoundError,
    is_transient,
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
from deltastream.read.api import read_rows, table_rows
from deltastream.read.batch_stream import BatchStream
from deltastream.snapshot.snapshot import Snapshot
from deltastream.snapshot.table import Table, open_table, read_snapshot
from deltastream.snapshot.timestamps import TimestampSearch
from deltastream.storage import ObjectStore, open_store

if TYPE_CHECKING:
    from deltastream.storage.s3 import S3Options


def __getattr__(name: str) -> Any:
    if name == "S3Options":  # imported lazily: see deltastream.storage
        from deltastream.storage.s3 import S3Options

        return S3Options
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AddCDCFile",
    "AddFile",
    "BatchStream",
    "CallbackSink",
    "ChangeDataError",
    "ChangeDataNotEnabledError",
    "ChecksumMismatchError",
    "CommitInfo",
    "CorruptCheckpointError",
    "CorruptCommitError",
    "CorruptFileError",
    "CorruptLastCheckpointError",
    "CorruptVersionChecksumError",
    "DataChangeInStreamError",
    "DataFileError",
    "DataFileNotFoundError",
    "DeletionVectorDescriptor",
    "DeletionVectorError",
    "Delivery",
    "DeltaSink",
    "DeltaStreamError",
    "DomainMetadata",
    "ExecSink",
    "HttpSink",
    "HttpStatusError",
    "IncompleteCheckpointError",
    "InvalidArgumentError",
    "InvalidTableStateError",
    "JsonlSink",
    "LogError",
    "LogFileTooLargeError",
    "Metadata",
    "MissingVersionsError",
    "Mode",
    "ObjectNotFoundError",
    "ObjectStore",
    "OnMissingFile",
    "OnMissingVersions",
    "OnSchemaChange",
    "OutputClosedError",
    "ParquetSink",
    "Position",
    "PostgresSink",
    "PreconditionFailedError",
    "Protocol",
    "RemoveFile",
    "ResetIncompleteError",
    "S3Options",
    "SchemaChangeError",
    "Service",
    "ServiceConfig",
    "Sink",
    "SinkError",
    "SinkInUseError",
    "SinkRecoveryError",
    "SinkRejectedError",
    "SinkSchemaError",
    "Snapshot",
    "StartFrom",
    "StateConflictError",
    "StorageError",
    "StreamConfig",
    "StreamRef",
    "Table",
    "TableNotFoundError",
    "TableReplacedError",
    "TailConfig",
    "Tailer",
    "TimestampOutOfRangeError",
    "TimestampSearch",
    "Txn",
    "UnsafePathError",
    "UnsupportedFeatureError",
    "VersionNotFoundError",
    "__version__",
    "is_transient",
    "load_config",
    "open_store",
    "open_table",
    "parse_sink",
    "read_changes",
    "read_rows",
    "read_snapshot",
    "reset_stream",
    "table_changes",
    "table_rows",
    "tail",
]
