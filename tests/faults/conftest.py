"""Tallies of the fault suites (faults injected, survived; kills), printed after the run and
written to ``$EXTAGG_FAULT_REPORT`` (JSON) when that is set."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any

import pytest

TALLY: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))


def record(scenario: str, **counts: int) -> None:
    for name, value in counts.items():
        TALLY[scenario][name] += value


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TALLY:
        return
    terminalreporter.section("extagg fault injection")
    for scenario, counts in sorted(TALLY.items()):
        terminalreporter.write_line(
            f"{scenario:28s} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        )
    path = os.environ.get("EXTAGG_FAULT_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({k: dict(v) for k, v in TALLY.items()}, handle, indent=2, sort_keys=True)


@pytest.fixture
def tally():
    return record
