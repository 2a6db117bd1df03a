"""Every command on every object store (issue 13): tables uploaded to S3 (moto), Azure
(Azurite) and GCS (gcp-storage-emulator) give what the same tables give locally, through the
Python API and the CLI (``snapshot``, ``files``, ``read``, ``changes``, ``tail``; following a
table on a store: tests/daemon/test_object_store_tail.py); deletion vectors stored
under relative (``u``) and absolute (``p``) paths in every spelling of the store's URIs; the
path confinement of hostile tables; and one line naming the URI for a missing bucket.

The ``object_bucket`` fixture (tests/conftest.py) runs each test once per store."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import CORPORA
from hostile_tables import HOSTILE, hostile_table
from object_stores import Bucket

import deltastream as ds
from deltastream.cli import run
from deltastream.read.deletion_vectors import relative_dv_path
from deltastream.storage import open_store

SNAPSHOT_TABLES = [
    "delta-kernel-rs/golden_data/checkpoint/delta",  # classic checkpoint + _last_checkpoint
    "delta-kernel-rs/data/v2-checkpoints-json-with-sidecars",  # V2 JSON + sidecars
    "delta-kernel-rs/data/v2-checkpoints-parquet-with-last-checkpoint",  # V2 parquet
    "delta-kernel-rs/data/parquet_row_group_skipping",  # multi-part checkpoint
    "delta-kernel-rs/golden_data/dv-partitioned-with-checkpoint/delta",  # deletion vectors
    "delta-kernel-rs/golden_data/data-reader-escaped-chars/delta",  # special characters
    "delta-rs/crates/test/tests/data/checkpoints_vacuumed",  # log starts at version 5
]
READ_TABLES = [
    "delta-kernel-rs/golden_data/dv-partitioned-with-checkpoint/delta",
    "delta-kernel-rs/data/table-with-dv-small",
    "delta-kernel-rs/golden_data/table-with-columnmapping-mode-name/delta",
    "delta-kernel-rs/golden_data/table-with-columnmapping-mode-id/delta",
    "delta-kernel-rs/golden_data/data-reader-escaped-chars/delta",
]
CHANGE_TABLES = [
    "delta-kernel-rs/data/cdf-table-with-dv",
    "delta-kernel-rs/data/cdf-column-mapping-name-mode",
    "delta-kernel-rs/data/cdf-table-partitioned",
]
DV_TABLE = CORPORA / "delta-kernel-rs/golden_data/dv-partitioned-with-checkpoint/delta"
CDF_DV_TABLE = CORPORA / "delta-kernel-rs/data/cdf-table-with-dv"


def rows(table: pa.Table, drop: tuple[str, ...] = ()) -> Counter[str]:
    """The rows of ``table`` as a multiset (order-free), without the columns ``drop``."""
    keep = [c for c in table.column_names if c not in drop]
    return Counter(
        json.dumps(r, sort_keys=True, default=str) for r in table.select(keep).to_pylist()
    )


def files(snapshot: ds.Snapshot) -> list[tuple[str, int]]:
    f = snapshot.files
    return sorted(zip(f.column("path").to_pylist(), f.column("size").to_pylist(), strict=True))


def store_root(bucket: Bucket, prefix: str) -> str:
    """The table's root as its store spells it (Azure's is canonical: abfss://…)."""
    return open_store(bucket.uri(prefix), bucket.storage_options).root_uri


# --- Python API -------------------------------------------------------------------------------


@pytest.mark.parametrize("table", SNAPSHOT_TABLES)
def test_snapshot_equals_local(object_bucket: Bucket, table: str) -> None:
    local = CORPORA / table
    uri = object_bucket.upload_dir(local, "tables/t 1")
    remote = ds.read_snapshot(uri, storage_options=object_bucket.storage_options)
    here = ds.read_snapshot(str(local))
    assert (remote.version, remote.protocol, remote.metadata) == (
        here.version,
        here.protocol,
        here.metadata,
    )
    assert files(remote) == files(here)
    assert remote.table_uri == store_root(object_bucket, "tables/t 1")


@pytest.mark.parametrize("table", READ_TABLES)
def test_read_equals_local(object_bucket: Bucket, table: str) -> None:
    local = CORPORA / table
    uri = object_bucket.upload_dir(local, "tables/read")
    remote = ds.read_rows(uri, storage_options=object_bucket.storage_options).read_all()
    here = ds.read_rows(str(local)).read_all()
    assert remote.schema == here.schema
    assert rows(remote) == rows(here)


@pytest.mark.parametrize("table", CHANGE_TABLES)
def test_changes_equal_local(object_bucket: Bucket, table: str) -> None:
    local = CORPORA / table
    uri = object_bucket.upload_dir(local, "tables/cdf")
    remote = ds.read_changes(uri, storage_options=object_bucket.storage_options).read_all()
    here = ds.read_changes(str(local)).read_all()
    assert remote.schema == here.schema
    # Commit timestamps are the commits' modification times here: the upload's there.
    assert rows(remote, ("_commit_timestamp",)) == rows(here, ("_commit_timestamp",))
    assert remote.num_rows > 0


def test_absolute_deletion_vector_paths_in_every_spelling(
    object_bucket: Bucket, tmp_path: Path
) -> None:
    """The DV table with every ``u`` deletion vector rewritten as a ``p`` one: an absolute
    URI of the same file, in each spelling of the store's URIs (percent-encoded)."""
    root = store_root(object_bucket, "tables/p dv")
    spellings = {root, object_bucket.uri("tables/p dv")}
    if root.startswith("abfss://"):
        container, account = re.match(r"abfss://([^@]+)@([^.]+)", root).groups()  # type: ignore[union-attr]
        spellings |= {
            f"https://{account}.blob.core.windows.net/{container}/tables/p dv",
            f"wasbs://{container}@{account}.blob.core.windows.net/tables/p dv",
            f"az://{container}/tables/p dv",
        }
    expected = rows(ds.read_rows(str(DV_TABLE)).read_all())
    for n, spelling in enumerate(sorted(spellings)):
        table = tmp_path / f"t{n}"
        _with_absolute_dvs(DV_TABLE, table, quote(spelling, safe=":/@"))
        uri = object_bucket.upload_dir(table, "tables/p dv")
        got = ds.read_rows(uri, storage_options=object_bucket.storage_options).read_all()
        assert rows(got) == expected, spelling


def _with_absolute_dvs(source: Path, target: Path, root: str) -> None:
    """Copy ``source`` to ``target`` with its commits' ``u`` DVs made ``p`` DVs under
    ``root``, and without its checkpoints (whose DVs would still be ``u``)."""
    import shutil

    shutil.copytree(
        source, target, ignore=shutil.ignore_patterns("*.checkpoint.parquet", "_last_checkpoint")
    )
    for commit in sorted((target / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line]
        for action in actions:
            for kind in ("add", "remove"):
                dv = (action.get(kind) or {}).get("deletionVector")
                if dv and dv["storageType"] == "u":
                    dv["pathOrInlineDv"] = f"{root}/{quote(relative_dv_path(dv['pathOrInlineDv']))}"
                    dv["storageType"] = "p"
        commit.write_text("".join(json.dumps(a) + "\n" for a in actions))


def test_confinement_on_the_store(object_bucket: Bucket, tmp_path: Path) -> None:
    """A commit adding a file elsewhere in the bucket (an absolute URI of the store's kind)
    is refused, naming it; allowed, it is read through a store at the bucket's root."""
    outside = object_bucket.uri("outside/secret.parquet")
    local, secret = hostile_table(tmp_path, path_in_log=outside)
    object_bucket.put("outside/secret.parquet", secret.read_bytes())
    uri = object_bucket.upload_dir(Path(local), "tables/hostile")
    options = object_bucket.storage_options
    with pytest.raises(ds.UnsafePathError, match="outside the table") as info:
        ds.read_rows(uri, storage_options=options).read_all()
    assert outside in str(info.value)
    got = ds.read_rows(uri, storage_options=options, allow_external_paths=True).read_all()
    assert sorted(got.column("id").to_pylist()) == [0, 1, 2, 100, 101]


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_tables_on_the_store(object_bucket: Bucket, tmp_path: Path, name: str) -> None:
    case = HOSTILE[name](tmp_path)
    uri = object_bucket.upload_dir(Path(case.uri), "tables/hostile")
    with pytest.raises(ds.DeltaStreamError) as info:
        ds.read_rows(uri, storage_options=object_bucket.storage_options).read_all()
    assert isinstance(info.value, case.error), f"{type(info.value).__name__}: {info.value}"
    assert case.fragment in str(info.value) and case.names in str(info.value)


# --- the CLI ----------------------------------------------------------------------------------


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = run(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_commands_equal_local(
    object_bucket: Bucket, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    uri = object_bucket.upload_dir(CDF_DV_TABLE, "tables/cli")
    options = [f"--storage-option={k}={v}" for k, v in object_bucket.storage_options.items()]
    for command in (["files"], ["read", "-o", "-"], ["changes", "--from", "0", "-o", "-"]):
        code, remote, err = cli(capsys, command[0], uri, *options, *command[1:])
        assert code == 0, err
        code, here, err = cli(capsys, command[0], str(CDF_DV_TABLE), *command[1:])
        assert code == 0, err
        assert _lines(remote) == _lines(here), command
        assert remote.strip()
    code, out, err = cli(capsys, "snapshot", uri, *options)
    assert code == 0, err
    assert json.loads(out)["version"] == ds.read_snapshot(str(CDF_DV_TABLE)).version

    # tail, with its state on the store too: the snapshot as insert rows, then it stops.
    output = tmp_path / "rows.jsonl"
    state = object_bucket.uri("state/cli")
    code, _, err = cli(
        capsys, "tail", uri, *options, "--state", state, "--mode", "snapshot",
        "--sink", f"jsonl:{output}", "--name", "cli",
    )  # fmt: skip
    assert code == 0, err
    delivered = [json.loads(line) for line in output.read_text().splitlines()]
    assert {r["_change_type"] for r in delivered} == {"insert"}
    expected = ds.read_rows(str(CDF_DV_TABLE)).read_all()
    assert sorted(r["value"] for r in delivered) == sorted(expected.column("value").to_pylist())


def _lines(output: str) -> Counter[str]:
    """The JSON lines printed, as a multiset, without commit timestamps (the commits'
    modification times: the upload's on the store)."""
    parsed = (json.loads(line) for line in output.splitlines())
    return Counter(
        json.dumps({k: v for k, v in r.items() if k != "_commit_timestamp"}, sort_keys=True)
        for r in parsed
    )


def test_cli_missing_bucket_is_one_line(
    object_bucket: Bucket, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = object_bucket.uri("t").replace(object_bucket.name, "no-such-bucket-here", 1)
    options = [f"--storage-option={k}={v}" for k, v in object_bucket.storage_options.items()]
    code, _, err = cli(capsys, "snapshot", uri, *options)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("deltastream: error: ") and "no-such-bucket-here" in lines[0]


def test_read_of_a_large_file_uses_ranges(object_bucket: Bucket, tmp_path: Path) -> None:
    """A data file over the whole-object limit is read with ranged GETs and gives every row."""
    from deltalake import write_deltalake

    table = tmp_path / "big"
    n = 1_500_000
    data = pa.table({"id": pa.array(range(n), pa.int64()), "x": pa.array(range(n), pa.float64())})
    write_deltalake(str(table), data)
    (data_file,) = [p for p in table.glob("*.parquet")]
    assert data_file.stat().st_size > 8 << 20
    uri = object_bucket.upload_dir(table, "big")
    got = ds.read_rows(uri, columns=["id"], storage_options=object_bucket.storage_options)
    assert got.read_all().column("id").to_pylist() == list(range(n))
    assert pq.ParquetFile(data_file).metadata.num_rows == n


def test_cli_bad_credentials_are_one_line(
    azure_container: Any, gcs_bucket: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A wrong Azure account key (Azurite checks signatures) and a GCS service account
    whose token endpoint refuses: one line naming the table and the problem, exit 2."""
    import socket

    azure_uri = azure_container.upload_dir(CDF_DV_TABLE, "t")
    wrong = "A" * 8 + "=" * 80
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    key = {
        "type": "service_account",
        "client_email": "x@test.iam.gserviceaccount.com",
        "private_key": _PRIVATE_KEY,
        "token_uri": f"http://127.0.0.1:{closed}/token",
    }
    key_file = tmp_path / "key.json"
    key_file.write_text(json.dumps(key))
    cases = [
        (azure_uri, {**azure_container.storage_options, "azure_storage_account_key": wrong}, "403"),
        (
            gcs_bucket.uri("t"),
            {
                **gcs_bucket.storage_options,
                "google_service_account": str(key_file),
                "max_attempts": "2",
            },
            "cannot get Google credentials",
        ),
    ]
    for uri, options, problem in cases:
        flags = [f"--storage-option={k}={v}" for k, v in options.items()]
        code, _, err = cli(capsys, "snapshot", uri, *flags)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, err
        assert lines[0].startswith("deltastream: error: ") and problem in lines[0], lines[0]
        assert uri.split("/")[2].split("@")[0] in lines[0] and wrong not in lines[0]


def _private_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


_PRIVATE_KEY = _private_key()
