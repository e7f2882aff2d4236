"""Default sizing: psutil, cgroup v1/v2 limits (fake files), EXTAGG_MEMORY, precedence."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from extagg.memory import UnifiedMemoryManager
from extagg.memory.sizing import (
    MIN_DEFAULT_BUDGET,
    RESERVED_SYSTEM_MEMORY,
    available_memory,
    cgroup_memory_available,
    default_memory_budget,
    resolve_memory_budget,
)

MiB = 2**20
GiB = 2**30


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_v2(root: Path, own: str, levels: dict[str, tuple[str, int, int]]) -> Path:
    """cgroup v2 tree; ``levels`` maps a cgroup path to (memory.max, current, inactive_file)."""
    write(root / "cgroup.controllers", "cpu memory\n")
    for path, (limit, current, inactive) in levels.items():
        directory = root.joinpath(*[p for p in path.split("/") if p])
        write(directory / "memory.max", f"{limit}\n")
        write(directory / "memory.current", f"{current}\n")
        write(directory / "memory.stat", f"anon 1\ninactive_file {inactive}\nactive_file 5\n")
    proc = root.parent / "proc-self-cgroup"
    write(proc, f"0::{own}\n")
    return proc


def fake_v1(root: Path, own: str, levels: dict[str, tuple[int, int, int]]) -> Path:
    for path, (limit, usage, inactive) in levels.items():
        directory = (root / "memory").joinpath(*[p for p in path.split("/") if p])
        write(directory / "memory.limit_in_bytes", f"{limit}\n")
        write(directory / "memory.usage_in_bytes", f"{usage}\n")
        write(directory / "memory.stat", f"inactive_file 7\ntotal_inactive_file {inactive}\n")
    write(root / "cpu" / "cpu.shares", "1024\n")
    proc = root.parent / "proc-self-cgroup"
    write(proc, f"9:name=systemd:/\n4:memory:{own}\n1:cpu,cpuacct:/\n0::/\n")
    return proc


def test_cgroup_v2_limit_minus_working_set(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    proc = fake_v2(root, "/", {"/": (str(2 * GiB), GiB, 256 * MiB)})
    assert cgroup_memory_available(root, proc) == 2 * GiB - (GiB - 256 * MiB)


def test_cgroup_v2_nested_smallest_headroom_wins(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    proc = fake_v2(
        root,
        "/kubepods/pod1/app",
        {
            "/kubepods": (str(8 * GiB), 6 * GiB, 0),  # 2 GiB left for the whole pod group
            "/kubepods/pod1": ("max", GiB, 0),
            "/kubepods/pod1/app": (str(4 * GiB), GiB, 0),  # 3 GiB left here
        },
    )
    assert cgroup_memory_available(root, proc) == 2 * GiB


def test_cgroup_v2_max_means_no_limit(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    proc = fake_v2(root, "/app", {"/app": ("max", GiB, 0)})
    assert cgroup_memory_available(root, proc) is None


def test_cgroup_v2_path_missing_falls_back_to_root(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    proc = fake_v2(root, "/", {"/": (str(GiB), 100 * MiB, 0)})
    write(proc, "0::/host/path/not/mounted\n")
    assert cgroup_memory_available(root, proc) == GiB - 100 * MiB


def test_cgroup_v1_limit_minus_usage(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    proc = fake_v1(root, "/docker/abc", {"/docker/abc": (GiB, 400 * MiB, 100 * MiB)})
    assert cgroup_memory_available(root, proc) == GiB - 300 * MiB


def test_cgroup_v1_unlimited_and_usage_above_limit(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    proc = fake_v1(root, "/a", {"/": (9223372036854771712, GiB, 0), "/a": (2**62, 1, 0)})
    assert cgroup_memory_available(root, proc) is None
    proc = fake_v1(root, "/a", {"/a": (GiB, 2 * GiB, 0)})
    assert cgroup_memory_available(root, proc) == 0


def test_no_cgroup_memory_controller(tmp_path: Path) -> None:
    assert cgroup_memory_available(tmp_path / "nothing", tmp_path / "none") is None
    (tmp_path / "empty").mkdir()
    assert cgroup_memory_available(tmp_path / "empty", tmp_path / "none") is None


def test_garbage_files_are_ignored(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    proc = fake_v2(root, "/app", {"/app": (str(GiB), 0, 0)})
    write(root / "app" / "memory.max", "lots\n")
    write(proc, "garbage\n")
    assert cgroup_memory_available(root, proc) is None


def test_available_memory_takes_the_cgroup_when_lower(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    proc = fake_v2(root, "/", {"/": (str(512 * MiB), 0, 0)})
    assert available_memory(root, proc) == min(512 * MiB, psutil.virtual_memory().available)
    huge = fake_v2(root, "/", {"/": (str(2**59), 0, 0)})
    assert available_memory(root, huge) >= psutil.virtual_memory().available * 0.5


def test_default_budget_formula(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    proc = fake_v2(root, "/", {"/": (str(1300 * MiB), 0, 0)})
    assert default_memory_budget(cgroup_root=root, proc_cgroup=proc) == int(
        (1300 * MiB - RESERVED_SYSTEM_MEMORY) * 0.6
    )
    assert default_memory_budget(cgroup_root=root, proc_cgroup=proc, fraction=0.5) == 500 * MiB
    with pytest.raises(ValueError, match="fraction"):
        default_memory_budget(cgroup_root=root, proc_cgroup=proc, fraction=0)


def test_default_budget_floor(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "cg"
    proc = fake_v2(root, "/", {"/": (str(200 * MiB), 0, 0)})
    assert default_memory_budget(cgroup_root=root, proc_cgroup=proc) == MIN_DEFAULT_BUDGET
    assert "using the minimum budget" in caplog.text


def test_precedence_explicit_env_default(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "cg"
    proc = fake_v2(root, "/", {"/": (str(1300 * MiB), 0, 0)})
    expected_default = int((1300 * MiB - RESERVED_SYSTEM_MEMORY) * 0.6)
    assert resolve_memory_budget(cgroup_root=root, proc_cgroup=proc) == expected_default
    monkeypatch.setenv("EXTAGG_MEMORY", "256m")
    assert resolve_memory_budget(cgroup_root=root, proc_cgroup=proc) == 256 * MiB
    assert resolve_memory_budget("1g", cgroup_root=root, proc_cgroup=proc) == GiB
    assert resolve_memory_budget(12345) == 12345
    manager = UnifiedMemoryManager.auto(cgroup_root=root, proc_cgroup=proc)
    assert manager.max_memory == 256 * MiB
    monkeypatch.delenv("EXTAGG_MEMORY")
    manager = UnifiedMemoryManager.auto(0.3, 9, cgroup_root=root, proc_cgroup=proc)
    assert (manager.max_memory, manager.storage_fraction, manager.wait_timeout) == (
        expected_default,
        0.3,
        9.0,
    )


def test_empty_environment_variable_means_unset(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "cg"
    proc = fake_v2(root, "/", {"/": (str(1300 * MiB), 0, 0)})
    monkeypatch.setenv("EXTAGG_MEMORY", "  ")
    assert resolve_memory_budget(cgroup_root=root, proc_cgroup=proc) == int(
        (1300 * MiB - RESERVED_SYSTEM_MEMORY) * 0.6
    )


@pytest.mark.parametrize("bad", ["lots", "-1g", "0", "5 parsecs", "1.2.3m"])
def test_bad_environment_size_names_the_variable(monkeypatch, bad: str) -> None:
    monkeypatch.setenv("EXTAGG_MEMORY", bad)
    with pytest.raises(ValueError, match="EXTAGG_MEMORY"):
        resolve_memory_budget()


@pytest.mark.parametrize("bad", ["", "much", "-3m", "0", "1 MB extra"])
def test_bad_explicit_size_names_max_memory(bad: str) -> None:
    with pytest.raises(ValueError, match="max_memory"):
        resolve_memory_budget(bad)


def test_this_machine_gives_a_positive_budget() -> None:
    assert resolve_memory_budget() >= MIN_DEFAULT_BUDGET
