"""A process killed (SIGKILL) at random points while committing leaves every published version
intact; the next provider on the directory removes the dead writer's temp files."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from extagg.memory import UnifiedMemoryManager
from extagg.state import StateStoreConf, StateStoreProvider
from extagg.state.files import StateFileReader

from .conftest import temp_files

KEYS = 20_000
CONF = dict(min_deltas_for_snapshot=2, min_versions_to_retain=4)

CHILD = textwrap.dedent(
    f"""
    import sys
    from extagg.hashing import stable_hash
    from extagg.memory import UnifiedMemoryManager
    from extagg.state import StateStoreConf, StateStoreProvider

    directory, mode = sys.argv[1], sys.argv[2]
    provider = StateStoreProvider(
        directory, conf=StateStoreConf(**{CONF!r}), memory_manager=UnifiedMemoryManager("256m")
    )
    keys = sorted(range({KEYS}), key=stable_hash)
    print("ready", flush=True)
    while True:
        version = provider.latest_version()
        new = version + 1
        if mode == "stream":
            provider.merge_update(version, ((key, new) for key in keys), lambda old, c: c)
        else:
            store = provider.get_store(version)
            for key in keys:
                store.put(key, new)
            store.commit()
        provider.do_maintenance()
        print("committed", new, flush=True)
    """
)


def expected(version: int) -> dict:
    return {key: version for key in range(KEYS)} if version else {}


@pytest.mark.slow
def test_killed_commits_leave_published_versions_intact(tmp_path):
    directory = tmp_path / "store"
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    rng = random.Random(5)
    mm = UnifiedMemoryManager("256m", wait_timeout=5)
    killed_with_temp = 0
    for round_number in range(8):
        mode = "stream" if round_number % 2 else "memory"
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(directory), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
            time.sleep(rng.uniform(0.05, 1.5))
            if round_number >= 4:  # then kill inside a commit, whatever the machine's pace
                deadline = time.monotonic() + 10
                while not temp_files(directory) and time.monotonic() < deadline:
                    time.sleep(0.0005)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        assert child.returncode == -signal.SIGKILL, child.stderr.read()
        killed_with_temp += bool(temp_files(directory))
        # every published file is complete: renames are atomic
        for name in os.listdir(directory):
            if not name.startswith("."):
                list(StateFileReader(os.path.join(directory, name)))
        provider = StateStoreProvider(directory, conf=StateStoreConf(**CONF), memory_manager=mm)
        try:
            assert temp_files(directory) == []  # the dead writer's temp file is gone
            latest = provider.latest_version()
            assert dict(provider.get_read_store(latest).items()) == expected(latest)
            if latest >= 2:
                assert dict(provider.iter_version(latest - 1)) == expected(latest - 1)
        finally:
            provider.close()
    assert latest >= 4  # the children made progress between kills
    assert killed_with_temp >= 1  # at least one kill landed inside a commit
