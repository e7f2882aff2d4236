"""Writers of one version are fenced (the second fails clearly, nobody's cache diverges); a corrupt
newest snapshot falls back to an older snapshot and deltas; temp files of killed commits in
``commits/`` go on the next open; the writer cache keeps one NaN key, as the disk does."""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from operator import add
from pathlib import Path

import numpy as np
import pytest

from extagg.errors import CorruptFileError
from extagg.memory import UnifiedMemoryManager
from extagg.state import Checkpoint, StateStoreConf, StateStoreProvider, read_state
from extagg.state import files as files_module
from extagg.state.codec import encode_key, encode_value
from extagg.state.errors import ConcurrentCommitError, StateStoreCommitError
from extagg.state.files import DELTA, SNAPSHOT, StateFileReader, StateFileWriter

from .conftest import commit_version, state_files, temp_files


def _provider(directory: Path, **conf: int) -> StateStoreProvider:
    return StateStoreProvider(
        str(directory),
        conf=StateStoreConf(**conf),
        memory_manager=UnifiedMemoryManager("64m", wait_timeout=5),
    )


# ------------------------------------------------------------------------------ fencing
def test_the_second_writer_of_a_version_fails_and_serves_the_winners(tmp_path: Path) -> None:
    a, b = _provider(tmp_path), _provider(tmp_path)
    commit_version(a, 0, {"x": 1})
    mine, theirs = a.get_store(1), b.get_store(1)
    mine.put("x", 2)
    theirs.put("x", 3)
    theirs.put("y", 1)
    assert mine.commit() == 2
    with pytest.raises(ConcurrentCommitError, match=r"Version 2 of .* was committed by another"):
        theirs.commit()
    assert dict(b.get_read_store(2).items()) == {"x": 2}  # the loser serves the winner's version
    assert dict(a.get_read_store(2).items()) == {"x": 2}
    assert state_files(tmp_path) == ["1.delta", "2.delta"]
    assert temp_files(tmp_path) == []
    a.close()
    b.close()


def test_the_fence_error_is_a_commit_error_and_a_file_exists_error(tmp_path: Path) -> None:
    a, b = _provider(tmp_path), _provider(tmp_path)
    late = b.get_store(0)
    late.put("k", 1)
    commit_version(a, 0, {"k": 0})
    with pytest.raises(StateStoreCommitError) as info:
        late.commit()
    error = info.value
    assert isinstance(error, ConcurrentCommitError) and isinstance(error, FileExistsError)
    assert error.path == os.path.join(str(tmp_path), "1.delta") and error.version == 1
    assert error.error_class == "CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT"


def test_merge_update_is_fenced_against_a_commit_made_while_it_streams(tmp_path: Path) -> None:
    a, b = _provider(tmp_path), _provider(tmp_path)
    commit_version(a, 0, {1: 1})

    def pairs():  # another process commits version 2 while this merge is under way
        commit_version(b, 1, {1: 100})
        yield 2, 5

    with pytest.raises(ConcurrentCommitError):
        a.merge_update(1, pairs(), add)
    assert dict(a.get_read_store(2).items()) == {1: 100}
    assert temp_files(tmp_path) == []


def test_a_retried_batch_still_replaces_its_version_but_two_retries_are_fenced(
    tmp_path: Path,
) -> None:
    a, b = _provider(tmp_path), _provider(tmp_path)
    commit_version(a, 0, {"k": 0})
    commit_version(a, 1, {"k": 1})
    assert commit_version(a, 1, {"k": 11}) == 2  # a retried batch: replaces version 2
    first, second = a.get_store(1), b.get_store(1)
    first.put("k", 21)
    second.put("k", 22)
    first.commit()
    with pytest.raises(ConcurrentCommitError, match="replaced by another writer"):
        second.commit()
    fresh = _provider(tmp_path)
    assert dict(fresh.get_read_store(2).items()) == {"k": 21}
    assert dict(b.get_read_store(2).items()) == {"k": 21}


@pytest.mark.parametrize("moment", ["while building", "just before the rename"])
@pytest.mark.parametrize("retry", ["get_store", "merge_update"])
def test_maintenance_does_not_publish_a_snapshot_of_a_version_retried_meanwhile(
    tmp_path: Path, monkeypatch, moment: str, retry: str
) -> None:
    # provider a's maintenance reads version 3 and writes 3.snapshot; meanwhile b retries
    # batch 2, rewriting 3.delta: a's snapshot of the old 3.delta must not shadow the new one
    a, b = _provider(tmp_path, min_deltas_for_snapshot=2), _provider(tmp_path)
    for version in range(3):
        commit_version(a, version, {"k": f"old{version}"})
    hook = "write" if moment == "while building" else "commit"
    original = getattr(files_module.StateFileWriter, hook)
    retried = []

    def interleaved(self, *args, **kwargs):
        if self.kind == "snapshot" and not retried:
            retried.append(True)
            if retry == "get_store":
                commit_version(b, 2, {"k": "retried"})
            else:
                b.merge_update(2, [("k", "retried")], lambda old, new: new)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(files_module.StateFileWriter, hook, interleaved)
    a.do_maintenance()
    monkeypatch.undo()
    assert retried
    assert "3.snapshot" not in state_files(tmp_path)
    assert dict(_provider(tmp_path).get_read_store(3).items()) == {"k": "retried"}
    assert dict(a.iter_version(3)) == {"k": "retried"}
    a.do_maintenance()  # the next maintenance snapshots the new version
    assert "3.snapshot" in state_files(tmp_path)
    assert dict(_provider(tmp_path).iter_version(3)) == {"k": "retried"}


def test_a_retried_batch_removes_a_snapshot_published_just_before_its_delta(
    tmp_path: Path, monkeypatch
) -> None:
    # the other order: maintenance's checks pass, the retry removes the (absent) snapshot, the
    # snapshot is renamed in, then the retry publishes its delta: the retry removes it again
    a, b = _provider(tmp_path, min_deltas_for_snapshot=2), _provider(tmp_path)
    for version in range(3):
        commit_version(a, version, {"k": f"old{version}"})
    store = b.get_store(2)
    store.put("k", "retried")
    original = files_module.StateFileWriter.commit

    def publish_then_snapshot(self, *args, **kwargs):
        if self.kind == "delta":
            a.do_maintenance()  # all of it between the retry's removal and its rename
            assert "3.snapshot" in state_files(tmp_path)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(files_module.StateFileWriter, "commit", publish_then_snapshot)
    store.commit()
    monkeypatch.undo()
    assert "3.snapshot" not in state_files(tmp_path)
    assert dict(_provider(tmp_path).get_read_store(3).items()) == {"k": "retried"}


RACER = textwrap.dedent(
    """
    import os, sys, time
    from extagg.memory import UnifiedMemoryManager
    from extagg.state import StateStoreProvider
    from extagg.state.errors import ConcurrentCommitError
    directory, name, go = sys.argv[1], sys.argv[2], sys.argv[3]
    provider = StateStoreProvider(directory, memory_manager=UnifiedMemoryManager("64m"))
    store = provider.get_store(1)
    for i in range(2000):
        store.put((name, i), i)
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    try:
        print("won", store.commit(), flush=True)
    except ConcurrentCommitError as exc:
        assert len(provider.get_read_store(2)) == 2001, "the loser must see the winner's version"
        print("lost", flush=True)
    """
)


def test_two_processes_committing_the_same_version_one_wins(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    commit_version(_provider(directory), 0, {"base": 0})
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(directory), name, str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("p", "q")
    ]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    go.write_text("go")
    outcomes = sorted(proc.communicate(timeout=60)[0].split()[0] for proc in procs)
    assert [proc.returncode for proc in procs] == [0, 0]
    assert outcomes == ["lost", "won"]
    fresh = _provider(directory)
    state = dict(fresh.get_read_store(2).items())
    assert len(state) == 2001 and len({key[0] for key in state if key != "base"}) == 1
    assert temp_files(directory) == []


# ------------------------------------------------------------------ corrupt snapshots
def _history(directory: Path) -> tuple[StateStoreProvider, dict]:
    """Versions 1..6 with snapshots of 3 and 6; returns the provider and version 6's state."""
    provider = _provider(directory, min_deltas_for_snapshot=2, min_versions_to_retain=10)
    state: dict = {}
    for version in range(6):
        puts = {version: version, "last": version, (version, "x"): -version}
        commit_version(provider, version, puts, removes=[version - 2] if version >= 2 else [])
        state.update(puts)
        state.pop(version - 2, None)
        if version in (2, 5):
            provider.do_maintenance()
    assert {"3.snapshot", "6.snapshot"} <= set(state_files(directory))
    provider.close()
    return provider, state


def _corrupt(path: Path, where: str) -> None:
    if where == "first record":  # checksums fine, the value cannot be decoded (a foreign writer)
        records = list(StateFileReader(path))
        writer = StateFileWriter(path, SNAPSHOT if path.suffix == ".snapshot" else DELTA)
        for index, (key, value) in enumerate(records):
            writer.write(key, b"\x83" if index == 0 else value)
        writer.commit()
        return
    data = bytearray(path.read_bytes())
    if where == "truncated end":
        path.write_bytes(bytes(data[:-5]))
        return
    index = 3 if where == "header" else len(data) - 6
    data[index] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["header", "body", "first record"])
def test_a_corrupt_newest_snapshot_falls_back_to_an_older_one(
    tmp_path: Path, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, state = _history(tmp_path)
    bad = tmp_path / "6.snapshot"
    _corrupt(bad, where)
    with caplog.at_level(logging.WARNING, logger="extagg.state"):
        fresh = _provider(tmp_path)
        assert dict(fresh.get_read_store(6).items()) == state
        assert dict(_provider(tmp_path).iter_version(6)) == state
        assert fresh.merge_update(6, [("new", 1)], add) == 7
    assert dict(_provider(tmp_path).get_read_store(7).items()) == {**state, "new": 1}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and all(str(bad) in w and "corrupt" in w for w in warnings)
    assert "the snapshot of version 3 and deltas 4..6" in warnings[0]


@pytest.mark.parametrize("bad", ["key", "value"])
def test_a_record_that_cannot_be_decoded_is_a_corrupt_file_error_naming_its_file(
    tmp_path: Path, bad: str
) -> None:
    # checksums fine, the encoding not (a foreign or newer writer); in a merge of two files with
    # equal hashes, and as the first record: every reader names the file, never the directory
    from extagg.state.cli import main as state_main

    checkpoint = Checkpoint(tmp_path / "ckpt")
    operator = checkpoint.operator(0, num_partitions=1)
    provider = operator.provider(0)
    for batch in range(2):
        commit_version(provider, batch, {5: f"v{batch}", "other": batch})
        checkpoint.commit(batch)
    provider.close()
    delta = os.path.join(provider.directory, "2.delta")
    prefix = encode_key(5)[:8]
    writer = StateFileWriter(delta, DELTA)
    if bad == "key":
        writer.write(prefix + b"\x83\x00", encode_value("b"))  # unknown type tag 0x83
    else:
        writer.write(encode_key(5), b"\x83")
    writer.commit()
    readers = {
        "read_state": lambda: list(read_state(checkpoint.path)),
        "iter_version": lambda: list(operator.provider(0).iter_version(2)),
        "get_read_store": lambda: operator.provider(0).get_read_store(2),
        "merge_update": lambda: operator.provider(0).merge_update(2, [(5, "c")], add),
    }
    for name, read in readers.items():
        with pytest.raises(CorruptFileError, match="0x83") as info:
            read()
        assert info.value.path == delta, name
        assert prefix.hex() in str(info.value), name
    assert state_main(["show", str(checkpoint.path)]) != 0
    assert temp_files(provider.directory) == []


def test_a_corrupt_snapshot_without_an_older_chain_is_still_an_error(tmp_path: Path) -> None:
    _history(tmp_path)
    for version in (1, 2, 4):
        os.unlink(tmp_path / f"{version}.delta")  # what cleanup would have removed
    _corrupt(tmp_path / "6.snapshot", "header")
    with pytest.raises(CorruptFileError) as info:
        _provider(tmp_path).get_read_store(6)
    assert info.value.path == str(tmp_path / "6.snapshot")


# ------------------------------------------------------------------ killed commits
KILLED_COMMIT = textwrap.dedent(
    """
    import os, sys, time
    from extagg.state import Checkpoint
    real_fsync = os.fsync
    def hang(fd):
        print("fsync", flush=True)
        time.sleep(600)
    os.fsync = hang
    Checkpoint(sys.argv[1]).commit(0)
    """
)


def test_temp_files_of_a_commit_killed_in_commits_dir_go_on_the_next_open(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_COMMIT, str(checkpoint)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "fsync"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    left = temp_files(checkpoint / "commits")
    assert len(left) == 1, "the killed commit leaves its temp file"
    opened = Checkpoint(checkpoint)
    assert temp_files(checkpoint) == []
    assert opened.committed_batches() == []
    opened.commit(0)
    assert opened.committed_batches() == [0]


def test_temp_files_of_a_killed_metadata_write_go_on_the_next_open(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "ckpt")
    checkpoint.operator(0, name="op", num_partitions=1)
    meta_dir = os.path.dirname(checkpoint.metadata_path(0))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stale = os.path.join(meta_dir, f".metadata.{_host()}-{child.pid}-0123456789abcdef.tmp")
    Path(stale).write_bytes(b"partial")
    child.kill()
    child.wait()
    Checkpoint(tmp_path / "ckpt")
    assert not os.path.exists(stale)


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"garbage", "Expecting value"), (b'{"format": "x"}', "format is 'x'"),
     (b"\xff\xfe", "cannot read operator metadata")],
)  # fmt: skip
def test_a_damaged_operator_metadata_file_is_a_corrupt_file_error(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    """A garbage ``_metadata/metadata`` raised a plain ``ValueError``; the state's other
    files raise ``CorruptFileError`` naming the file (still a ``ValueError``)."""
    checkpoint = Checkpoint(tmp_path / "ckpt")
    checkpoint.operator(0, name="op", num_partitions=1)
    Path(checkpoint.metadata_path(0)).write_bytes(content)
    with pytest.raises(CorruptFileError) as info:
        Checkpoint(tmp_path / "ckpt").operator_metadata(0)
    assert info.value.path == checkpoint.metadata_path(0)
    assert reason in str(info.value)


def _host() -> str:
    """This host (and PID namespace) as state temp file names give it."""
    from extagg.state import atomic

    return atomic._HOST


# ------------------------------------------------------------------ NaN keys
def test_the_writer_cache_holds_one_nan_key_as_the_disk_does(tmp_path: Path) -> None:
    provider = _provider(tmp_path)
    store = provider.get_store(0)
    store.put(float("nan"), 1)
    store.put(float("nan"), 2)  # another NaN object: the same key on disk
    store.put(np.float64("nan"), 2)  # NumPy's NaN too (it failed the commit: one key on
    store.put(np.float32("nan"), 2)  # disk for several in memory, "not strictly ascending")
    store.put((1, float("nan")), "a")
    store.put((1, np.float64("nan")), "b")
    assert len(store) == 2
    assert store.commit() == 1
    cached = dict(provider.get_read_store(1).items())
    on_disk = dict(_provider(tmp_path).get_read_store(1).items())
    assert len(cached) == len(on_disk) == 2
    assert provider.get_read_store(1).get(float("nan")) == 2
    assert provider.get_read_store(1).get((1, math.nan)) == "b"
    follow = provider.get_store(1)
    follow.remove(float("nan"))
    follow.commit()
    for source in (provider, _provider(tmp_path)):
        [(key, value)] = list(source.get_read_store(2).items())
        assert key[0] == 1 and math.isnan(key[1]) and value == "b"


# ------------------------------------------------------------------ metadata under concurrency
def test_store_names_added_by_processes_at_once_are_all_recorded(tmp_path: Path) -> None:
    """Adding a store name read, changed and rewrote the operator's metadata unlocked:
    processes opening new stores at once lost each other's names (31 of 40 in a probe), and
    ``read_state(store_name=...)`` then said the store does not exist."""
    Checkpoint(tmp_path).operator(0, name="t", num_partitions=1)
    code = textwrap.dedent(
        """
        import sys, time
        from extagg.state import Checkpoint
        path, name, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
        op = Checkpoint(path).operator(0)
        while time.time() < start:
            pass
        op.add_store_name(name)
        """
    )
    start = time.time() + 2.0
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path), f"s{i}", str(start)])
        for i in range(6)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0] * 6
    names = Checkpoint(tmp_path).operator_metadata(0).store_names
    assert sorted(names) == ["default", *(f"s{i}" for i in range(6))]


def test_an_operator_opens_where_its_metadata_lock_cannot_be_made(
    tmp_path: Path, monkeypatch
) -> None:
    """A checkpoint one may only read (the lock file cannot be created) still opens."""
    import extagg.state.checkpoint as checkpoint_module

    cp = Checkpoint(tmp_path)
    cp.operator(0, name="t", num_partitions=1)
    real_open = os.open

    def no_lock(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.os, "open", no_lock)
    assert Checkpoint(tmp_path).operator(0).metadata.operator_name == "t"


@pytest.mark.parametrize("where", ["header", "truncated end"])
def test_read_state_and_state_show_fall_back_past_a_corrupt_snapshot(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    where: str,
) -> None:
    """The readers rebuild a version from an older chain as the provider does, rather than
    making a version its deltas still hold unreadable; a chosen snapshot is not replaced.
    A small snapshot is read through first: its truncated end (found after its first rows
    had gone out) raised, where ``get_store`` fell back."""
    from extagg.state import read_state
    from extagg.state.cli import main as state_main

    checkpoint = Checkpoint(tmp_path / "ckpt")
    operator = checkpoint.operator(0, num_partitions=1)
    provider = operator.provider(0, conf=StateStoreConf(min_deltas_for_snapshot=2))
    state: dict = {}
    for batch in range(6):
        puts = {f"k{batch}": batch, "last": batch}
        commit_version(provider, batch, puts)
        state.update(puts)
        if batch in (2, 5):
            provider.do_maintenance()
        checkpoint.commit(batch)
    provider.close()
    directory = Path(operator.provider(0).directory)
    assert {"3.snapshot", "6.snapshot"} <= set(state_files(directory))
    _corrupt(directory / "6.snapshot", where)
    with caplog.at_level(logging.WARNING, logger="extagg.state"):
        assert {row.key: row.value for row in read_state(checkpoint.path)} == state
        assert state_main(["show", str(checkpoint.path), "--format", "csv"]) == 0
    assert "last,5" in capsys.readouterr().out.replace("\r", "")
    assert any(
        "6.snapshot" in r.getMessage() and "corrupt" in r.getMessage() for r in caplog.records
    )
    with pytest.raises(CorruptFileError) as info:
        read_state(checkpoint.path, partition_id=0, snapshot_start_batch_id=5).to_list()
    assert info.value.path == str(directory / "6.snapshot")
