"""ExternalAppendOnlyMap against a plain-dict reference, with forced spills and every failure."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import weakref

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extagg import Aggregator, CorruptFileError, ExternalAppendOnlyMap, MemoryLimitError, SpillError
from extagg.hashing import order_hash
from extagg.memory import MemoryConsumer, UnifiedMemoryManager, task_memory_manager

from .conftest import files_under


class FixedHash:
    """Spark's FixedHashObject: equal by name, hash fixed to 0 or 1, so keys collide."""

    def __init__(self, name, h):
        self.name, self.h = name, h

    def __hash__(self):
        return self.h

    def __eq__(self, other):
        return isinstance(other, FixedHash) and other.name == self.name

    def __repr__(self):
        return f"FixedHash({self.name!r})"


class CollidingStr(str):
    """Different strings with equal Python hashes."""

    def __hash__(self):
        return 42


#: a sum written as PySpark jobs write it; these tests pass ``typed_path=False`` with it (the
#: general path: extagg.function_code recognises these lambdas and would fold them compiled)
SUM = Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b)


def list_aggregator():
    return Aggregator(lambda v: [v], lambda c, v: [*c, v], lambda a, b: a + b)


def reference(pairs, agg=SUM):
    out = {}
    for k, v in pairs:
        out[k] = agg.merge_value(out[k], v) if k in out else agg.create_combiner(v)
    return out


def run(pairs, agg=SUM, **options):
    options.setdefault("typed_path", False)  # SUM's lambdas would fold on the typed path
    with ExternalAppendOnlyMap(agg, **options) as emap:
        emap.insert_all(pairs)
        result = list(emap.iterator())
        return result, emap.metrics


keys = st.one_of(
    st.integers(),
    st.sampled_from([2**63 - 1, -(2**63), 2**64 - 1, 2**100]),
    st.text(max_size=5),
    st.none(),
    st.tuples(st.integers(0, 3), st.text(max_size=2)),
    st.builds(FixedHash, st.sampled_from("abcdefgh"), st.sampled_from([0, 1])),
    st.builds(CollidingStr, st.sampled_from(["Aa", "BB", "C", "dd"])),
)
values = st.one_of(st.integers(-1000, 1000), st.none().map(lambda _: 0))


@given(
    pairs=st.lists(st.tuples(keys, values), max_size=300),
    every=st.integers(1, 40),
    batch=st.integers(1, 7),
    fan_in=st.integers(2, 5),
)
def test_equals_dict_with_forced_spills(spill_dir, pairs, every, batch, fan_in):
    result, metrics = run(
        pairs,
        memory="16m",
        spill_dirs=[spill_dir],
        force_spill_every=every,
        batch_size=batch,
        fan_in=fan_in,
    )
    as_dict = dict(result)
    assert len(as_dict) == len(result), "a key was emitted twice"
    assert as_dict == reference(pairs)
    assert metrics.records_read == len(pairs)
    assert metrics.groups == len(result)
    assert files_under(spill_dir) == []


@given(
    pairs=st.lists(
        st.tuples(st.sampled_from([0, False, 0.0, -0.0, 1, True, 1.0, 2, 2.0]), values),
        max_size=60,
    ),
    every=st.sampled_from([None, 1, 2, 5]),
    fan_in=st.integers(2, 5),
)
def test_equal_keys_of_other_types_keep_the_key_seen_first(spill_dir, pairs, every, fan_in):
    """``0``, ``False`` and ``0.0`` are one key (equal, same hash): as in a dict, the group
    keeps the key object seen first, whichever runs the records spilled to and however many
    merge passes combine them."""
    result, _ = run(
        pairs, memory="16m", spill_dirs=[spill_dir], force_spill_every=every, fan_in=fan_in
    )
    first_seen: dict = {}
    for k, _ in pairs:
        first_seen.setdefault(k, k)
    assert sorted((repr(k), type(k).__name__) for k, _ in result) == sorted(
        (repr(k), type(k).__name__) for k in first_seen.values()
    )


@given(pairs=st.lists(st.tuples(st.integers(0, 50), st.integers()), max_size=200))
def test_combiners_called_like_combine_by_key(spill_dir, pairs):
    # with list combiners every value must appear exactly once, and within one map in order
    result, _ = run(
        pairs, list_aggregator(), memory="16m", spill_dirs=[spill_dir], force_spill_every=7
    )
    got = dict(result)
    want = reference(pairs, list_aggregator())
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in want.items()}


def test_none_keys_and_values(spill_dir):
    pairs = [(None, None), (1, None), (None, 5), (None, None)]
    agg = list_aggregator()
    result, _ = run(pairs, agg, memory="16m", spill_dirs=[spill_dir], force_spill_every=1)
    assert sorted(dict(result)[None], key=str) == sorted([None, 5, None], key=str)
    assert dict(result)[1] == [None]


def test_output_order_is_deterministic(spill_dir):
    pairs = [(f"k{(i * 37) % 500}", 1) for i in range(3000)]
    first_seen = list(dict.fromkeys(k for k, _ in pairs))
    for every in (None, 100):
        for ordered in (False, True):
            emap = ExternalAppendOnlyMap(
                SUM, typed_path=False, memory="16m", spill_dirs=[spill_dir], force_spill_every=every
            )
            emap.insert_all(pairs)
            result = list(emap.iterator(ordered=ordered))
            keys = [k for k, _ in result]
            if ordered or every is not None:  # the merge order: ascending key hash
                hashes = [order_hash(k) for k in keys]
                assert hashes == sorted(hashes)
            else:  # nothing spilled: insertion order
                assert keys == first_seen
            assert dict(result) == reference(pairs)
            assert (emap.metrics.spill_count > 0) == (every is not None)


def test_forced_spill_during_unordered_iteration(spill_dir):
    mm = UnifiedMemoryManager(max_memory="64m")
    emap = ExternalAppendOnlyMap(BOX, memory_manager=mm, spill_dirs=[spill_dir])
    other = MemoryConsumer(task_memory_manager(mm))
    emap.insert_all((i, 1) for i in range(200_000))
    it = emap.iterator()
    first = [(k, c.v) for k, c in (next(it) for _ in range(10))]
    unread = weakref.ref(emap._reading.values[-1])
    assert emap.spill(1 << 20, other) > 0
    gc.collect()
    assert unread() is None, "the in-memory rows are still referenced after a forced spill"
    rest = [(k, c.v) for k, c in it]
    got = dict(first + rest)
    assert len(got) == len(first) + len(rest) == 200_000
    assert got == {i: 1 for i in range(200_000)}
    assert files_under(spill_dir) == []


def test_one_key_holds_most_records(spill_dir):
    pairs = [("hot", 1)] * 20_000 + [(i, 1) for i in range(2_000)]
    result, metrics = run(pairs, memory="16m", spill_dirs=[spill_dir], force_spill_every=997)
    assert dict(result)["hot"] == 20_000
    assert len(result) == 2_001
    assert metrics.spill_count > 10


def test_many_runs_merge_in_passes(spill_dir):
    pairs = [(i % 300, 1) for i in range(6_000)]
    result, metrics = run(
        pairs, memory="16m", spill_dirs=[spill_dir], force_spill_every=50, fan_in=4, batch_size=16
    )
    assert dict(result) == {i: 20 for i in range(300)}
    assert metrics.merge_passes >= 2
    assert metrics.merge_files > 0


def test_metrics_are_zero_without_spills_and_positive_with(spill_dir):
    pairs = [(i, i) for i in range(1000)]
    _, quiet = run(pairs, memory="64m", spill_dirs=[spill_dir])
    assert quiet.spill_count == quiet.disk_bytes_spilled == quiet.memory_bytes_spilled == 0
    assert quiet.num_spill_files == 0 and quiet.records_read == 1000
    assert quiet.peak_memory_bytes > 0
    _, loud = run(pairs, memory="64m", spill_dirs=[spill_dir], force_spill_every=100)
    assert loud.spill_count >= 9 and loud.num_spill_files == loud.spill_count
    assert (
        loud.disk_bytes_spilled > 0 and loud.memory_bytes_spilled > 0 and loud.raw_bytes_spilled > 0
    )


def test_real_budget_spills_without_the_knob(spill_dir, caplog):
    pairs = ((i % 200_000, float(i)) for i in range(600_000))
    with caplog.at_level(logging.INFO, logger="extagg"):
        result, metrics = run(pairs, memory="8m", spill_dirs=[spill_dir])
    assert len(result) == 200_000
    assert sum(v for _, v in result) == sum(float(i) for i in range(600_000))
    assert metrics.spill_count >= 2
    assert metrics.peak_granted_bytes <= 8 * 2**20
    spill_lines = [
        r.getMessage() for r in caplog.records if "spilling in-memory map of" in r.getMessage()
    ]
    assert len(spill_lines) == metrics.spill_count
    assert (
        "MiB to disk (1 time so far)" in spill_lines[0]
        or "KiB to disk (1 time so far)" in spill_lines[0]
    )


def test_iterator_is_destructive_and_single_use(spill_dir):
    emap = ExternalAppendOnlyMap(
        SUM, typed_path=False, memory="16m", spill_dirs=[spill_dir], force_spill_every=3
    )
    emap.insert_all((i, 1) for i in range(10))
    it = emap.iterator()
    assert len(list(it)) == 10
    assert list(it) == []  # exhausted twice
    with pytest.raises(RuntimeError, match="only be called once"):
        emap.iterator()
    with pytest.raises(RuntimeError, match="after calling iterator"):
        emap.insert(1, 1)
    assert files_under(spill_dir) == []


def test_a_map_closed_before_reading_says_so(spill_dir):
    """After close() (no iterator called), insert said "after calling iterator" and
    iterator() "should only be called once"."""
    emap = ExternalAppendOnlyMap(SUM, memory="16m", spill_dirs=[spill_dir])
    emap.insert(1, 1)
    emap.close()
    for call in (lambda: emap.insert(1, 1), emap.iterator):
        with pytest.raises(RuntimeError, match=r"ExternalAppendOnlyMap-\d+ is closed: close\(\)"):
            call()


def test_iter_protocol(spill_dir):
    with ExternalAppendOnlyMap(SUM, typed_path=False, memory="16m", spill_dirs=[spill_dir]) as emap:
        emap.insert("a", 1)
        emap.insert("a", 2)
        assert dict(emap) == {"a": 3}


def shared_map(spill_dir, **options):
    mm = UnifiedMemoryManager(max_memory="64m")
    emap = ExternalAppendOnlyMap(
        SUM, typed_path=False, memory_manager=mm, spill_dirs=[spill_dir], **options
    )
    other = MemoryConsumer(task_memory_manager(mm))
    return emap, other


def test_forced_spill_before_iteration(spill_dir):
    emap, other = shared_map(spill_dir)
    assert emap.spill(1 << 20, other) == 0  # nothing to spill yet
    emap.insert_all((i, 1) for i in range(5000))
    freed = emap.spill(1 << 20, other)
    assert freed > 0 and emap.used == 0
    assert emap.metrics.num_spill_files == 1
    assert emap.spill(1 << 20, emap) == 0  # never spills for itself
    emap.insert_all((i, 1) for i in range(5000))
    assert dict(emap.iterator()) == {i: 2 for i in range(5000)}
    emap.close()


class Box:
    """A combiner that can be weakly referenced, to see whether the map still holds it."""

    __slots__ = ("__weakref__", "v")

    def __init__(self, v):
        self.v = v

    def __reduce__(self):
        return (Box, (self.v,))


BOX = Aggregator(Box, lambda c, v: Box(c.v + v), lambda a, b: Box(a.v + b.v))


def test_forced_spill_during_iteration_drops_the_map(spill_dir):
    mm = UnifiedMemoryManager(max_memory="64m")
    emap = ExternalAppendOnlyMap(BOX, memory_manager=mm, spill_dirs=[spill_dir], batch_size=100)
    other = MemoryConsumer(task_memory_manager(mm))
    emap.insert_all((i, 1) for i in range(5000))
    emap.spill(1 << 20, other)
    emap.insert_all((i, 1) for i in range(5000))
    it = emap.iterator()
    first = [(k, c.v) for k, c in (next(it) for _ in range(10))]
    unread = weakref.ref(emap._reading.block.values[-1])
    freed = emap.spill(1 << 20, other)
    assert freed > 0
    gc.collect()
    assert unread() is None, "the in-memory map is still referenced after a forced spill"
    rest = [(k, c.v) for k, c in it]
    assert dict(first + rest) == {i: 2 for i in range(5000)}
    assert files_under(spill_dir) == []


def test_unhashable_key_names_its_type(spill_dir):
    with ExternalAppendOnlyMap(SUM, typed_path=False, memory="16m", spill_dirs=[spill_dir]) as emap:
        with pytest.raises(TypeError, match="list"):
            emap.insert([1, 2], 1)
        with pytest.raises(TypeError, match="dict"):
            emap.insert_all([(1, 1), ({"a": 1}, 1)])


def test_bad_records_are_reported(spill_dir):
    with (
        ExternalAppendOnlyMap(SUM, typed_path=False, memory="16m", spill_dirs=[spill_dir]) as emap,
        pytest.raises(TypeError, match="pairs"),
    ):
        emap.insert_all([(1, 2, 3)])


def test_unserialisable_value_raises_spill_error_and_map_stays_usable(spill_dir):
    agg = Aggregator(lambda v: [v], lambda c, v: [*c, v], lambda a, b: a + b)
    emap = ExternalAppendOnlyMap(agg, memory="16m", spill_dirs=[spill_dir], force_spill_every=4)
    emap.insert_all([(1, 1), (2, 2), ("x", lambda: 0), (3, 3)])
    with pytest.raises(SpillError, match="key of type str"):
        emap.insert(4, 4)
    assert files_under(spill_dir) == []
    emap.close()


def test_disk_full_raises_names_directory_and_map_stops_taking_input(spill_dir, monkeypatch):
    import extagg.spill.runfile as runfile

    from .spill.test_runfile import FullDisk

    emap = ExternalAppendOnlyMap(
        SUM, typed_path=False, memory="16m", spill_dirs=[spill_dir], force_spill_every=100
    )
    emap.insert_all((i, 1) for i in range(100))
    monkeypatch.setattr(runfile, "open_for_writing", lambda path: FullDisk(path, 50))
    with pytest.raises(SpillError) as err:
        emap.insert_all((i, 1) for i in range(100, 200))
    assert str(spill_dir) in str(err.value) and err.value.bytes_needed > 0
    assert files_under(spill_dir) == []
    monkeypatch.undo()  # space is back, but the map folded nothing past its grant: it says so
    with pytest.raises(
        SpillError, match="takes no more input after an earlier SpillError"
    ) as again:
        emap.insert(300, 1)
    assert again.value.__cause__ is err.value
    # exactly the records counted were folded (the chunk of the failed spill was not)
    assert emap.metrics.records_read == 100
    assert dict(emap.iterator()) == {i: 1 for i in range(100)}
    assert files_under(spill_dir) == []


@pytest.mark.parametrize("ordered", [False, True])
def test_disk_full_in_a_forced_spill_during_iteration_loses_nothing(
    spill_dir, monkeypatch, ordered
):
    """The unread rows stay in memory when their forced move to disk fails."""
    import extagg.spill.runfile as runfile
    from extagg.generic.memory_rows import UnsortedMemoryRows

    from .spill.test_runfile import FullDisk

    monkeypatch.setattr(UnsortedMemoryRows, "CHUNK", 500)
    tmm = task_memory_manager(UnifiedMemoryManager(max_memory="64m"), "full")
    other = MemoryConsumer(tmm, "other")
    with ExternalAppendOnlyMap(
        SUM, typed_path=False, memory_manager=tmm, spill_dirs=[spill_dir], batch_size=500
    ) as emap:
        emap.insert_all((k % 5000, 1) for k in range(10_000))
        it = emap.iterator(ordered=ordered)
        seen = dict([next(it) for _ in range(10)])
        with monkeypatch.context() as patch:
            patch.setattr(runfile, "open_for_writing", lambda path: FullDisk(path, 50))
            with pytest.raises(SpillError):
                emap.spill(1, other)
        assert files_under(spill_dir) == []
        for k, c in it:
            assert k not in seen
            seen[k] = c
    assert seen == {k: 2 for k in range(5000)}


def test_corrupt_run_file_raises_corrupt_file_error(spill_dir):
    emap = ExternalAppendOnlyMap(
        SUM, typed_path=False, memory="16m", spill_dirs=[spill_dir], force_spill_every=500
    )
    emap.insert_all((i, 1) for i in range(2000))
    victim = emap.spill_files[0]
    with open(victim, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptFileError) as err:
        list(emap.iterator())
    assert err.value.path == victim
    assert files_under(spill_dir) == []


def test_files_removed_after_exception_in_consumer_loop(spill_dir):
    emap = ExternalAppendOnlyMap(
        SUM, typed_path=False, memory="16m", spill_dirs=[spill_dir], force_spill_every=100
    )
    emap.insert_all((i, 1) for i in range(1000))
    assert files_under(spill_dir)
    with pytest.raises(ZeroDivisionError):
        for _ in emap.iterator():
            1 / 0  # noqa: B018
    emap.close()
    assert files_under(spill_dir) == []


def test_keyboard_interrupt_in_the_middle_of_a_merge_cleans_up(spill_dir):
    calls = {"n": 0}

    def merge(a, b):
        calls["n"] += 1
        if calls["n"] == 50:
            raise KeyboardInterrupt
        return a + b

    agg = Aggregator(lambda v: v, lambda c, v: c + v, merge)
    emap = ExternalAppendOnlyMap(agg, memory="16m", spill_dirs=[spill_dir], force_spill_every=200)
    emap.insert_all((i % 300, 1) for i in range(2000))
    with pytest.raises(KeyboardInterrupt):
        list(emap.iterator())
    assert files_under(spill_dir) == []
    assert emap.used == 0


def test_garbage_collected_map_removes_its_files(spill_dir):
    emap = ExternalAppendOnlyMap(
        SUM, typed_path=False, memory="16m", spill_dirs=[spill_dir], force_spill_every=100
    )
    emap.insert_all((i, 1) for i in range(1000))
    assert files_under(spill_dir)
    del emap
    gc.collect()
    assert files_under(spill_dir) == []


def test_close_releases_memory(spill_dir):
    mm = UnifiedMemoryManager(max_memory="64m")
    emap = ExternalAppendOnlyMap(SUM, typed_path=False, memory_manager=mm, spill_dirs=[spill_dir])
    emap.insert_all((i, i) for i in range(20_000))
    assert mm.execution_memory_used > 0
    emap.close()
    assert mm.execution_memory_used == 0


def test_bad_options_fail_clearly():
    with pytest.raises(ValueError, match="memory"):
        ExternalAppendOnlyMap(SUM, typed_path=False, memory="lots")
    with pytest.raises(TypeError, match="Aggregator"):
        ExternalAppendOnlyMap(lambda v: v)
    with pytest.raises(ValueError, match="batch_size"):
        ExternalAppendOnlyMap(SUM, typed_path=False, memory="1m", batch_size=0)
    with pytest.raises(ValueError, match="unknown spill compression 'gzip'"):
        ExternalAppendOnlyMap(SUM, memory="1m", compression="gzip")


def test_same_output_whatever_pythonhashseed(tmp_path):
    code = (
        "from extagg import Aggregator, ExternalAppendOnlyMap\n"
        "agg = Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b)\n"
        "m = ExternalAppendOnlyMap(agg, memory='16m', force_spill_every=97)\n"
        "m.insert_all((f'user{i % 300}', i) for i in range(3000))\n"
        "print(list(m.iterator()))\n"
    )
    outputs = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed, EXTAGG_SPILL_DIR=str(tmp_path))
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outputs.add(out.stdout)
    assert len(outputs) == 1


def test_numbers_equal_in_python_are_one_key_spilled_or_not(spill_dir):
    from decimal import Decimal
    from fractions import Fraction

    pairs = [
        (1, 10),
        (Decimal(1), 5),
        (0.5, 1),
        (Fraction(1, 2), 2),
        ((1, "a"), 1),
        ((1.0, "a"), 1),
        (complex(1, 0), 100),  # == 1: was a second key once spilled
        (np.complex64(0.5), 10),
        (np.longdouble(0.5), 20),  # its hash recursed until RecursionError at the spill
        (complex(1, 2), 7),
        (np.complex128(1 + 2j), 3),
    ]
    for every in (None, 1):
        result, _ = run(pairs, memory="16m", spill_dirs=[spill_dir], force_spill_every=every)
        assert dict(result) == {1: 115, 0.5: 33, (1, "a"): 2, 1 + 2j: 10}, every


def test_two_threads_sharing_one_task_do_not_deadlock(spill_dir):
    import threading

    from extagg.memory import TaskMemoryManager

    tmm = TaskMemoryManager(UnifiedMemoryManager(max_memory="4m"), "shared")
    results, errors = {}, []

    def work(seed):
        try:
            with ExternalAppendOnlyMap(
                SUM, typed_path=False, memory_manager=tmm, spill_dirs=[spill_dir]
            ) as emap:
                emap.insert_all(((i * 31 + seed) % 50_000, 1) for i in range(150_000))
                results[seed] = dict(emap.iterator())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors
    for seed in range(2):
        assert results[seed] == {k: 3 for k in range(50_000)}


def test_big_rows_are_spilled_in_small_batches_within_budget(spill_dir):
    pairs = ((f"{i:06d}" + "x" * 1800, 1) for i in range(6000))
    with ExternalAppendOnlyMap(SUM, typed_path=False, memory="2m", spill_dirs=[spill_dir]) as emap:
        emap.insert_all(pairs)
        assert emap.metrics.spill_count >= 2
        assert emap.runs.max_batch_bytes < 2 * 2**20 // 8
        assert sum(v for _, v in emap.iterator()) == 6000
        assert emap.metrics.peak_granted_bytes <= 2 * 2**20


@pytest.mark.parametrize("spilled_before", [False, True])
@pytest.mark.parametrize("ordered", [False, True])
def test_forced_spill_from_another_thread_during_iteration_repeats_nothing(
    spill_dir, monkeypatch, spilled_before, ordered
):
    """While another thread's forced spill writes the unread rows to a run, the iterating
    thread must not go on taking rows from memory (they would be yielded twice)."""
    import threading

    from extagg.generic.memory_rows import UnsortedMemoryRows

    monkeypatch.setattr(UnsortedMemoryRows, "CHUNK", 500)
    tmm = task_memory_manager(UnifiedMemoryManager(max_memory="256m"), "race")
    other = MemoryConsumer(tmm, "other")
    n = 20_000
    emap = ExternalAppendOnlyMap(
        SUM, typed_path=False, memory_manager=tmm, spill_dirs=[spill_dir], batch_size=500
    )
    emap.insert_all((k % n, 1) for k in range(2 * n))
    if spilled_before:
        emap.spill(1, other)
        emap.insert_all((k, 1) for k in range(n))
    real_move, writing, reader_went_on = emap._move_to_run, threading.Event(), threading.Event()

    def slow_move_to_run(block, trigger):
        # the rows to write are chosen; give the iterating thread the chance to read on
        writing.set()
        reader_went_on.wait(timeout=1)
        return real_move(block, trigger)

    emap._move_to_run = slow_move_to_run
    spiller = threading.Thread(target=lambda: emap.spill(1, other))
    seen: dict = {}
    with emap:
        for i, (k, c) in enumerate(emap.iterator(ordered=ordered)):
            if i == 100:
                spiller.start()
                assert writing.wait(timeout=10)
            elif i == 2100:  # several batches later: a read went past the spill
                reader_went_on.set()
            assert k not in seen, f"key {k} yielded twice"
            seen[k] = c
    spiller.join()
    assert seen == {k: 3 if spilled_before else 2 for k in range(n)}


@pytest.mark.parametrize("runs", [2, 3])
def test_keys_whose_equality_raises_one_way_round_merge_as_a_dict_does(spill_dir, runs):
    """``Decimal(1) == np.int64(1)`` raises TypeError (the reverse is True): a dict groups
    them, the merge of spilled runs crashed comparing them in the other order."""
    from decimal import Decimal

    import numpy as np

    records = [(np.int64(1), 1), (Decimal(1), 1), (1, 1)][:runs]
    with ExternalAppendOnlyMap(
        SUM, memory="4m", spill_dirs=[spill_dir], force_spill_every=1
    ) as emap:
        emap.insert_all(records)
        assert [(int(k), v) for k, v in emap.iterator()] == [(1, runs)]


@pytest.mark.parametrize("value_bytes", [1 << 20, 64 << 10])
def test_big_values_are_taken_in_chunks_the_budget_holds(spill_dir, value_bytes):
    """``insert_all`` took records 1 024 (typed path: 4 096) at a time before checking the
    budget: 300 values of 1 MiB under 16 MiB were all held at once, nothing spilled. The
    chunks are now sized by the records' measured size."""
    import tracemalloc

    budget = 16 << 20
    n = (300 << 20) // value_bytes
    records = ((i, bytes([i % 256]) * value_bytes) for i in range(n))  # one at a time
    tracemalloc.start()
    try:
        with ExternalAppendOnlyMap(
            Aggregator.reducing(lambda a, b: a + b), memory=budget, spill_dirs=[str(spill_dir)]
        ) as m:
            m.insert_all(records)
            peak = tracemalloc.get_traced_memory()[1]
            assert m.metrics.spill_count > 0
            assert m.metrics.peak_memory_bytes <= 1.1 * budget
            got = dict(m.iterator())
    finally:
        tracemalloc.stop()
    assert peak < 3 * budget, peak  # the map's share, a chunk and a spill's buffers
    assert len(got) == n and all(got[i] == bytes([i % 256]) * value_bytes for i in (0, n - 1))
    assert not files_under(spill_dir)


def test_records_of_256_kib_spill_and_merge_under_32_mib(spill_dir):
    """Run batches were 16 records at least: 16 records of 256 KiB (1/128 of the budget) made
    the merge's two read buffers need 32 MiB, ``MemoryLimitError`` 'a record too large for this
    budget'. A batch holds one big record now."""
    with ExternalAppendOnlyMap(
        Aggregator.reducing(lambda a, b: a + b), memory="32m", spill_dirs=[str(spill_dir)]
    ) as m:
        for i in range(600):
            m.insert(i % 500, bytes([i % 256]) * (256 << 10))
        assert m.metrics.spill_count > 1
        got = dict(m.iterator())
    assert len(got) == 500
    assert got[7] == bytes([7]) * (256 << 10) + bytes([507 % 256]) * (256 << 10)
    assert got[100] == bytes([100]) * (256 << 10)
    assert not files_under(spill_dir)


def test_a_hot_key_too_large_to_merge_is_named(spill_dir):
    """One key's list combiner grows to nearly the budget: the spill that makes it unmergeable
    names that key ('a record too large' named none, so the user could not find it)."""
    appending = Aggregator(lambda v: [v], lambda c, v: (c.append(v), c)[1], lambda a, b: a + b)
    m = ExternalAppendOnlyMap(appending, memory="32m", spill_dirs=[str(spill_dir)])
    with m, pytest.raises(MemoryLimitError, match=r"the record of key 'hot', [\d.]+ MiB"):
        m.insert_all(("hot", i * 1000 + 10**6) for i in range(3_000_000))
    assert not files_under(spill_dir)


@pytest.mark.parametrize(("records", "spills"), [(5_000, 0), (5_001, 1), (6_000, 1), (20_000, 3)])
def test_force_spill_every_spills_after_each_n_records(records, spills):
    """``force_spill_every=N`` spills every N records, as Spark's
    ``numElementsForceSpillThreshold`` does (the N-th record's successor finds N read): the
    check came between chunks of 4 096 records, so 6 000 records at N = 5 000 never spilled,
    and 20 000 spilled twice."""
    import operator

    general = Aggregator(lambda v: v, lambda a, b: a + b, lambda a, b: a + b)
    for aggregator in (Aggregator.reducing(operator.add), general):
        with ExternalAppendOnlyMap(aggregator, memory="64m", force_spill_every=5_000) as m:
            m.insert_all((i % 100, 1) for i in range(records))
            assert m.metrics.spill_count == spills
            assert sum(v for _, v in m.iterator()) == records
