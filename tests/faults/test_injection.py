"""Fail every write-side I/O operation of a workload in turn (SQLite's I/O-error test): a whole
spill + merge of each engine, and state commits with maintenance and the commit log. After each
run the invariant checker runs: nothing left on disk, grants back to zero, results equal to the
reference or a precise ExtaggError; for the state store, the last committed version reads back
as committed and a retry completes the job."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from extagg.errors import ExtaggError
from extagg.memory import UnifiedMemoryManager

from . import scenarios as sc
from .injector import FaultInjector


def _sweep(
    name: str,
    run: Callable[[str, UnifiedMemoryManager], Any],
    reference: Any,
    tmp_path: Path,
    tally: Callable[..., None],
) -> None:
    counting = FaultInjector()
    with counting.active():
        assert run(str(tmp_path / "count"), UnifiedMemoryManager("64m")) == reference
    assert counting.count > 10, counting.kinds
    injected = errors = 0
    for n in range(1, counting.count + 1):
        spill_dir = str(tmp_path / f"n{n}")
        mm = UnifiedMemoryManager("64m")
        injector = FaultInjector(fail_at=n)
        try:
            with injector.active():
                outcome: Any = run(spill_dir, mm)
        except Exception as exc:  # judged by the checker: must be a precise ExtaggError
            outcome = exc
        assert injector.fired is not None, f"operation {n} of {counting.count} never came"
        try:
            sc.check_engine_outcome(outcome, reference, spill_dir, mm)
        except AssertionError as exc:
            raise AssertionError(f"{name}: after failing {injector.fired}: {exc}") from None
        injected += 1
        errors += isinstance(outcome, ExtaggError)
        assert run(spill_dir, mm) == reference  # and the same budget and directory work again
    tally(name, io_points=counting.count, injected=injected, survived=injected, errors=errors)


def test_every_io_operation_of_a_generic_spill_and_merge(tmp_path: Path, tally) -> None:
    n = 3000 * sc.scale()
    reference = sc.generic_reference(n)
    _sweep(
        "generic spill+merge",
        lambda d, mm: sc.run_generic(d, mm, n),
        reference,
        tmp_path,
        tally,
    )


def test_every_io_operation_of_a_columnar_spill_and_merge(tmp_path: Path, tally) -> None:
    n = 4000 * sc.scale()
    reference = sc.columnar_reference(n)
    _sweep(
        "columnar spill+merge",
        lambda d, mm: sc.run_columnar(d, mm, n),
        reference,
        tmp_path,
        tally,
    )


def test_every_io_operation_of_state_commits_and_maintenance(tmp_path: Path, tally) -> None:
    batches = 6 * sc.scale()
    counting = FaultInjector()
    with counting.active():
        assert sc.run_state(str(tmp_path / "count"), UnifiedMemoryManager("64m"), batches) == (
            batches,
            batches - 1,
        )
    assert counting.count > 20, counting.kinds
    injected = errors = 0
    for n in range(1, counting.count + 1):
        root = str(tmp_path / f"n{n}")
        mm = UnifiedMemoryManager("64m", wait_timeout=5)
        injector = FaultInjector(fail_at=n)
        progress: list[int] = []
        try:
            with injector.active():
                sc.run_state(root, mm, batches, progress.append)
            failed = None
        except Exception as exc:
            failed = exc
        assert injector.fired is not None
        context = f"after failing {injector.fired}"
        if failed is not None:
            assert isinstance(failed, ExtaggError), f"{context}: not an ExtaggError: {failed!r}"
            assert root in str(failed), f"{context}: the error names no file: {failed}"
            errors += 1
        assert mm.storage_memory_used == 0 and mm.execution_memory_used == 0, context
        last_batch = progress[-1] if progress else None
        try:
            # a failed store commit publishes nothing; a failed commit-log write leaves the
            # version published but the batch uncommitted (a retry re-commits it)
            sc.check_state(root, None, last_batch)
            assert sc.run_state(root, UnifiedMemoryManager("64m"), batches)[1] == batches - 1
            sc.check_state(root, batches, batches - 1)
        except AssertionError as exc:
            raise AssertionError(f"{context}: {exc}") from None
        injected += 1
    tally(
        "state commit+maintenance",
        io_points=counting.count,
        injected=injected,
        survived=injected,
        errors=errors,
    )


def test_a_failing_commit_log_write_is_a_state_error_naming_the_file(tmp_path: Path) -> None:
    from extagg.state import Checkpoint, StateStoreCommitError

    checkpoint = Checkpoint(tmp_path / "ckpt")
    checkpoint.commit(0)
    injector = FaultInjector(fail_at=1)  # creating the commit file
    error = r"cannot commit batch 1 .*commits/1"
    with pytest.raises(StateStoreCommitError, match=error), injector.active():
        checkpoint.commit(1)
    assert injector.fired is not None and injector.fired.startswith("create")
    assert sc.temp_files(tmp_path) == []
    assert checkpoint.committed_batches() == [0]
    checkpoint.commit(1)
    assert checkpoint.committed_batches() == [0, 1]
