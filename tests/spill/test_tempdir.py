import os

import pytest

from extagg.spill.tempdir import SpillDirs, resolve_spill_dirs

from ..conftest import files_under


def test_round_robin_across_dirs_in_per_process_subdirs(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    dirs = SpillDirs([a, b])
    paths = [dirs.new_path() for _ in range(4)]
    parents = [os.path.dirname(p) for p in paths]
    assert os.path.dirname(parents[0]) == str(a) and os.path.dirname(parents[1]) == str(b)
    assert parents[0] == parents[2] and parents[1] == parents[3]
    assert os.path.basename(parents[0]).startswith(f"extagg-{os.getpid()}-")


def test_env_var_and_argument_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("EXTAGG_SPILL_DIR", f"{tmp_path / 'x'}{os.pathsep}{tmp_path / 'y'}")
    assert resolve_spill_dirs() == [str(tmp_path / "x"), str(tmp_path / "y")]
    assert resolve_spill_dirs([tmp_path / "z"]) == [str(tmp_path / "z")]


def test_cleanup_removes_every_tracked_file(tmp_path):
    dirs = SpillDirs([tmp_path])
    for _ in range(3):
        with open(dirs.new_path(), "wb") as f:
            f.write(b"x")
    assert len(files_under(tmp_path)) == 3
    dirs.cleanup()
    assert files_under(tmp_path) == []


def test_spills_are_private_to_their_user(tmp_path):
    """The process's folder is made 0700 and its run files 0600 (they were 0755 / 0644 under
    the umask: other users could read the spilled data in the shared temp directory); a
    folder of that name found already there is made private if it is this user's."""
    import operator
    import stat

    from extagg import Aggregator, ExternalAppendOnlyMap
    from extagg.spill.tempdir import process_dir_name

    folder = tmp_path / process_dir_name(os.getpid())
    for existing in (False, True):
        if existing:
            folder.mkdir(mode=0o777)
            os.chmod(folder, 0o777)
        emap = ExternalAppendOnlyMap(
            Aggregator.reducing(operator.add), memory="1m", spill_dirs=[tmp_path],
            force_spill_every=100,
        )  # fmt: skip
        emap.insert_all((i, 1) for i in range(300))
        runs = files_under(tmp_path)
        assert len(runs) >= 2
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert {stat.S_IMODE(os.stat(p).st_mode) for p in runs} == {0o600}
        assert dict(emap.iterator()) == {i: 1 for i in range(300)}
        emap.close()
        assert not folder.exists()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_a_spill_folder_of_another_user_is_refused(tmp_path):
    """The folder's name is predictable: another user who made it first (world-writable)
    could read the spills or swap a run for a forged one, which the merge unpickles."""
    import operator

    from extagg import Aggregator, ExternalAppendOnlyMap, SpillError
    from extagg.spill.tempdir import process_dir_name

    folder = tmp_path / process_dir_name(os.getpid())
    folder.mkdir()
    os.chown(folder, 65534, 65534)
    os.chmod(folder, 0o777)
    emap = ExternalAppendOnlyMap(
        Aggregator.reducing(operator.add), memory="1m", spill_dirs=[tmp_path],
        force_spill_every=10,
    )  # fmt: skip
    with pytest.raises(SpillError, match="not a folder of this user"):
        emap.insert_all((i, 1) for i in range(100))
    emap.close()
    assert os.listdir(folder) == []


def test_no_spill_folder_is_made_again_once_the_process_is_leaving(tmp_path):
    """The command line leaves with ``os._exit`` after removing its spill folders (Ctrl-C
    while kernels compile); a worker thread still spilling must not make its folder again
    and leave it behind."""
    import subprocess
    import sys

    script = f"""
import os
from extagg.errors import SpillError
from extagg.spill.tempdir import SpillDirs, remove_process_dirs
dirs = SpillDirs([{str(tmp_path)!r}])
open(dirs.new_path(), "wb").close()
remove_process_dirs(leaving=True)
try:
    dirs.new_path()
except SpillError as exc:
    print(exc)
print(os.listdir({str(tmp_path)!r}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    assert "the process is stopping" in out
    assert out.splitlines()[-1] == "[]"
