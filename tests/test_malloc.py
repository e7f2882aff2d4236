"""The command's C heap keeps freed memory for reuse (``extagg._malloc``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHURN = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from extagg._malloc import keep_freed_heap_for_reuse
    print(keep_freed_heap_for_reuse())
else:
    print(None)
def churn():  # a scan's batches: a few arrays of a few hundred KiB made and freed, again and again
    for _ in range(200):
        arrays = [np.ones(60_000) for _ in range(6)]
        del arrays
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, **env: str) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    environ.update(env)
    out = subprocess.run(
        [sys.executable, "-c", CHURN, mode], env=environ, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    setting, faults = out.stdout.split()
    return setting, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_kept_heap_takes_the_batches_without_fresh_pages() -> None:
    _, default_faults = _faults("default")
    setting, faults = _faults("keep")
    if setting == "False":
        pytest.skip("no glibc here")
    # 200 rounds of 6 x 469 KiB: every round faulted its pages in afresh with glibc's
    # defaults (~700 faults a round); kept, the same pages serve every round
    assert default_faults > 200 * 100
    assert faults < default_faults / 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_users_malloc_settings_are_obeyed() -> None:
    setting, _ = _faults("keep", MALLOC_TRIM_THRESHOLD_="1000000")
    assert setting == "False"
