"""Spillable as a base for a third collection: value lists per key (a spilling groupByKey).

The collection here is what a subclass has to write — its in-memory structure, its size
estimate, ``spill_collection``/``force_spill``/``collection_is_empty``/``release_collection`` —
everything else (budget, runs, merge memory, the forced-spill protocol, close) comes from the base.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Iterator
from typing import Any

import pytest

from extagg.errors import MemoryLimitError, UsageError
from extagg.hashing import order_hashes
from extagg.memory import Consumer, MemoryConsumer, UnifiedMemoryManager, task_memory_manager
from extagg.merge.heap import BlockSource, SortedBlockSource, merge_in_passes
from extagg.merge.objects import combine_object_pieces
from extagg.spill.blocks import ObjectBlock
from extagg.spill.codecs import OBJECT_CODEC
from extagg.spillable import Spillable
from tests.conftest import files_under

BYTES_PER_VALUE = 100  # a crude estimate: enough for a test of the base's protocol


class GroupByKey(Spillable[ObjectBlock]):
    """key -> list of values, spilled as hash-sorted runs and merged by list concatenation."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.initial_threshold = 16 * 1024
        self.groups: dict[Any, list[Any]] | None = {}
        self.values = 0

    def add_all(self, pairs: list[tuple[Any, Any]], chunk: int = 256) -> None:
        self.check_open("add after iteration")
        for start in range(0, len(pairs), chunk):
            with self.lock:
                self.maybe_spill(self.values * BYTES_PER_VALUE)
                assert self.groups is not None
                for key, value in pairs[start : start + chunk]:
                    self.groups.setdefault(key, []).append(value)
                self.values += len(pairs[start : start + chunk])
                self.elements_read += len(pairs[start : start + chunk])
                self.metrics.records_read += len(pairs[start : start + chunk])

    # the four hooks
    def collection_is_empty(self) -> bool:
        return not self.groups

    def spill_collection(self, size: int, reason: str) -> None:
        self.log_spill("in-memory groups", size, reason)
        self.runs.write("groups", OBJECT_CODEC, lambda w: w.write_sorted(self._sorted(), 512))
        self.metrics.memory_bytes_spilled += size
        self.groups, self.values = {}, 0

    def force_spill(self, trigger: Consumer) -> int:
        if self.phase != "open" or not self.groups:
            return 0
        before = self.used
        self.spill_collection(self.values * BYTES_PER_VALUE, f"forced by {trigger.name}")
        self.release_down_to(0)
        return before - self.used

    def release_collection(self) -> None:
        self.groups = None

    def _sorted(self) -> ObjectBlock:
        assert self.groups is not None
        keys = list(self.groups)
        hashes = order_hashes(keys)
        order = hashes.argsort(kind="stable")
        return ObjectBlock(
            hashes[order], [keys[i] for i in order], [self.groups[keys[i]] for i in order]
        )

    def __iter__(self) -> Iterator[tuple[Any, list[Any]]]:
        with self.lock:
            self.begin_reading("GroupByKey can be iterated once")
            if self.runs and self.groups:  # simplest: merge runs only, the groups spilled too
                self.spill_collection(self.values * BYTES_PER_VALUE, "the merge")
            memory = self._sorted() if self.groups else None
            self.groups = None
            sources: list[BlockSource[ObjectBlock]] = self.runs.take_sources()
            if memory is None:
                self.release_down_to(0)
        try:
            if memory is not None:
                sources.append(SortedBlockSource(memory, 512))
            fan_in, _ = self.reserve_merge_memory(
                max(1, self.runs.max_batch_bytes * 4), max(2, len(sources))
            )
            for block in merge_in_passes(
                sources,
                lambda pieces: combine_object_pieces(pieces, operator.add),
                fan_in=fan_in,
                write_run=lambda blocks: self.runs.write_merged(blocks, OBJECT_CODEC, 512),
            ):
                yield from zip(block.keys, block.values)
        finally:
            self.close()


def _pairs(n: int, keys: int, seed: int = 0) -> list[tuple[Any, Any]]:
    rng = random.Random(seed)
    return [(f"k{rng.randrange(keys)}", i) for i in range(n)]


def _expected(pairs: list[tuple[Any, Any]]) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = {}
    for k, v in pairs:
        out.setdefault(k, []).append(v)
    return out


def test_a_third_collection_spills_merges_and_cleans_up(spill_dir) -> None:
    pairs = _pairs(40_000, 3_000)
    mm = UnifiedMemoryManager("1m")
    g = GroupByKey(memory_manager=mm, spill_dirs=[str(spill_dir)], fan_in=2)
    g.add_all(pairs)
    assert g.metrics.spill_count >= 3 and len(g.spill_files) == g.metrics.num_spill_files
    assert g.metrics.peak_granted_bytes <= mm.max_memory
    got = {k: sorted(v) for k, v in g}
    assert got == _expected(pairs)
    assert g.metrics.merge_files >= 1  # more runs than the fan-in: runs merged into runs
    assert g.closed and g.used == 0 and mm.execution_memory_used == 0
    assert files_under(spill_dir) == []
    with pytest.raises(UsageError):
        g.add_all(pairs[:1])
    with pytest.raises(UsageError, match="once"):
        iter(g).__next__()


def test_another_consumer_forces_the_spill_through_the_base(spill_dir) -> None:
    mm = UnifiedMemoryManager("1m")
    tmm = task_memory_manager(mm, "t")
    with GroupByKey(memory_manager=tmm, spill_dirs=[str(spill_dir)]) as g:
        g.add_all(_pairs(5_000, 500))
        held = g.used
        assert held > 0 and g.metrics.spill_count == 0
        other = MemoryConsumer(tmm, "other")
        got = other.acquire_memory(mm.max_memory // 2 + held)
        assert g.used == 0 and g.metrics.spill_count == 1 and len(g.runs) == 1
        other.free_memory(got)
        assert sum(len(v) for _, v in g) == 5_000
    assert files_under(spill_dir) == []


def test_merge_memory_that_cannot_be_granted_is_a_memory_limit_error(spill_dir) -> None:
    mm = UnifiedMemoryManager("1m")
    g = GroupByKey(memory_manager=mm, spill_dirs=[str(spill_dir)])
    with g, pytest.raises(MemoryLimitError, match="cannot merge 3 sorted runs"):
        g.reserve_merge_memory(mm.max_memory, 3)
    assert g.closed and mm.execution_memory_used == 0
    assert files_under(spill_dir) == []
