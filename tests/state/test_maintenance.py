"""Maintenance: snapshots when due, cleanup of old files, errors logged, background threads."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from extagg.state import StateFileNotFoundError, StateStoreConf, read_change_feed

from .conftest import commit_version, state_files, temp_files


def expected_state(version: int) -> dict:
    """The state the helper below builds: keys 0..9, key k last written by batch <= version."""
    state = {}
    for batch in range(version):
        for key in range(batch % 3, 10, 3):
            state[key] = (batch, key)
        state.pop((batch * 7) % 10, None)
    return state


def run_batches(provider, versions: int, maintain: bool = True) -> None:
    for version in range(provider.latest_version(), versions):
        puts = {key: (version, key) for key in range(version % 3, 10, 3)}
        commit_version(provider, version, puts, removes=[(version * 7) % 10])
        if maintain:
            provider.do_maintenance()


def test_a_snapshot_is_written_once_more_than_min_deltas_have_accumulated(operator, mm):
    provider = operator.provider(
        0, conf=StateStoreConf(min_deltas_for_snapshot=3), memory_manager=mm
    )
    run_batches(provider, 3)
    assert not any(name.endswith(".snapshot") for name in state_files(provider.directory))
    run_batches(provider, 4)
    assert "4.snapshot" in state_files(provider.directory)
    provider.do_maintenance()  # nothing more to do
    run_batches(provider, 8)
    assert [n for n in state_files(provider.directory) if n.endswith(".snapshot")] == [
        "4.snapshot",
        "8.snapshot",
    ]
    provider.close()


def test_versions_still_load_after_deltas_before_a_snapshot_are_deleted(operator, mm):
    conf = StateStoreConf(min_deltas_for_snapshot=2)
    provider = operator.provider(0, conf=conf, memory_manager=mm)
    run_batches(provider, 6)
    snapshots = sorted(
        int(n.split(".")[0]) for n in state_files(provider.directory) if n.endswith(".snapshot")
    )
    assert snapshots == [3, 6]
    for version in range(1, 3):
        os.unlink(os.path.join(provider.directory, f"{version}.delta"))
    fresh = operator.provider(0, conf=conf, memory_manager=mm)
    for version in range(3, 7):
        assert dict(fresh.get_read_store(version).items()) == expected_state(version)
    try:
        fresh.get_read_store(2)
    except StateFileNotFoundError as error:
        assert "1.delta does not exist" in str(error)
    else:
        raise AssertionError("version 2 should need the deleted deltas")
    provider.close()
    fresh.close()


def test_cleanup_keeps_what_rebuilds_the_last_min_versions_to_retain(operator, mm, caplog):
    conf = StateStoreConf(min_deltas_for_snapshot=2, min_versions_to_retain=4)
    provider = operator.provider(0, conf=conf, memory_manager=mm)
    with caplog.at_level(logging.INFO, logger="extagg.state.provider"):
        run_batches(provider, 12)
    files = state_files(provider.directory)
    versions = sorted({int(name.split(".")[0]) for name in files})
    # last = 12, earliest to retain = 8, rebuilt from 6.snapshot: nothing older than 6 is kept
    assert versions[0] == 6
    assert "6.snapshot" in files
    assert "Deleted files older than version" in caplog.text
    fresh = operator.provider(0, conf=conf, memory_manager=mm)
    for version in range(8, 13):
        assert dict(fresh.get_read_store(version).items()) == expected_state(version)
    # a version maintenance removed: the error says so and where reading can start
    with pytest.raises(StateFileNotFoundError, match=r"1\.delta does not exist") as info:
        fresh.get_read_store(2)
    assert "maintenance removed the files before it" in str(info.value)
    assert "earliest version readable is 6 (batch 5)" in str(info.value)
    operator.checkpoint.commit(11)
    with pytest.raises(StateFileNotFoundError, match="the change feed can start at batch 5"):
        list(read_change_feed(operator.checkpoint.path, 0, operator_id=operator.operator_id))
    provider.close()
    fresh.close()


def test_maintenance_without_cached_versions_streams_the_snapshot(operator, mm):
    conf = StateStoreConf(min_deltas_for_snapshot=2, max_versions_in_memory=0)
    provider = operator.provider(0, conf=conf, memory_manager=mm)
    run_batches(provider, 5, maintain=False)
    provider.do_maintenance()
    assert "5.snapshot" in state_files(provider.directory)
    for version in range(1, 5):
        os.unlink(os.path.join(provider.directory, f"{version}.delta"))
    os.unlink(os.path.join(provider.directory, "5.delta"))
    assert dict(provider.get_read_store(5).items()) == expected_state(5)
    provider.close()


def test_maintenance_errors_are_logged_never_raised(operator, mm, caplog):
    conf = StateStoreConf(min_deltas_for_snapshot=1, min_versions_to_retain=1)
    provider = operator.provider(0, conf=conf, memory_manager=mm)
    run_batches(provider, 3, maintain=False)
    with open(os.path.join(provider.directory, "2.delta"), "r+b") as handle:
        handle.seek(20)
        handle.write(b"\xff\xff\xff")
    with caplog.at_level(logging.WARNING, logger="extagg.state.provider"):
        provider.do_maintenance()
    assert "Error in state maintenance (_do_snapshot)" in caplog.text
    assert "corrupt file" in caplog.text
    assert not any(n.endswith(".snapshot") for n in state_files(provider.directory))
    assert temp_files(provider.directory) == []
    os.unlink(os.path.join(provider.directory, "2.delta"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="extagg.state.provider"):
        provider.do_maintenance()
    assert "Error in state maintenance" in caplog.text
    provider.close()
    provider.do_maintenance()  # a closed provider does nothing


def test_maintenance_removes_temp_files_of_dead_writers(provider):
    commit_version(provider, 0, {"a": 1})
    stale = os.path.join(provider.directory, ".2.delta.otherhost-1-x.tmp")
    dead = os.path.join(provider.directory, f".2.delta.{_host()}-{_dead_pid()}-x.tmp")
    for path in (stale, dead):
        with open(path, "wb") as handle:
            handle.write(b"partial")
    provider.do_maintenance()
    assert temp_files(provider.directory) == [stale]  # another host's young file is left alone


def _host() -> str:
    from extagg.state import atomic as files

    return files._HOST


def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_maintenance_in_a_background_thread_while_batches_commit(operator, mm):
    conf = StateStoreConf(min_deltas_for_snapshot=1, min_versions_to_retain=3)
    provider = operator.provider(0, conf=conf, memory_manager=mm)
    stop = threading.Event()
    errors = []

    def maintain() -> None:
        while not stop.is_set():
            try:
                provider.do_maintenance()
            except BaseException as exc:  # do_maintenance must never raise
                errors.append(exc)

    thread = threading.Thread(target=maintain)
    thread.start()
    try:
        run_batches(provider, 30, maintain=False)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert temp_files(provider.directory) == []
    fresh = operator.provider(0, conf=conf, memory_manager=mm)
    for version in range(27, 31):
        assert dict(fresh.get_read_store(version).items()) == expected_state(version)
    provider.close()
    fresh.close()
