"""Nothing left behind in spill directories: folders of processes killed by SIGKILL are removed by
the next extagg process that spills there; pid reuse is told apart by start time; forked children
neither leave empty folders nor touch their parent's files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from extagg.spill.tempdir import SpillDirs, process_dir_name, remove_orphans

from ..conftest import files_under

SPILLER = textwrap.dedent(
    """
    import itertools, operator, sys
    from extagg import Aggregator, ExternalAppendOnlyMap
    SUM = Aggregator(lambda v: v, operator.add, operator.add)
    emap = ExternalAppendOnlyMap(SUM, memory="8m", spill_dirs=[sys.argv[1]], force_spill_every=300)
    if sys.argv[2] == "forever":
        emap.insert_all((i % 1000, 1) for i in itertools.count())
    emap.insert_all((i % 1000, 1) for i in range(2000))
    assert dict(emap.iterator()) == {k: 2 for k in range(1000)}
    emap.close()
    """
)


def _spiller(base: Path, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SPILLER, str(base), mode])


def _wait_for_runs(base: Path, proc: subprocess.Popen, count: int = 3) -> None:
    """Until ``proc`` has ``count`` run files in its own folder."""
    deadline = time.monotonic() + 60
    mine = f"extagg-{proc.pid}-"
    while sum(os.path.basename(os.path.dirname(f)).startswith(mine) for f in files_under(base)) < (
        count
    ):
        assert proc.poll() is None, "the spilling child died on its own"
        assert time.monotonic() < deadline, "the child never spilled"
        time.sleep(0.02)


def _folders(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir())


def test_folders_of_sigkilled_spillers_are_removed_by_the_next_process(tmp_path: Path) -> None:
    base = tmp_path / "spill"
    previous: list[str] = []
    for _ in range(3):
        proc = _spiller(base, "forever")
        _wait_for_runs(base, proc)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # the one left: the killed child's, with its runs (on main, every earlier one stays too)
        left = _folders(base)
        assert len(left) == 1 and left[0].startswith(f"extagg-{proc.pid}-"), (left, previous)
        assert len(files_under(base)) >= 3
        previous = left
    survivor = _spiller(base, "once")
    assert survivor.wait(timeout=120) == 0
    assert _folders(base) == []  # the orphan is gone, and the survivor left nothing either


def test_pid_reuse_and_live_processes_are_told_apart(tmp_path: Path) -> None:
    base = tmp_path / "spill"
    base.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        live = process_dir_name(sleeper.pid)
        pid, start, host = live.split("-")[1:]
        names = {
            "live": live,
            "reused": f"extagg-{pid}-{int(start) - 500}-{host}",  # same pid, started 5 s earlier
            "gone": f"extagg-{dead.pid}-{start}-{host}",
            "other-host": f"extagg-{dead.pid}-{start}-{int(host, 16) ^ 1:08x}",
            "legacy-gone": f"extagg-{dead.pid}-0badcafe",
            "not-ours": "extagg-state-machine-abc123",
        }
        for name in names.values():
            (base / name).mkdir()
            (base / name / "run-1.run").write_bytes(b"x")
        removed = remove_orphans(base)
        assert sorted(os.path.basename(p) for p in removed) == sorted(
            names[k] for k in ("reused", "gone", "legacy-gone")
        )
        assert _folders(base) == sorted(names[k] for k in ("live", "other-host", "not-ours"))
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_live_spiller_in_another_pid_namespace_keeps_its_folder(tmp_path: Path) -> None:
    """A process in another PID namespace of this host (a container sharing the host name and
    the disk) names its folder with pids that mean nothing here: its live folder was removed
    as an orphan, and it died on "spill file does not exist"."""
    import shutil

    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare or "unshare", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True)  # fmt: skip
    if unshare is None or probe.returncode != 0:
        pytest.skip("no unshare --pid here (needs root)")
    base = tmp_path / "spill"
    namespaced = [unshare, "--pid", "--kill-child", "--mount-proc"]  # killed with unshare
    proc = subprocess.Popen([*namespaced, sys.executable, "-c", SPILLER, str(base), "forever"])
    try:
        deadline = time.monotonic() + 60
        while len(files_under(base)) < 3:
            assert proc.poll() is None, "the spilling child died on its own"
            assert time.monotonic() < deadline, "the child never spilled"
            time.sleep(0.02)
        theirs = _folders(base)
        assert remove_orphans(base) == []
        assert _folders(base) == theirs
        time.sleep(0.5)
        assert proc.poll() is None, "the child failed once its folder was judged"
    finally:
        proc.kill()
        proc.wait()


def test_the_folder_is_created_with_the_first_file_and_goes_with_the_last(tmp_path: Path) -> None:
    dirs = SpillDirs([tmp_path / "s"])
    assert not (tmp_path / "s").exists()  # constructing a map creates nothing
    a, b = dirs.new_path(), dirs.new_path()
    folder = os.path.dirname(a)
    assert os.path.basename(folder) == process_dir_name()
    Path(a).write_bytes(b"a")
    Path(b).write_bytes(b"b")
    dirs.remove(a)
    assert os.path.isdir(folder)
    dirs.remove(b)
    assert not os.path.exists(folder)
    c = dirs.new_path()  # and comes back when needed
    Path(c).write_bytes(b"c")
    dirs.cleanup()
    assert _folders(tmp_path / "s") == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_children_leave_nothing_and_keep_their_hands_off_the_parents_files(
    tmp_path: Path,
) -> None:
    import operator

    from extagg import Aggregator, ExternalAppendOnlyMap

    base = tmp_path / "spill"
    total = Aggregator(lambda v: v, operator.add, operator.add)
    parent_map = ExternalAppendOnlyMap(total, memory="8m", spill_dirs=[base], force_spill_every=100)
    parent_map.insert_all((i, 1) for i in range(500))
    parent_files = files_under(base)
    assert parent_files
    children = []
    for work in ("spill", "idle", "cleanup-inherited"):
        pid = os.fork()
        if pid == 0:  # the child: exits through os._exit, as PySpark's forked workers do
            code = 1
            try:
                if work == "spill":
                    with ExternalAppendOnlyMap(
                        total, memory="8m", spill_dirs=[base], force_spill_every=100
                    ) as emap:
                        emap.insert_all((i % 50, 1) for i in range(1000))
                        assert os.path.basename(os.path.dirname(files_under(base)[-1]))
                        ok = dict(emap.iterator()) == {k: 20 for k in range(50)}
                    code = 0 if ok else 2
                elif work == "cleanup-inherited":
                    parent_map.close()  # must not delete the parent's files
                    code = 0
                else:
                    code = 0
            finally:
                os._exit(code)
        children.append(pid)
    for pid in children:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    assert files_under(base) == parent_files
    assert _folders(base) == [process_dir_name()]
    assert dict(parent_map.iterator()) == {k: 1 for k in range(500)}
    parent_map.close()
    assert _folders(base) == []
