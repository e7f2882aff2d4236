"""Kill a child process (SIGKILL) at random points of the same workloads, again and again; after
each kill the invariant checker runs: the next process that opens the spill directory leaves
nothing of the dead one's, and the state store's last committed batch and newest version read back
as committed once the directory is reopened (which removes the dead writer's temp files). The next
child resumes the state job from its last committed batch (a retry of the interrupted one).

``EXTAGG_FAULTS`` kills per workload (default 5; ``make faults`` runs more)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from extagg.spill.tempdir import remove_orphans
from extagg.state import Checkpoint

from . import scenarios as sc

#: read at import: the suite's autouse fixture clears EXTAGG_* variables before each test
KILLS = int(os.environ.get("EXTAGG_FAULTS", "5"))
ROOT = Path(__file__).resolve().parents[2]


def _child(kind: str, target: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.faults.scenarios", kind, str(target), str(sc.SCALE)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kill_after(child: subprocess.Popen, delay: float) -> None:
    try:
        line = child.stdout.readline().strip()
        assert line == "ready", f"{line!r} {child.stderr.read()}"
        time.sleep(delay)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL, child.stderr.read()


def _printed_batches(output: str) -> list[int]:
    """The batches a killed child said it committed: whole ``batch N`` lines only (the kill may
    cut the last line anywhere, even after ``batch``)."""
    lines = output.split("\n")[:-1]  # the last piece has no newline: cut, or empty
    return [int(parts[1]) for parts in map(str.split, lines) if parts[:1] == ["batch"]]


@pytest.mark.parametrize("kind", ["generic", "columnar"])
def test_engines_killed_while_spilling_leave_nothing_behind(
    tmp_path: Path, kind: str, tally
) -> None:
    rng = random.Random(f"{kind}-{KILLS}")
    base = tmp_path / "spill"
    with_files = 0
    for _ in range(KILLS):
        child = _child(kind, base)
        _kill_after(child, rng.uniform(0.0, 0.3))
        left = sc.leftovers(base)
        with_files += any(path.endswith(".run") for path in left)
        remove_orphans(base)  # what the next extagg process spilling there does first
        assert sc.leftovers(base) == [], "the killed process's folder survived"
    tally(f"{kind} kill -9", kills=KILLS, left_run_files=with_files, cleaned=KILLS)


def test_state_jobs_killed_at_random_points_keep_every_committed_batch(
    tmp_path: Path, tally
) -> None:
    rng = random.Random(f"state-{KILLS}")
    root = tmp_path / "ckpt"
    temp_left = 0
    for _ in range(KILLS):
        child = _child("state", root)
        _kill_after(child, rng.uniform(0.05, 1.2))
        printed = _printed_batches(child.stdout.read())
        temp_left += bool(sc.temp_files(root))
        last = Checkpoint(root).last_committed_batch()  # opening removes its temp files
        if printed:
            assert last is not None and printed[-1] <= last <= printed[-1] + 1
        sc.check_state(str(root), None, last)
    tally("state kill -9", kills=KILLS, left_temp_files=temp_left, survived=KILLS)
