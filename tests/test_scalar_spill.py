"""The general path's spills written from arrays (:func:`extagg.generic.typed_map.
scalar_sorted_rows`): when every key of a spilled map is a plain ``int`` (int64) or ``str`` and
every combiner a plain ``float`` or ``int``, the run is written from arrays gathered in
insertion order instead of pickling the objects in hash order. The result must be exactly the
object path's (same pairs, same order, same bits), the run must load as the same objects, and a
failed spill must put the same rows back."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import extagg.generic.external_map as EM
from extagg import Aggregator, ExternalAppendOnlyMap, SpillError
from extagg.collection import SizeTrackingAppendOnlyMap
from extagg.generic.typed_map import TypedSortedRows, scalar_sorted_rows
from tests.test_typed_path import INT64, exact, float_values, workloads

LAMBDAS = Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b)
KEEP_LAST = Aggregator(lambda v: v, lambda c, v: v, lambda a, b: b)


def run(pairs, agg, scalar, monkeypatch, **options):
    with monkeypatch.context() as patch:
        if not scalar:
            patch.setattr(EM, "scalar_sorted_rows", lambda *args: None)
        # the general path's spills (the lambdas of a sum would fold on the typed path)
        with ExternalAppendOnlyMap(agg, typed_path=False, **options) as m:
            m.insert_all(pairs)
            out = [(exact(k), exact(c)) for k, c in m.iterator()]
            return out, m.metrics.spill_count


@settings(max_examples=50, deadline=None)
@given(workloads(), st.sampled_from([1, 7, 64]), st.booleans())
def test_scalar_spills_equal_object_spills(pairs, every, keep_last):
    """Forced spills at the same records: the same pairs in the same order, bit for bit."""
    agg = KEEP_LAST if keep_last else LAMBDAS
    mp = pytest.MonkeyPatch()
    try:
        fast, fast_spills = run(pairs, agg, True, mp, memory="16m", force_spill_every=every)
        slow, slow_spills = run(pairs, agg, False, mp, memory="16m", force_spill_every=every)
    finally:
        mp.undo()
    assert fast == slow
    assert fast_spills == slow_spills


def gathered(keys, values):
    m = SizeTrackingAppendOnlyMap()
    m.fold(keys, values, lambda v: v, lambda c, v: v)
    int_keys = m.int_key_column()
    hashes, order, k, v = m.destructive_sort_order()
    return scalar_sorted_rows(hashes, order, k, v, int_keys), order, k, v


@settings(max_examples=100, deadline=None)
@given(
    st.one_of(
        st.lists(INT64, min_size=1, max_size=40),
        st.lists(st.one_of(st.text(max_size=8), st.text(min_size=256, max_size=260)), min_size=1),
    ),
    st.one_of(
        st.lists(INT64, min_size=40, max_size=40), st.lists(float_values, min_size=40, max_size=40)
    ),
)
def test_rows_load_as_the_objects_in_hash_order(keys, values):
    keys = list(dict.fromkeys(keys))
    values = values[: len(keys)]
    rows, order, k, v = gathered(keys, values)
    assert isinstance(rows, TypedSortedRows)
    loaded_keys, loaded_values = pickle.loads(rows.pickled_rows())
    positions = order.tolist()
    assert loaded_keys == [k[i] for i in positions]
    assert [exact(x) for x in loaded_values] == [exact(v[i]) for i in positions]
    back_keys, back_values = rows.lists()  # what a failed spill puts back
    assert back_keys == keys and [exact(x) for x in back_values] == [exact(x) for x in values]


@pytest.mark.parametrize(
    ("keys", "values"),
    [
        ([1, 2], [(1, 2), (3, 4)]),  # tuple combiners
        ([1, 2], [1.0, 2]),  # mixed combiner types
        ([1, 2], [True, False]),  # bools are not ints here
        ([1, 2], [1, 2**70]),  # beyond int64
        ([1, "a"], [1.0, 2.0]),  # mixed key types
        ([2**70, 1], [1.0, 2.0]),  # a key beyond int64
        ([(1,), (2,)], [1.0, 2.0]),  # tuple keys
        ([1.5, 2.5], [1.0, 2.0]),  # float keys
    ],
)
def test_other_rows_keep_the_object_path(keys, values):
    assert gathered(keys, values)[0] is None


def test_failed_scalar_spill_puts_the_rows_back(tmp_path, monkeypatch):
    import extagg.spill.runfile as runfile

    from .spill.test_runfile import FullDisk

    names = [f"user_{i}" for i in range(300)]
    m = ExternalAppendOnlyMap(LAMBDAS, typed_path=False, memory="16m", spill_dirs=[str(tmp_path)])
    m.insert_all((names[i % 300], float(i)) for i in range(1000))
    monkeypatch.setattr(runfile, "open_for_writing", lambda path: FullDisk(path, 50))
    with pytest.raises(SpillError):
        m.spill(1, "test")
    monkeypatch.undo()
    want: dict[str, float] = {}
    for i in range(1000):
        want[names[i % 300]] = want.get(names[i % 300], 0.0) + float(i)
    assert dict(m.iterator()) == want
    assert not list(tmp_path.iterdir())


def test_budget_spills_of_strings_and_ints_match_a_dict(tmp_path):
    rng = np.random.default_rng(7)
    names = [f"ü{i}\ud800" if i % 11 == 0 else f"user_{i}" for i in range(20_000)]
    picks = rng.integers(0, 20_000, 100_000).tolist()
    for pairs in (
        [(names[k], i % 1000) for i, k in enumerate(picks)],
        [(k * 2**44 - 2**62, float(i % 64) / 8) for i, k in enumerate(picks)],
    ):
        with ExternalAppendOnlyMap(
            LAMBDAS, typed_path=False, memory="2m", spill_dirs=[str(tmp_path)]
        ) as m:
            m.insert_all(pairs)
            got = dict(m.iterator())
            assert m.metrics.spill_count > 1
        want: dict = {}
        for k, v in pairs:
            want[k] = want[k] + v if k in want else v
        assert got == want
        assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "keys",
    [
        [f"user_{i}" for i in range(50)],
        ["", "a", "", "bb", "ccc", "", "d"],
        ["ascii", "more", "é", "x\ud800", "tail", "z"],  # non-ASCII in the second chunk
        ["é", "a"],
    ],
)
def test_str_keys_in_chunks(keys, monkeypatch):
    """The arena of a spill's str keys is built a few keys at a time; chunk boundaries (and a
    non-ASCII key in a later chunk) change nothing."""
    import extagg.generic.typed_map as TM

    monkeypatch.setattr(TM, "_ARENA_CHUNK", 3)
    values = [float(i) for i in range(len(keys))]
    keys = list(dict.fromkeys(keys))
    rows, order, k, v = gathered(keys, values[: len(keys)])
    loaded_keys, loaded_values = pickle.loads(rows.pickled_rows())
    assert loaded_keys == [k[i] for i in order.tolist()]
    assert loaded_values == [v[i] for i in order.tolist()]
    assert rows.lists() == (keys, values[: len(keys)])
