"""merge_update keeps memory bounded on a state of millions of keys, and equals the in-memory path.

Each path runs in its own process so its peak RSS is its own: the kernel's high-water mark
(VmHWM) is reset just before the update and read right after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    from extagg.hashing import hash_array
    from extagg.memory import UnifiedMemoryManager
    from extagg.state import StateStoreConf, StateStoreProvider

    directory, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    CHUNK = 65_536

    def hwm_kib():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])

    def rss_kib():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])

    def reset_peak():
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")

    def ordered(first, count):
        keys = np.arange(first, first + count, dtype=np.int64)
        return keys[np.argsort(hash_array(keys), kind="stable")]

    def pairs(keys, value):
        for start in range(0, len(keys), CHUNK):
            for key in keys[start:start + CHUNK].tolist():
                yield key, value

    def add(old, new):
        return old + new

    batches = [ordered(0, n), ordered(n // 2, n)]  # the second: half updates, half new keys
    mm = UnifiedMemoryManager("16m", wait_timeout=5)
    provider = StateStoreProvider(directory, conf=StateStoreConf(), memory_manager=mm)
    peaks = []
    for version, keys in enumerate(batches):
        baseline = rss_kib()
        reset_peak()
        if mode == "stream":
            provider.merge_update(version, pairs(keys, version + 1), add)
        else:
            store = provider.get_store(version)
            for key, value in pairs(keys, version + 1):
                old = store.get(key)
                store.put(key, value if old is None else add(old, value))
            store.commit()
        peaks.append((hwm_kib() - baseline) * 1024)
    print(json.dumps({"peaks": peaks, "metrics": provider.metrics.__dict__}))
    """
)


def run_child(directory, mode: str, n: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory), mode, str(n)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def files_of(directory) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as handle:
            out[name] = handle.read()
    return out


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_merge_update_of_millions_of_keys_in_bounded_memory(tmp_path):
    n = 1_500_000  # 2.25 million keys after the update
    streamed = run_child(tmp_path / "stream", "stream", n)
    in_memory = run_child(tmp_path / "memory", "memory", n)
    # the same files, byte for byte (1.delta: n keys; 2.delta: n changed keys)
    assert files_of(tmp_path / "stream") == files_of(tmp_path / "memory")
    for metrics in (streamed["metrics"], in_memory["metrics"]):
        assert metrics["num_keys"] == n + n // 2
    state_bytes = streamed["metrics"]["state_on_current_version_size_bytes"]
    assert state_bytes == (n + n // 2) * (17 + 9)  # int keys (8 + 9 bytes), int values (9)
    # the in-memory path holds the state (hundreds of MB); the streaming path a few buffers
    assert max(in_memory["peaks"]) > 150 * 1024 * 1024, in_memory["peaks"]
    assert max(streamed["peaks"]) < 32 * 1024 * 1024, streamed["peaks"]
