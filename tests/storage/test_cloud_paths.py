"""``deltastream.storage.paths`` for Google Cloud Storage and Azure: which store a URI names
(``store_kind``), Azure's URI spellings (``deltastream.storage.azure.uri``), and the
canonical form, resolution and confinement rules on ``gs://`` and Azure table roots."""

from __future__ import annotations

import pytest

from deltastream.errors import InvalidArgumentError
from deltastream.storage.azure.uri import AzureLocation, azure_root_uri, parse_azure_uri
from deltastream.storage.paths import (
    ExternalPaths,
    TableRoot,
    canonical_path,
    is_under,
    resolve_path,
    store_kind,
)

AZ_ROOT = "abfss://lake@acct.dfs.core.windows.net/tables/t"
GS_ROOT = "gs://bkt/tables/t"


@pytest.mark.parametrize(
    ("uri", "kind"),
    [
        ("/data/t", "file"),
        ("t", "file"),
        ("file:///data/t", "file"),
        ("s3://b/t", "s3"),
        ("S3A://b/t", "s3"),
        ("gs://b/t", "gs"),
        ("GS://b", "gs"),
        ("az://c/t", "az"),
        ("azure://c/t", "az"),
        ("abfss://c@a.dfs.core.windows.net/t", "az"),
        ("abfs://c@a.dfs.core.windows.net/t", "az"),
        ("wasbs://c@a.blob.core.windows.net/t", "az"),
        ("https://a.blob.core.windows.net/c/t", "az"),
        ("https://a.dfs.core.windows.net/c/t", "az"),
        ("https://example.com/c/t", "file"),  # open_store refuses the scheme
    ],
)
def test_store_kind(uri: str, kind: str) -> None:
    assert store_kind(uri) == kind


@pytest.mark.parametrize(
    ("uri", "location"),
    [
        ("az://c/t", AzureLocation(None, "c", "t", None, "t")),
        ("az://c", AzureLocation(None, "c", "", None, "")),
        ("azure://c/a%20b/t/", AzureLocation(None, "c", "a b/t", None, "a b/t/")),
        (
            "abfss://c@Acct.dfs.core.windows.net/t",
            AzureLocation("acct", "c", "t", "core.windows.net", "t"),
        ),
        (
            "wasbs://c@acct.blob.core.windows.net/x/y",
            AzureLocation("acct", "c", "x/y", "core.windows.net", "x/y"),
        ),
        (
            "https://acct.blob.core.windows.net/c/x/y",
            AzureLocation("acct", "c", "x/y", "core.windows.net", "x/y"),
        ),
        (
            "https://acct.dfs.core.chinacloudapi.cn/c",
            AzureLocation("acct", "c", "", "core.chinacloudapi.cn", ""),
        ),
        (
            "az://c@acct.dfs.core.windows.net/t",
            AzureLocation("acct", "c", "t", "core.windows.net", "t"),
        ),
    ],
)
def test_parse_azure_uri(uri: str, location: AzureLocation) -> None:
    assert parse_azure_uri(uri) == location


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("abfss://acct.dfs.core.windows.net/t", "names container@account"),
        ("abfss://c@example.com/t", "not an Azure storage host"),
        ("https://acct.blob.core.windows.net/", "needs a container"),
        ("az:///t", "needs a container"),
        ("https://example.com/c", "not an Azure storage URL"),
        ("s3://b/t", "not an Azure URI"),
        ("az://c/a%00b", "NUL byte"),
    ],
)
def test_parse_azure_uri_refuses(uri: str, problem: str) -> None:
    with pytest.raises(InvalidArgumentError, match=problem):
        parse_azure_uri(uri)


def test_azure_root_uri_is_one_spelling() -> None:
    assert azure_root_uri("acct", "lake", "tables/t/") == AZ_ROOT
    assert azure_root_uri("acct", "lake", "") == "abfss://lake@acct.dfs.core.windows.net"
    assert (
        azure_root_uri("acct", "c", "t", "core.chinacloudapi.cn")
        == "abfss://c@acct.dfs.core.chinacloudapi.cn/t"
    )
    for spelling in (
        AZ_ROOT,
        "https://acct.blob.core.windows.net/lake/tables/t/",
        "wasbs://lake@acct.blob.core.windows.net/tables/t",
    ):
        location = parse_azure_uri(spelling)
        assert location.account is not None
        assert azure_root_uri(location.account, location.container, location.path) == AZ_ROOT


def test_table_roots_of_object_stores() -> None:
    root = TableRoot.parse(AZ_ROOT)
    assert (root.scheme, root.authority, root.path) == ("az", "lake@acct", "/tables/t")
    assert root.azure_account == "acct"
    assert root.canonical_prefixes == ("az://lake@acct/tables/t/",)
    gs = TableRoot.parse(GS_ROOT + "/")
    assert (gs.scheme, gs.authority, gs.path) == ("gs", "bkt", "/tables/t")
    assert gs.canonical_prefixes == ("gs://bkt/tables/t/",)
    assert gs.azure_account is None
    bare = TableRoot.parse("az://lake")
    assert (bare.authority, bare.path, bare.azure_account) == ("lake", "", None)


@pytest.mark.parametrize(
    ("path", "canonical"),
    [
        ("part-0.parquet", "part-0.parquet"),
        ("a%20b/part-0.parquet", "a b/part-0.parquet"),
        # Every spelling of a file under the root is that file, relative to the root.
        (f"{AZ_ROOT}/x=1/part-0.parquet", "x=1/part-0.parquet"),
        ("abfs://lake@acct.dfs.core.windows.net/tables/t/p", "p"),
        ("wasbs://lake@ACCT.blob.core.windows.net/tables/t/p", "p"),
        ("https://acct.blob.core.windows.net/lake/tables/t/a%20b", "a b"),
        ("az://lake/tables/t/p", "p"),  # az:// takes the root's account
        # Elsewhere: one canonical spelling per location.
        ("abfss://other@acct.dfs.core.windows.net/p", "az://other@acct/p"),
        ("https://acct2.blob.core.windows.net/lake/tables/t/p", "az://lake@acct2/tables/t/p"),
        ("az://lake/tables/t2/p", "az://lake@acct/tables/t2/p"),
        ("gs://bkt/tables/t/p", "gs://bkt/tables/t/p"),
    ],
)
def test_canonical_path_on_azure(path: str, canonical: str) -> None:
    assert canonical_path(AZ_ROOT, path) == canonical


@pytest.mark.parametrize(
    ("path", "canonical"),
    [
        ("gs://bkt/tables/t/p", "p"),
        ("GS://bkt/tables/t/a%20b", "a b"),
        ("gs://bkt/tables/t2/p", "gs://bkt/tables/t2/p"),
        ("s3://bkt/tables/t/p", "s3://bkt/tables/t/p"),
    ],
)
def test_canonical_path_on_gcs(path: str, canonical: str) -> None:
    assert canonical_path(GS_ROOT, path) == canonical


@pytest.mark.parametrize(
    ("path", "store_root", "key", "under"),
    [
        ("x/part-0.parquet", AZ_ROOT, "x/part-0.parquet", True),
        (f"{AZ_ROOT}/x/p", AZ_ROOT, "x/p", True),
        ("https://acct.blob.core.windows.net/lake/tables/t/a%20b", AZ_ROOT, "a b", True),
        ("az://lake/tables/t/p", AZ_ROOT, "p", True),
        # Another container of the account: read from that container's root.
        (
            "abfss://other@acct.dfs.core.windows.net/d/p",
            "abfss://other@acct.dfs.core.windows.net",
            "d/p",
            False,
        ),
        ("az://lake/elsewhere/p", "abfss://lake@acct.dfs.core.windows.net", "elsewhere/p", False),
        # Blob names are not normalised: x/../y is a name, and outside the root.
        (f"{AZ_ROOT}/../t2/p", AZ_ROOT, "../t2/p", False),
        ("gs://bkt/tables/t/p", None, "", False),
        ("/tables/t/p", None, "", False),
        ("abfss://nohost/p", None, "", False),
    ],
)
def test_resolve_on_azure(path: str, store_root: str | None, key: str, under: bool) -> None:
    resolved = resolve_path(AZ_ROOT, path)
    assert (resolved.store_root, resolved.key, resolved.under_root) == (store_root, key, under)
    assert is_under(AZ_ROOT, path) == under


@pytest.mark.parametrize(
    ("path", "store_root", "key", "under"),
    [
        ("p", GS_ROOT, "p", True),
        ("gs://bkt/tables/t/x/p", GS_ROOT, "x/p", True),
        ("gs://bkt/tables/t/../t2/p", GS_ROOT, "../t2/p", False),
        ("gs://bkt/tables/t2/p", "gs://bkt", "tables/t2/p", False),
        ("gs://other/p", "gs://other", "p", False),
        ("s3://bkt/tables/t/p", None, "", False),
        ("az://bkt/tables/t/p", None, "", False),
        ("/tables/t/p", None, "", False),
    ],
)
def test_resolve_on_gcs(path: str, store_root: str | None, key: str, under: bool) -> None:
    resolved = resolve_path(GS_ROOT, path)
    assert (resolved.store_root, resolved.key, resolved.under_root) == (store_root, key, under)
    assert is_under(GS_ROOT, path) == under


def test_gs_uri_without_a_bucket() -> None:
    with pytest.raises(InvalidArgumentError, match="a GCS URI needs a bucket"):
        resolve_path(GS_ROOT, "gs:///x")


def test_allowed_external_roots_on_object_stores() -> None:
    # An Azure root that names no account allows that container in the table's account.
    allowed = ExternalPaths.of("az://shared/dv,gs://other/x")
    assert allowed.permits(AZ_ROOT, "abfss://shared@acct.dfs.core.windows.net/dv/f.bin")
    assert allowed.permits(AZ_ROOT, "az://shared/dv/f.bin")
    assert not allowed.permits(AZ_ROOT, "az://shared/dv2/f.bin")
    assert not allowed.permits(AZ_ROOT, "abfss://lake@acct.dfs.core.windows.net/x")
    assert allowed.permits(GS_ROOT, "gs://other/x/y")
    assert not allowed.permits(GS_ROOT, "gs://other/y")
    assert not allowed.permits(GS_ROOT, "s3://other/x/y")
