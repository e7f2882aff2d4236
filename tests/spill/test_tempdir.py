import os

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
