"""``build_segment``: choosing the checkpoint, commits and compactions that reconstruct a
version (PROTOCOL.md "Checkpoints", "Log Compaction Files", "Metadata Cleanup")."""

from __future__ import annotations

import time

import pytest

from deltastream.errors import (
    CorruptFileError,
    IncompleteCheckpointError,
    LogError,
    MissingVersionsError,
    TableNotFoundError,
    VersionNotFoundError,
)
from deltastream.log.paths import LogFile, LogFileKind, parse_log_key
from deltastream.log.segment import (
    IncompleteListingError,
    LogListing,
    LogSegment,
    build_segment,
    gaps,
)
from deltastream.storage.base import ObjectMeta

URI = "s3://bucket/tbl"
UUID = "80a083e8-7026-4e79-81be-64bd76c43a11"


def lf(name: str) -> LogFile:
    f = parse_log_key(ObjectMeta(key=f"_delta_log/{name}", size=100, last_modified_ms=0))
    assert f is not None, name
    return f


def commit(v: int) -> LogFile:
    return lf(f"{v:020d}.json")


def commits(first: int, last: int) -> list[LogFile]:
    return [commit(v) for v in range(first, last + 1)]


def cp(v: int) -> LogFile:
    return lf(f"{v:020d}.checkpoint.parquet")


def part(v: int, p: int, n: int) -> LogFile:
    return lf(f"{v:020d}.checkpoint.{p:010d}.{n:010d}.parquet")


def parts(v: int, n: int, present: list[int] | None = None) -> list[LogFile]:
    return [part(v, p, n) for p in (present if present is not None else range(1, n + 1))]


def uuid_cp(v: int, fmt: str = "json") -> LogFile:
    return lf(f"{v:020d}.checkpoint.{UUID}.{fmt}")


def compaction(x: int, y: int) -> LogFile:
    return lf(f"{x:020d}.{y:020d}.compacted.json")


def crc(v: int) -> LogFile:
    return lf(f"{v:020d}.crc")


def last_checkpoint() -> LogFile:
    return lf("_last_checkpoint")


def listing(*groups: LogFile | list[LogFile], listed_from: int = 0) -> LogListing:
    files: list[LogFile] = []
    for g in groups:
        files.extend(g if isinstance(g, list) else [g])
    # a real listing is in key order
    return LogListing(
        table_uri=URI, files=tuple(sorted(files, key=lambda f: f.key)), listed_from=listed_from
    )


def versions(seg: LogSegment) -> list[int]:
    return [f.version for f in seg.commits]


def replayed_versions(seg: LogSegment) -> list[int]:
    out: list[int] = []
    for f in seg.replay:
        if f.kind is LogFileKind.COMPACTION:
            assert f.end_version is not None
            out.extend(range(f.version, f.end_version + 1))
        else:
            assert f.kind is LogFileKind.COMMIT
            out.append(f.version)
    return out


def assert_invariants(seg: LogSegment) -> None:
    start = 0 if seg.checkpoint_version is None else seg.checkpoint_version + 1
    assert versions(seg) == list(range(start, seg.version + 1))
    assert replayed_versions(seg) == list(range(start, seg.version + 1))
    assert all(f.kind is LogFileKind.COMMIT for f in seg.commits)
    if seg.checkpoint_version is None:
        assert seg.checkpoint == ()
    else:
        assert seg.checkpoint and all(f.version == seg.checkpoint_version for f in seg.checkpoint)
        assert all(f.is_checkpoint for f in seg.checkpoint)


# --- checkpoint choice -----------------------------------------------------------------------


def test_commits_only() -> None:
    seg = build_segment(listing(commits(0, 4)))
    assert seg.version == 4
    assert seg.checkpoint_version is None
    assert versions(seg) == [0, 1, 2, 3, 4]
    assert seg.table_uri == URI
    assert seg.log_uri == f"{URI}/_delta_log"
    assert_invariants(seg)


def test_latest_uses_newest_checkpoint() -> None:
    seg = build_segment(listing(commits(0, 12), cp(5), cp(10), last_checkpoint()))
    assert seg.version == 12
    assert seg.checkpoint_version == 10
    assert seg.checkpoint == (cp(10),)
    assert versions(seg) == [11, 12]
    assert_invariants(seg)


@pytest.mark.parametrize(
    ("target", "expected_cp", "expected_commits"),
    [
        (12, 10, [11, 12]),
        (10, 10, []),
        (9, 5, [6, 7, 8, 9]),
        (5, 5, []),
        (4, None, [0, 1, 2, 3, 4]),
        (0, None, [0]),
    ],
)
def test_time_travel_uses_newest_checkpoint_not_after_target(
    target: int, expected_cp: int | None, expected_commits: list[int]
) -> None:
    seg = build_segment(listing(commits(0, 12), cp(5), cp(10)), target)
    assert seg.version == target
    assert seg.checkpoint_version == expected_cp
    assert versions(seg) == expected_commits
    assert_invariants(seg)


def test_complete_multipart_checkpoint_parts_in_order() -> None:
    seg = build_segment(listing(commits(0, 12), parts(10, 3)))
    assert seg.checkpoint_version == 10
    assert [f.part for f in seg.checkpoint] == [1, 2, 3]
    assert all(f.num_parts == 3 for f in seg.checkpoint)
    assert_invariants(seg)


def test_incomplete_multipart_falls_back_to_older_checkpoint() -> None:
    seg = build_segment(listing(commits(0, 12), cp(5), parts(10, 3, [1, 3])))
    assert seg.checkpoint_version == 5
    assert seg.checkpoint == (cp(5),)
    assert versions(seg) == list(range(6, 13))
    assert_invariants(seg)


def test_incomplete_multipart_falls_back_to_commits() -> None:
    seg = build_segment(listing(commits(0, 12), parts(10, 2, [2])))
    assert seg.checkpoint_version is None
    assert versions(seg) == list(range(13))
    assert_invariants(seg)


def test_incomplete_multipart_next_to_complete_set_of_same_version() -> None:
    seg = build_segment(listing(commits(8, 12), parts(10, 3, [1, 2]), parts(10, 2)))
    assert seg.checkpoint_version == 10
    assert [(f.part, f.num_parts) for f in seg.checkpoint] == [(1, 2), (2, 2)]


def test_incomplete_multipart_next_to_classic_of_same_version() -> None:
    seg = build_segment(listing(commits(9, 12), parts(10, 3, [1]), cp(10)))
    assert seg.checkpoint == (cp(10),)


def test_only_incomplete_multipart_covers_gap() -> None:
    # Commits 0..10 were cleaned up; the only checkpoint that could cover them lacks a part.
    with pytest.raises(IncompleteCheckpointError) as info:
        build_segment(listing(commits(11, 14), parts(10, 3, [1, 3])))
    msg = str(info.value)
    assert f"{URI}/_delta_log" in msg
    assert "checkpoint 10" in msg
    assert "2 of 3" in msg
    assert "part(s) 2 missing" in msg


def test_only_incomplete_multipart_names_every_missing_part() -> None:
    with pytest.raises(IncompleteCheckpointError, match=r"part\(s\) 2, 4 missing"):
        build_segment(listing(commits(11, 14), parts(10, 4, [1, 3])))


def test_log_of_only_an_incomplete_multipart_checkpoint() -> None:
    with pytest.raises(IncompleteCheckpointError, match=r"part\(s\) 1 missing"):
        build_segment(listing(parts(10, 2, [2])))


def test_incomplete_multipart_after_target_is_irrelevant() -> None:
    seg = build_segment(listing(commits(0, 12), parts(10, 2, [1])), 8)
    assert seg.checkpoint_version is None
    assert versions(seg) == list(range(9))


def test_classic_preferred_over_uuid_and_multipart_of_same_version() -> None:
    seg = build_segment(listing(commits(9, 11), uuid_cp(10), parts(10, 2), cp(10)))
    assert seg.checkpoint == (cp(10),)
    seg = build_segment(listing(commits(9, 11), uuid_cp(10, "parquet"), parts(10, 2)))
    assert seg.checkpoint == (uuid_cp(10, "parquet"),)


def test_uuid_checkpoint_is_complete() -> None:
    seg = build_segment(listing(commits(5, 12), uuid_cp(10)))
    assert seg.checkpoint_version == 10
    assert seg.checkpoint[0].kind is LogFileKind.UUID_CHECKPOINT


def test_excluded_checkpoints() -> None:
    lst = listing(commits(0, 12), cp(5), cp(10))
    seg = build_segment(lst, excluded_checkpoints=frozenset({cp(10).key}))
    assert seg.checkpoint_version == 5
    assert versions(seg) == list(range(6, 13))
    seg = build_segment(lst, excluded_checkpoints=frozenset({cp(10).key, cp(5).key}))
    assert seg.checkpoint_version is None
    assert versions(seg) == list(range(13))


def test_excluding_one_part_makes_multipart_incomplete() -> None:
    lst = listing(commits(0, 12), cp(5), parts(10, 2))
    seg = build_segment(lst, excluded_checkpoints=frozenset({part(10, 2, 2).key}))
    assert seg.checkpoint_version == 5


def test_excluded_checkpoint_with_no_replacement_raises() -> None:
    # Commits before 10 are gone: without checkpoint 10 nothing reconstructs the table.
    lst = listing(commits(10, 12), cp(10))
    with pytest.raises(MissingVersionsError) as info:
        build_segment(lst, excluded_checkpoints=frozenset({cp(10).key}))
    assert info.value.missing == tuple(range(10))


def test_checkpoint_only_log() -> None:
    seg = build_segment(listing(cp(108), last_checkpoint()))
    assert seg.version == 108
    assert seg.checkpoint_version == 108
    assert seg.checkpoint == (cp(108),)
    assert seg.commits == () and seg.replay == ()


def test_checkpoint_only_log_with_explicit_version() -> None:
    seg = build_segment(listing(cp(108)), 108)
    assert seg.version == 108 and seg.checkpoint_version == 108


def test_checkpoint_newer_than_listed_commits() -> None:
    seg = build_segment(listing(commits(0, 5), cp(7)))
    assert seg.version == 7
    assert seg.checkpoint_version == 7
    assert seg.commits == ()


# --- gaps and ranges ----------------------------------------------------------------------------


def test_gap_raises_missing_versions() -> None:
    with pytest.raises(MissingVersionsError) as info:
        build_segment(listing(commits(0, 3), commits(5, 8)))
    err = info.value
    assert isinstance(err, LogError)
    assert err.missing == (4,)
    assert "4" in str(err)
    assert f"{URI}/_delta_log" in str(err)


def test_several_gaps_are_all_reported() -> None:
    with pytest.raises(MissingVersionsError) as info:
        build_segment(listing(commit(0), commit(1), commit(3), commit(4), commit(7), commit(8)))
    assert info.value.missing == (2, 5, 6)
    msg = str(info.value)
    assert "2" in msg and "5-6" in msg


def test_gap_after_checkpoint() -> None:
    with pytest.raises(MissingVersionsError) as info:
        build_segment(listing(commits(0, 11), cp(10), commit(13), commit(14)))
    assert info.value.missing == (12,)
    assert "12" in str(info.value)


def test_gap_before_checkpoint_is_irrelevant() -> None:
    seg = build_segment(listing(commits(0, 2), commits(6, 12), cp(6)))
    assert seg.checkpoint_version == 6
    assert versions(seg) == list(range(7, 13))


def test_gap_after_target_is_irrelevant() -> None:
    seg = build_segment(listing(commits(0, 4), commits(6, 8)), 4)
    assert versions(seg) == [0, 1, 2, 3, 4]


def test_missing_first_commits_without_checkpoint() -> None:
    with pytest.raises(MissingVersionsError) as info:
        build_segment(listing(commits(3, 6)))
    assert info.value.missing == (0, 1, 2)


def test_target_after_latest() -> None:
    with pytest.raises(VersionNotFoundError) as info:
        build_segment(listing(commits(0, 8)), 9)
    err = info.value
    assert (err.version, err.earliest, err.latest) == (9, 0, 8)
    assert "9" in str(err) and "0..8" in str(err)


def test_target_after_latest_checkpoint_only() -> None:
    with pytest.raises(VersionNotFoundError) as info:
        build_segment(listing(cp(108)), 200)
    assert (info.value.earliest, info.value.latest) == (108, 108)


def test_target_before_retained_history() -> None:
    # Metadata cleanup removed commits 0..4 and kept checkpoint 5.
    lst = listing(cp(5), commits(6, 10))
    with pytest.raises(VersionNotFoundError) as info:
        build_segment(lst, 3)
    err = info.value
    assert (err.version, err.earliest, err.latest) == (3, 5, 10)
    assert "5..10" in str(err)
    # versions from the checkpoint on are fine
    assert build_segment(lst, 5).checkpoint_version == 5
    assert versions(build_segment(lst, 7)) == [6, 7]


def test_target_before_retained_history_of_checkpoint_only_log() -> None:
    # Same situation as above, with no commits retained after the checkpoint: version 107
    # is just as much outside what the log can reconstruct (only 108 is available).
    with pytest.raises(VersionNotFoundError) as info:
        build_segment(listing(cp(108)), 107)
    assert (info.value.earliest, info.value.latest) == (108, 108)


def test_empty_listing() -> None:
    with pytest.raises(TableNotFoundError) as info:
        build_segment(listing())
    assert URI in str(info.value)


def test_listing_without_commits_or_checkpoints() -> None:
    with pytest.raises(TableNotFoundError):
        build_segment(
            listing(last_checkpoint(), crc(3), compaction(1, 2), lf("_sidecars/x.parquet"))
        )


def test_partial_listing_that_needs_older_files() -> None:
    lst = listing(cp(10), commits(10, 15), listed_from=10)
    seg = build_segment(lst)
    assert seg.checkpoint_version == 10 and versions(seg) == list(range(11, 16))
    with pytest.raises(IncompleteListingError):
        build_segment(lst, 8)


def test_partial_listing_without_checkpoint() -> None:
    with pytest.raises(IncompleteListingError):
        build_segment(listing(commits(11, 15), listed_from=10))


def test_partial_listing_with_nothing() -> None:
    with pytest.raises(IncompleteListingError):
        build_segment(listing(listed_from=10))


def test_partial_listing_whose_checkpoint_is_excluded() -> None:
    lst = listing(cp(10), commits(10, 15), listed_from=10)
    with pytest.raises(IncompleteListingError):
        build_segment(lst, excluded_checkpoints=frozenset({cp(10).key}))


# --- compactions --------------------------------------------------------------------------------


def test_compaction_replaces_its_commits() -> None:
    seg = build_segment(listing(commits(0, 8), compaction(2, 5)))
    assert seg.replay == (commit(0), commit(1), compaction(2, 5), commit(6), commit(7), commit(8))
    assert versions(seg) == list(range(9))  # commits are still all listed
    assert_invariants(seg)


def test_widest_compaction_is_chosen() -> None:
    seg = build_segment(
        listing(commits(0, 10), compaction(2, 4), compaction(2, 7), compaction(2, 6))
    )
    assert seg.replay == (commit(0), commit(1), compaction(2, 7), commit(8), commit(9), commit(10))
    assert_invariants(seg)


def test_compaction_never_past_target() -> None:
    lst = listing(commits(0, 10), compaction(2, 4), compaction(2, 9))
    seg = build_segment(lst, 8)
    assert compaction(2, 9) not in seg.replay
    assert seg.replay == (commit(0), commit(1), compaction(2, 4), *commits(5, 8))
    assert_invariants(seg)
    seg = build_segment(lst, 9)
    assert seg.replay == (commit(0), commit(1), compaction(2, 9))
    assert_invariants(seg)


def test_compaction_never_before_checkpoint() -> None:
    seg = build_segment(listing(commits(0, 10), cp(3), compaction(2, 6), compaction(3, 8)))
    assert seg.checkpoint_version == 3
    assert seg.replay == tuple(commits(4, 10))
    assert_invariants(seg)


def test_compaction_starting_right_after_checkpoint() -> None:
    seg = build_segment(listing(commits(0, 10), cp(3), compaction(4, 8)))
    assert seg.replay == (compaction(4, 8), commit(9), commit(10))
    assert_invariants(seg)


def test_consecutive_and_overlapping_compactions() -> None:
    seg = build_segment(
        listing(
            commits(0, 12), compaction(0, 3), compaction(2, 9), compaction(4, 6), compaction(7, 12)
        )
    )
    assert seg.replay == (compaction(0, 3), compaction(4, 6), compaction(7, 12))
    assert_invariants(seg)


def test_compaction_of_whole_segment() -> None:
    seg = build_segment(listing(commits(0, 5), compaction(0, 5)))
    assert seg.replay == (compaction(0, 5),)
    assert_invariants(seg)


def test_use_compactions_false() -> None:
    seg = build_segment(listing(commits(0, 8), compaction(2, 5)), use_compactions=False)
    assert seg.replay == seg.commits == tuple(commits(0, 8))


# --- crc --------------------------------------------------------------------------------------


def test_crc_of_the_version_is_attached() -> None:
    lst = listing(commits(0, 8), crc(6), crc(7), crc(8))
    assert build_segment(lst).crc == crc(8)
    assert build_segment(lst, 7).crc == crc(7)
    assert build_segment(lst, 5).crc is None


def test_crc_of_checkpoint_only_version() -> None:
    seg = build_segment(listing(cp(108), crc(108), crc(107)))
    assert seg.crc == crc(108)


def test_contiguous_commits_names_every_missing_version() -> None:
    from deltastream.errors import MissingVersionsError
    from deltastream.log.paths import LogFile, LogFileKind
    from deltastream.log.segment import LogListing

    def commit(v: int) -> LogFile:
        return LogFile(f"_delta_log/{v:020d}.json", LogFileKind.COMMIT, v, 1, v)

    listing = LogListing("/t", tuple(commit(v) for v in (3, 4, 6, 9)), listed_from=3)
    assert [f.version for f in listing.contiguous_commits(3, 4)] == [3, 4]
    assert listing.contiguous_commits(10) == []  # nothing listed from there: no gap
    with pytest.raises(MissingVersionsError, match=r"5, 7-8 \(for the test\)") as caught:
        listing.contiguous_commits(3, why="for the test")
    assert caught.value.missing == (5, 7, 8)


# ---------------------------------------------------------------------------- following


def test_follow_returns_the_run_of_consecutive_commits_up_to_a_gap() -> None:
    found = listing(commits(3, 6), commits(8, 9)).follow(3)
    assert [f.version for f in found.commits] == [3, 4, 5, 6]
    assert found.missing is None


def test_follow_stops_at_last_and_at_limit() -> None:
    log = listing(commits(0, 9))
    assert [f.version for f in log.follow(2, last=4).commits] == [2, 3, 4]
    assert [f.version for f in log.follow(2, limit=2).commits] == [2, 3]


def test_follow_finds_nothing_new_past_the_newest_commit() -> None:
    found = listing(commits(0, 4)).follow(5)
    assert found.commits == () and found.missing is None


def test_follow_reports_versions_removed_before_they_were_read() -> None:
    found = listing(cp(7), commits(8, 9), listed_from=3).follow(3)
    assert found.commits == ()
    assert found.missing == range(3, 7)
    error = found.missing_error(URI, "removed before the stream read them")
    assert error.missing == (3, 4, 5, 6)
    assert "removed before the stream read them" in str(error)


def test_follow_at_a_gap_reports_it_as_missing() -> None:
    assert listing(commits(3, 6), commits(8, 9)).follow(7).missing == range(7, 8)


def test_follow_ignores_later_versions_beyond_last() -> None:
    found = listing(commits(8, 9)).follow(3, last=5)
    assert found.commits == () and found.missing is None


# ---------------------------------------------------------------------------- bounded gaps


def test_gaps_are_ranges_whatever_the_span() -> None:
    assert gaps([0, 1, 5, 6, 9], 0, 12) == [range(2, 5), range(7, 9), range(10, 13)]
    assert gaps([], 3, 10**18) == [range(3, 10**18 + 1)]
    assert gaps({4: None, 5: None}, 4, 5) == []


def test_a_stray_far_future_commit_is_one_missing_range_at_once() -> None:
    """A stray ``00000000000100000000.json`` beside versions 0..2: the latest version is
    100,000,000 and versions 3..99,999,999 are missing, reported as one range, quickly."""
    started = time.monotonic()
    with pytest.raises(MissingVersionsError) as info:
        build_segment(listing(commits(0, 2), commit(100_000_000)))
    assert time.monotonic() - started < 1
    assert info.value.ranges == (range(3, 100_000_000),)
    assert "3-99999999" in str(info.value) and "99,999,997 versions" in str(info.value)
    with pytest.raises(MissingVersionsError, match="3-99999999"):
        listing(commits(0, 2), commit(100_000_000)).contiguous_commits(0)


def test_a_version_beyond_64_bits_is_a_corrupt_log() -> None:
    with pytest.raises(CorruptFileError, match="beyond the largest"):
        lf("99999999999999999999.json")
    assert lf(f"{2**63 - 1:020d}.json").version == 2**63 - 1


def test_a_billion_part_checkpoint_is_described_without_enumerating_parts() -> None:
    started = time.monotonic()
    with pytest.raises(IncompleteCheckpointError, match=r"2-1000000000 missing"):
        build_segment(listing(part(1, 1, 1_000_000_000), commit(2)))
    assert time.monotonic() - started < 1
