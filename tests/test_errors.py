"""Whether an error is worth retrying is a property of its class, the same for every consumer."""

from __future__ import annotations

import pytest

from deltastream import errors as e

TRANSIENT = [
    e.StorageError("s3://b/k", "503 SlowDown"),
    e.ObjectNotFoundError("s3://b/k"),
    e.AccessDeniedError("s3://b/k", "GET failed after 1 attempt(s): AccessDenied"),  # a source
    e.PreconditionFailedError("s3://b/k"),
    e.SinkError("http://x", "POST failed after 3 attempts"),
    OSError(28, "No space left on device"),  # not ours: keep trying, visibly
    RuntimeError("a bug"),
]
PERMANENT = [
    e.InvalidArgumentError("bad option"),
    e.StateConflictError("s3://b/position.json", "changed by another tailer"),
    e.TableNotFoundError("/t"),
    e.TableReplacedError("/t", "a", "b", "another table is there", "start over"),
    e.CorruptCommitError("/t/_delta_log/1.json", "line 1"),
    e.MissingVersionsError("/t/_delta_log", [3]),
    e.IncompleteCheckpointError("/t/_delta_log: checkpoint 10 lacks part 2"),
    e.UnsupportedFeatureError("/t", "v2Checkpoint"),
    e.VersionNotFoundError("/t", 9, 0, 3),
    e.TimestampOutOfRangeError("/t: before the first commit"),
    e.DataFileNotFoundError("/t/part-0.parquet", 3),
    e.DeletionVectorError("/t/dv.bin", "checksum"),
    e.ChangeDataNotEnabledError("/t", [2]),
    e.SchemaChangeError("/t", 4, "drops column 'a'"),
    e.HttpStatusError("http://x", 400, "Bad Request", ""),
    e.SinkRecoveryError("/out.jsonl", "not the output"),
    e.SinkInUseError("/out.jsonl", "in use"),
    e.SinkRejectedError("postgresql://db/x?table=t", "value out of range"),
    e.SinkSchemaError("postgresql://db/x?table=t", "column a dropped"),
    e.ResetIncompleteError("/state/reset.json", "interrupted"),
]


@pytest.mark.parametrize("error", TRANSIENT, ids=lambda x: type(x).__name__)
def test_transient(error: BaseException) -> None:
    assert e.is_transient(error)


@pytest.mark.parametrize("error", PERMANENT, ids=lambda x: type(x).__name__)
def test_permanent(error: BaseException) -> None:
    assert not e.is_transient(error)
    assert type(error).transient is False


def test_a_cancellation_is_not_an_error_to_retry() -> None:
    assert not e.is_transient(KeyboardInterrupt())
