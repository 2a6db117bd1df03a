"""When the change data feed is in force decides whether a commit without ``cdc`` files may be
read from its add/remove actions. Range reads, the tailer (tests/daemon/test_events.py) and
the Spark source (tests/spark/test_stream.py) apply the one rule."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from cdf_tables import upgraded_without_cdf_feature

import deltastream as ds


@pytest.fixture
def table(tmp_path: Path) -> str:
    uri = str(tmp_path / "t")
    upgraded_without_cdf_feature(uri)
    return uri


def change_types(uri: str, **kwargs: object) -> Counter[tuple[int, str]]:
    rows = ds.read_changes(uri, **kwargs).read_all().to_pylist()  # type: ignore[arg-type]
    return Counter((r["_commit_version"], r["_change_type"]) for r in rows)


def test_a_range_refuses_a_rewrite_made_while_the_feed_was_not_in_force(table: str) -> None:
    with pytest.raises(ds.ChangeDataNotEnabledError, match="writer version 7") as caught:
        change_types(table, start_version=0)
    assert caught.value.versions == (2,)
    # Up to the upgrade, and with inference asked for, the rows are there.
    assert change_types(table, start_version=0, end_version=1) == {(0, "insert"): 50}
    assert change_types(table, start_version=0, infer_without_cdf=True) == {
        (0, "insert"): 50,
        (2, "delete"): 50,
        (2, "insert"): 40,
    }
