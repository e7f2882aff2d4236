"""Shared fixtures: a clean extagg environment for every test."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "extagg",
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# CI: the same examples every run, so a red build is a regression, not a new random draw;
# local runs keep exploring new examples (and save failures to .hypothesis/ for replay)
settings.register_profile("ci", parent=settings.get_profile("extagg"), derandomize=True)
# a longer search for a bug hunt: HYPOTHESIS_PROFILE=deep pytest -m "not slow" tests/...
settings.register_profile("deep", parent=settings.get_profile("extagg"), max_examples=600)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "extagg"))


#: the columnar engine's default thread count in tests: 1, so that tests of the single-thread
#: engine's internals see them; ``EXTAGG_TEST_THREADS=2 pytest`` runs the suite threaded
#: (tests/columnar/test_threads.py covers threads explicitly either way)
TEST_THREADS = os.environ.get("EXTAGG_TEST_THREADS", "1")


@pytest.fixture(autouse=True)
def _clean_extagg_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No EXTAGG_* setting of the developer's shell leaks into a test."""
    for name in list(os.environ):
        if name.startswith("EXTAGG_"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EXTAGG_PROGRESS", "0")
    monkeypatch.setenv("EXTAGG_THREADS", TEST_THREADS)


@pytest.fixture
def spill_dir(tmp_path):
    """A private spill directory whose leftovers the test can inspect."""
    path = tmp_path / "spill"
    path.mkdir()
    return path


def files_under(path) -> list[str]:
    """Every regular file below ``path`` (spill files live in per-process subdirectories)."""
    found = []
    for root, _dirs, files in os.walk(path):
        found.extend(os.path.join(root, f) for f in files)
    return sorted(found)
