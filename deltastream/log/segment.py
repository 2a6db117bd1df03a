"""Choosing the files that reconstruct one version of a table: the log segment.

This module is pure: it works on a listing that :mod:`deltastream.log.listing` fetched.

Invariants of a :class:`LogSegment` for version ``V`` built on checkpoint ``C`` (or on no
checkpoint, when ``C`` is ``None`` and replay starts at version 0):

* ``checkpoint`` holds every part of one complete checkpoint of version ``C <= V``: the
  newest complete one not explicitly excluded. Multi-part checkpoints with missing parts
  are never chosen (the protocol requires readers to ignore them).
* ``commits`` holds exactly the commit files ``C+1 .. V`` in ascending order, without gaps.
* ``replay`` covers the same versions as ``commits``, in ascending order, with runs of
  commits replaced by log compaction files ``x.y.compacted.json`` where ``C < x <= y <= V``;
  applying ``replay`` after the checkpoint yields version ``V``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from deltastream.errors import (
    IncompleteCheckpointError,
    InvalidArgumentError,
    MissingVersionsError,
    TableNotFoundError,
    VersionNotFoundError,
)
from deltastream.log.paths import LogFile, LogFileKind

__all__ = [
    "Followed",
    "IncompleteListingError",
    "LogListing",
    "LogSegment",
    "build_segment",
    "gaps",
]

# Preference among checkpoints of the same version: single files before multi-part ones.
_CHECKPOINT_PREFERENCE = {
    LogFileKind.CHECKPOINT: 0,
    LogFileKind.UUID_CHECKPOINT: 1,
    LogFileKind.MULTIPART_CHECKPOINT: 2,
}


class IncompleteListingError(Exception):
    """The listing started after versions the segment needs; list again from version 0."""


@dataclass(frozen=True)
class Followed:
    """What a reader following the log finds from its next version: ``commits``, the run of
    consecutive commits from it (up to a gap, where the next call finds ``missing``); or,
    when its next version is gone although later ones exist (log retention removed it
    before it was read), ``missing``, the versions removed. Neither: nothing new yet."""

    commits: tuple[LogFile, ...]
    missing: range | None = None

    def missing_error(self, table_uri: str, why: str) -> MissingVersionsError:
        assert self.missing is not None
        return MissingVersionsError(f"{table_uri}/_delta_log", [self.missing], why)


@dataclass(frozen=True)
class LogListing:
    """The log files found by one listing, classified.

    ``listed_from`` is the first version the listing could contain (0 for a full listing).
    """

    table_uri: str
    files: tuple[LogFile, ...]
    listed_from: int = 0

    def commits(self) -> dict[int, LogFile]:
        return {f.version: f for f in self.files if f.kind is LogFileKind.COMMIT}

    def contiguous_commits(
        self, first: int, last: int | None = None, *, why: str = ""
    ) -> list[LogFile]:
        """The commits of versions ``first..last`` (default: up to the newest listed), which
        must all be there: the one rule every reader of consecutive versions applies. A gap
        raises :class:`~deltastream.errors.MissingVersionsError` naming the versions that
        are missing (``why`` says what needed them); nothing listed at or after ``first``
        (with ``last`` unset) is no gap: an empty list."""
        commits = self.commits()
        if last is None:
            last = max((v for v in commits if v >= first), default=first - 1)
        missing = gaps(commits, first, last)
        if missing:
            raise MissingVersionsError(f"{self.table_uri}/_delta_log", missing, why)
        return [commits[v] for v in range(first, last + 1)]

    def follow(self, first: int, *, last: int | None = None, limit: int | None = None) -> Followed:
        """What a reader following the log from version ``first`` finds in this listing:
        the one rule of the tailer and the Spark stream. See :class:`Followed`."""
        commits = self.commits()
        run: list[LogFile] = []
        v = first
        while v in commits and (last is None or v <= last) and (limit is None or len(run) < limit):
            run.append(commits[v])
            v += 1
        if run:
            return Followed(tuple(run))
        later = [c for c in commits if c > first]
        later += [f.version for f in self.files if f.is_checkpoint and f.version >= first]
        if not later or (last is not None and min(later) > last):
            return Followed(())
        return Followed((), range(first, min(later)))

    def crc(self, version: int) -> LogFile | None:
        for f in self.files:
            if f.kind is LogFileKind.CRC and f.version == version:
                return f
        return None


@dataclass(frozen=True)
class LogSegment:
    """The files that reconstruct ``version`` (see the module docstring for invariants)."""

    table_uri: str
    version: int
    checkpoint_version: int | None
    checkpoint: tuple[LogFile, ...]
    commits: tuple[LogFile, ...]
    replay: tuple[LogFile, ...]
    crc: LogFile | None = None

    @property
    def log_uri(self) -> str:
        return f"{self.table_uri}/_delta_log"


def gaps(present: Iterable[int], first: int, last: int) -> list[range]:
    """The numbers ``first..last`` not in ``present``, as ranges: the cost follows how many
    are present, not the span (a stray ``99999999999999999999.json`` makes a span of 10^20
    versions, one range here)."""
    out: list[range] = []
    expected = first
    for v in sorted(v for v in present if first <= v <= last):
        if v > expected:
            out.append(range(expected, v))
        expected = v + 1
    if expected <= last:
        out.append(range(expected, last + 1))
    return out


def _complete_checkpoints(
    files: Iterable[LogFile], excluded: frozenset[str]
) -> tuple[dict[int, tuple[LogFile, ...]], dict[int, str]]:
    """Complete checkpoints by version (the preferred one per version), and a note on each
    version whose only checkpoints are multi-part ones with missing parts."""
    singles: dict[int, list[LogFile]] = defaultdict(list)
    multi: dict[tuple[int, int], dict[int, LogFile]] = defaultdict(dict)
    for f in files:
        if not f.is_checkpoint or f.key in excluded:
            continue
        if f.kind is LogFileKind.MULTIPART_CHECKPOINT:
            assert f.num_parts is not None and f.part is not None
            multi[(f.version, f.num_parts)][f.part] = f
        else:
            singles[f.version].append(f)
    complete: dict[int, tuple[LogFile, ...]] = {}
    incomplete: dict[int, str] = {}
    for version, candidates in singles.items():
        best = min(candidates, key=lambda f: (_CHECKPOINT_PREFERENCE[f.kind], f.key))
        complete[version] = (best,)
    for (version, num_parts), parts in sorted(multi.items()):
        if len(parts) == num_parts:
            if version not in complete:
                complete[version] = tuple(parts[i] for i in range(1, num_parts + 1))
        elif version not in complete:
            absent = gaps(parts, 1, num_parts)
            shown = ", ".join(
                str(r.start) if r.stop - r.start == 1 else f"{r.start}-{r.stop - 1}"
                for r in absent[:10]
            )
            more = f" and {len(absent) - 10} more run(s)" if len(absent) > 10 else ""
            incomplete[version] = (
                f"checkpoint {version} has {len(parts)} of {num_parts} parts "
                f"(part(s) {shown}{more} missing)"
            )
    for version in complete:
        incomplete.pop(version, None)
    return complete, incomplete


def build_segment(
    listing: LogListing,
    version: int | None = None,
    *,
    excluded_checkpoints: frozenset[str] = frozenset(),
    use_compactions: bool = True,
) -> LogSegment:
    """Choose the checkpoint and commits that reconstruct ``version`` (default: the latest).

    Raises :class:`TableNotFoundError` for an empty log, :class:`VersionNotFoundError` for a
    version outside what the log holds, :class:`MissingVersionsError` for gaps and
    :class:`IncompleteCheckpointError` when only a partial multi-part checkpoint could have
    covered a gap. :class:`IncompleteListingError` means the listing started too late.
    """
    uri = listing.table_uri
    log_uri = f"{uri}/_delta_log"
    if version is not None and version < 0:
        raise InvalidArgumentError(f"version must be >= 0, not {version}")
    commits = listing.commits()
    checkpoints, incomplete = _complete_checkpoints(listing.files, excluded_checkpoints)
    if not commits and not checkpoints:
        if listing.listed_from > 0:
            raise IncompleteListingError()
        if incomplete:
            raise IncompleteCheckpointError(f"{log_uri}: {'; '.join(incomplete.values())}")
        raise TableNotFoundError(uri)
    latest = max([*commits, *checkpoints])
    if version is not None and version > latest:
        raise VersionNotFoundError(uri, version, _earliest(commits, checkpoints), latest)
    end = latest if version is None else version

    cp_version = max((v for v in checkpoints if v <= end), default=None)
    start = 0 if cp_version is None else cp_version + 1
    if start < listing.listed_from:
        raise IncompleteListingError()
    missing = gaps(commits, start, end)
    if missing:
        blocking = {v: why for v, why in incomplete.items() if start <= v <= end}
        if blocking:
            raise IncompleteCheckpointError(
                f"{log_uri}: {'; '.join(blocking.values())}, and commits "
                f"{missing[0].start}..{missing[-1].stop - 1} needed without it are not in "
                "the log"
            )
        earliest = _earliest(commits, checkpoints)
        if (
            version is not None
            and cp_version is None
            and earliest is not None
            and version < earliest
        ):
            # The requested version predates the retained history.
            raise VersionNotFoundError(uri, version, earliest, latest)
        base = f"checkpoint {cp_version}" if cp_version is not None else "version 0"
        raise MissingVersionsError(
            log_uri, missing, f"needed to reconstruct version {end} from {base}"
        )

    segment_commits = tuple(commits[v] for v in range(start, end + 1))
    replay = (
        _with_compactions(listing.files, segment_commits, start, end)
        if use_compactions
        else segment_commits
    )
    return LogSegment(
        table_uri=uri,
        version=end,
        checkpoint_version=cp_version,
        checkpoint=checkpoints[cp_version] if cp_version is not None else (),
        commits=segment_commits,
        replay=replay,
        crc=listing.crc(end),
    )


def _earliest(
    commits: dict[int, LogFile], checkpoints: dict[int, tuple[LogFile, ...]]
) -> int | None:
    """The oldest version the log can reconstruct, assuming no gaps after it."""
    candidates = list(checkpoints)
    if 0 in commits:
        candidates.append(0)
    return min(candidates) if candidates else None


def _with_compactions(
    files: Iterable[LogFile], commits: tuple[LogFile, ...], start: int, end: int
) -> tuple[LogFile, ...]:
    """Replace runs of commits by the widest log compactions that fit in ``start..end``."""
    widest: dict[int, LogFile] = {}
    for f in files:
        if f.kind is not LogFileKind.COMPACTION or f.end_version is None:
            continue
        if start <= f.version and f.end_version <= end:
            current = widest.get(f.version)
            if current is None or (current.end_version or 0) < f.end_version:
                widest[f.version] = f
    if not widest:
        return commits
    out: list[LogFile] = []
    v = start
    while v <= end:
        compaction = widest.get(v)
        if compaction is not None and compaction.end_version is not None:
            out.append(compaction)
            v = compaction.end_version + 1
        else:
            out.append(commits[v - start])
            v += 1
    return tuple(out)
