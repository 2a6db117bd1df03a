"""A short mutation-fuzzing run in the suite (the campaign is
``tests/benchmarks/fuzz_log.py``): every mutated log gives rows or a ``DeltaStreamError``,
never another exception, an error naming no file, a hang (10 s) or memory beyond the
limit."""

from __future__ import annotations

import sys
from collections import Counter

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
import fuzz_log

#: Fixed, so that a failure here reproduces with ``fuzz_log.py --replay 7:N``.
SEED = 7
INPUTS = 60


def test_a_short_campaign_finds_no_crash_hang_or_memory_blowup() -> None:
    findings: list[str] = []

    def report(item: fuzz_log.Input, outcome: str, what: str, detail: str) -> None:
        if outcome in fuzz_log.FINDINGS:
            findings.append(f"{outcome} {item.ref} {item.table}/{item.file} ({what}): {detail}")

    counts: Counter[str] = fuzz_log.campaign(SEED, INPUTS, 2, report)
    assert not findings, "\n".join(findings)
    assert counts["ok"] + counts["ok-different"] + counts["ok-disputed"] + counts["error"] == INPUTS
    assert counts["error"] > 0  # the mutations do break logs
