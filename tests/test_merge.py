"""The shared external merge, on object blocks (the columnar engine tests it on column blocks)."""

import operator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extagg.hashing import order_hashes
from extagg.merge.heap import (
    RunSource,
    SortedBlockSource,
    merge_in_passes,
    merge_sources,
    write_run_from,
)
from extagg.merge.objects import combine_object_pieces
from extagg.spill.blocks import ObjectBlock
from extagg.spill.codecs import OBJECT_CODEC
from extagg.spill.tempdir import SpillDirs

from .conftest import files_under


class Collide:
    """Keys whose order hashes collide: only ``__hash__`` decides the order hash."""

    def __init__(self, name, h):
        self.name, self.h = name, h

    def __hash__(self):
        return self.h

    def __eq__(self, other):
        return isinstance(other, Collide) and other.name == self.name

    def __repr__(self):
        return f"Collide({self.name!r}, {self.h})"


def sorted_block(mapping):
    keys = list(mapping)
    hashes = order_hashes(keys)
    order = np.argsort(hashes, kind="stable")
    return ObjectBlock(hashes[order], [keys[i] for i in order], [mapping[keys[i]] for i in order])


def merged_dict(blocks):
    out = {}
    for block in blocks:
        assert np.all(block.hashes[1:] >= block.hashes[:-1])
        for k, v in zip(block.keys, block.values):
            assert k not in out, f"key {k!r} emitted twice"
            out[k] = v
    return out


def reference(parts):
    total = {}
    for part in parts:
        for k, v in part.items():
            total[k] = total.get(k, 0) + v
    return total


key_strategy = st.one_of(
    st.integers(min_value=-5, max_value=30),
    st.sampled_from(["a", "b", "Aa", "BB"]),
    st.none(),
    st.builds(Collide, st.sampled_from(["x", "y", "z", "w"]), st.sampled_from([0, 1])),
)
parts_strategy = st.lists(
    st.dictionaries(key_strategy, st.integers(-100, 100), max_size=25), max_size=7
)


def combine(pieces):
    return combine_object_pieces(pieces, operator.add)


@given(parts=parts_strategy, batch=st.integers(1, 5))
def test_merge_of_memory_sources_equals_dict(parts, batch):
    sources = [SortedBlockSource(sorted_block(p), batch) for p in parts]
    assert merged_dict(merge_sources(sources, combine)) == reference(parts)


@given(parts=parts_strategy, batch=st.integers(1, 4), fan_in=st.integers(2, 3))
def test_multi_pass_merge_of_runs_equals_dict(tmp_path_factory, parts, batch, fan_in):
    spill_dir = tmp_path_factory.mktemp("spill")
    dirs = SpillDirs([spill_dir])
    sources = []
    for p in parts:
        source, _ = write_run_from(
            iter([sorted_block(p)]) if p else iter([]),
            path=dirs.new_path(),
            codec=OBJECT_CODEC,
            batch_size=batch,
            spill_dirs=dirs,
        )
        sources.append(source)
    passes = []

    def write_run(blocks):
        source, _ = write_run_from(
            blocks,
            path=dirs.new_path("merge"),
            codec=OBJECT_CODEC,
            batch_size=batch,
            spill_dirs=dirs,
        )
        return source

    out = merge_in_passes(
        sources, combine, fan_in=fan_in, write_run=write_run, on_pass=lambda n, r: passes.append(n)
    )
    assert merged_dict(out) == reference(parts)
    if len(parts) > fan_in:
        assert passes
    assert files_under(spill_dir) == []


def test_equal_hashes_spanning_batches_are_merged(tmp_path):
    a = {Collide(n, 0): 1 for n in "abcdef"}
    b = {Collide(n, 0): 10 for n in "cdefgh"}
    sources = [SortedBlockSource(sorted_block(a), 1), SortedBlockSource(sorted_block(b), 2)]
    assert merged_dict(merge_sources(sources, combine)) == reference([a, b])


def test_sources_are_closed_when_the_consumer_stops_early(tmp_path):
    dirs = SpillDirs([tmp_path])
    source, _ = write_run_from(
        iter([sorted_block({i: i for i in range(100)})]),
        path=dirs.new_path(),
        codec=OBJECT_CODEC,
        batch_size=10,
        spill_dirs=dirs,
    )
    gen = merge_sources([source, SortedBlockSource(sorted_block({1: 1}), 5)], combine)
    next(gen)
    gen.close()
    assert files_under(tmp_path) == []


def test_fan_in_must_be_at_least_two():
    with pytest.raises(ValueError, match="fan_in"):
        list(merge_in_passes([], combine, fan_in=1, write_run=lambda b: None))


def test_run_source_reads_lazily(tmp_path):
    dirs = SpillDirs([tmp_path])
    path = dirs.new_path()
    write_run_from(
        iter([sorted_block({i: i for i in range(30)})]),
        path=path,
        codec=OBJECT_CODEC,
        batch_size=10,
    )
    lazy = RunSource(path)
    assert lazy._reader is None
    assert lazy.next_min_hash() is not None
    lazy.close()


def test_combine_pieces_merges_equal_keys_in_source_order_and_keeps_collisions_apart():
    """Non-commutative combiner (concatenation): equal keys fold earlier-to-later source order;
    keys with equal hashes but unequal values stay apart, in groups of two and of many."""
    a, b, c = Collide("a", 7), Collide("b", 7), Collide("c", 7)
    pieces = [
        sorted_block({1: "1x", a: "a1", "s": "s1"}),
        sorted_block({1: "1y", b: "b2", "s": "s2"}),
        sorted_block({1: "1z", a: "a3", c: "c3"}),
        sorted_block({b: "b4", 2: "2w"}),
    ]
    out = combine_object_pieces(pieces, operator.add)
    assert np.all(out.hashes[1:] >= out.hashes[:-1])
    got = dict(zip(out.keys, out.values))
    assert len(got) == len(out.keys)  # every key once
    assert got == {1: "1x1y1z", a: "a1a3", b: "b2b4", c: "c3", "s": "s1s2", 2: "2w"}
    two = combine_object_pieces([sorted_block({a: "x"}), sorted_block({b: "y"})], operator.add)
    assert dict(zip(two.keys, two.values)) == {a: "x", b: "y"}
