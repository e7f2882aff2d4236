"""The pieces install() puts in the Python workers, in-process against PySpark's own functions:
the map-side partial combine, the closures it sees through, and partitionBy's bucket writer."""

from __future__ import annotations

import io
import operator
import os
import pickle
import struct
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg.spark.merger import SparkMerger, recognise
from extagg.spark.partial import PartialCombiner
from extagg.spark.shuffle import partition_numbers, write_buckets


class _Captured(Exception):
    pass


def pyspark_function(build, method: str = "mapPartitions") -> Any:
    """The worker-side function a PySpark RDD method builds (``build(rdd)``), on a stand-in
    RDD that stops the method where it hands the function to ``mapPartitions``."""
    from pyspark.core import rdd as R
    from pyspark.serializers import CPickleSerializer

    captured: list[Any] = []

    class Stub:
        partitioner = None
        combineByKey = R.RDD.combineByKey
        reduceByKey = R.RDD.reduceByKey
        aggregateByKey = R.RDD.aggregateByKey
        foldByKey = R.RDD.foldByKey
        groupByKey = R.RDD.groupByKey
        partitionBy = R.RDD.partitionBy

        class ctx:
            serializer = _unbatched_serializer = CPickleSerializer()

        _jrdd_deserializer = ctx.serializer

        def _defaultReducePartitions(self) -> int:
            return 3

        def _memory_limit(self) -> float:
            return 8.0

        def mapPartitions(self, f, preservesPartitioning=False):
            captured.append(f)
            raise _Captured

        def mapPartitionsWithIndex(self, f, preservesPartitioning=False):
            captured.append(f)
            raise _Captured

    try:
        build(Stub())
    except _Captured:
        pass
    return captured[0]


def aggregator_of(build) -> Any:
    fn = pyspark_function(build)
    return dict(zip(fn.__code__.co_freevars, fn.__closure__))["agg"].cell_contents


def add_pair(c, v):
    return (c[0] + v, c[1] + 1)


def merge_pair(a, b):
    return (a[0] + b[0], a[1] + b[1])


CALLS = {
    "reduceByKey": lambda r: r.reduceByKey(operator.add),
    "reduceByKey.max": lambda r: r.reduceByKey(max),
    "reduceByKey.lambda": lambda r: r.reduceByKey(lambda a, b: a + b),
    "aggregateByKey": lambda r: r.aggregateByKey((0, 0), add_pair, merge_pair),
    "aggregateByKey.list": lambda r: r.aggregateByKey([], lambda c, v: [*c, v], operator.add),
    "foldByKey": lambda r: r.foldByKey(0, operator.add),
    "groupByKey": lambda r: r.groupByKey(),
}


def reference(call: str, pairs: list[tuple[Any, int]]) -> dict[Any, Any]:
    groups: dict[Any, list[int]] = defaultdict(list)
    for k, v in pairs:
        groups[k].append(v)
    if call == "aggregateByKey":
        return {k: (sum(v), len(v)) for k, v in groups.items()}
    if call == "aggregateByKey.list" or call == "groupByKey":
        return {k: sorted(v) for k, v in groups.items()}
    if call == "reduceByKey.max":
        return {k: max(v) for k, v in groups.items()}
    return {k: sum(v) for k, v in groups.items()}


def map_then_reduce(call: str, pairs: list[tuple[Any, int]], memory_mib: float) -> dict:
    """The map side (extagg's partial combine) and a plain merge of its output by key."""
    agg = aggregator_of(CALLS[call])
    merger = SparkMerger(agg, memory_mib)
    merger.mergeValues(iter(pairs))
    out: dict[Any, Any] = {}
    for k, c in merger.items():
        out[k] = agg.mergeCombiners(out[k], c) if k in out else c
    if call in ("groupByKey", "aggregateByKey.list"):
        out = {k: sorted(v) for k, v in out.items()}
    return out


KEYS = st.one_of(
    st.integers(-50, 50),
    st.text("abc", max_size=3),
    st.none(),
    st.tuples(st.integers(0, 3)),
    st.booleans(),
    st.sampled_from([2**63 - 1, -(2**63), 2**64 + 5, -1, 1.5, -0.0]),
)


@settings(max_examples=25, deadline=None)
@given(
    call=st.sampled_from(sorted(CALLS)),
    pairs=st.lists(st.tuples(KEYS, st.integers(-1000, 1000)), max_size=3000),
)
def test_partial_combine_then_merge_equals_reference(call, pairs):
    assert map_then_reduce(call, pairs, 1) == reference(call, pairs)


@pytest.mark.parametrize("kind", ["int", "str", "mixed"])
@pytest.mark.parametrize("call", ["reduceByKey", "aggregateByKey", "groupByKey"])
def test_partial_combine_hands_on_early_at_a_small_budget(call, kind):
    """200k records over 60k keys do not fit 1 MiB: the combiners are handed on several
    times, keys repeat in the output, and the merged answer is still exact."""
    n, keys = 200_000, 60_000
    if kind == "int":
        pairs = [((i * 7919) % keys, i % 100) for i in range(n)]
    elif kind == "str":
        pairs = [(f"k{(i * 7919) % keys}", i % 100) for i in range(n)]
    else:
        pairs = [((i * 7919) % keys if i % 3 else f"k{i % keys}", i % 100) for i in range(n)]
    agg = aggregator_of(CALLS[call])
    seen = recognise(agg)
    combiner = PartialCombiner(
        seen.create, seen.merge, typed_op=seen.typed_op, lists=seen.group_by_key, memory=1 << 20
    )
    out: dict[Any, Any] = {}
    for k, c in combiner.combine(iter(pairs)):
        out[k] = agg.mergeCombiners(out[k], c) if k in out else c
    assert combiner.flushes > 0
    assert combiner.emitted > len(out)  # some keys were handed on more than once
    assert combiner.metrics.records_read == n
    if call == "groupByKey":
        out = {k: sorted(v) for k, v in out.items()}
    assert out == reference(call, pairs)
    assert combiner.closed


def test_recognise_sees_through_pyspark_closures():
    reduce_add = recognise(aggregator_of(CALLS["reduceByKey"]))
    assert reduce_add.typed_op is not None and reduce_add.merge is operator.add
    assert reduce_add.create(7) == 7
    # a lambda a, b: a + b is recognised by its code (extagg.function_code); others are not
    reduce_lambda = recognise(aggregator_of(CALLS["reduceByKey.lambda"]))
    assert reduce_lambda.typed_op == reduce_add.typed_op
    assert reduce_lambda.merge(2, 3) == 5 and reduce_lambda.merge.__name__ == "<lambda>"
    assert recognise(aggregator_of(lambda r: r.reduceByKey(lambda a, b: b + a))).typed_op is None
    assert recognise(aggregator_of(lambda r: r.reduceByKey(lambda a, b: a * b))).typed_op is None
    tuple_zero = recognise(aggregator_of(CALLS["aggregateByKey"]))
    assert tuple_zero.create(5) == (5, 1) and tuple_zero.merge is add_pair
    assert tuple_zero.create.__name__ == "create_from_zero"  # no deepcopy per key
    assert tuple_zero.typed_op is not None and tuple_zero.typed_from_zero  # sum and count
    assert tuple_zero.merge_combiners is merge_pair  # unwrapped: the reduce side folds typed
    fold_zero = recognise(aggregator_of(CALLS["foldByKey"]))
    assert fold_zero.typed_op == reduce_add.typed_op and fold_zero.typed_from_zero
    for build in (
        lambda r: r.foldByKey(0.0, operator.add),  # 0.0 + int is a float: not the typed sum
        lambda r: r.foldByKey(1, operator.add),
        lambda r: r.foldByKey(0, max),
        lambda r: r.aggregateByKey((0, 0.0), add_pair, merge_pair),
        lambda r: r.aggregateByKey((0, 0), lambda c, v: (c[0] + v, c[1] + 2), merge_pair),
        lambda r: r.aggregateByKey((0, 0), add_pair, lambda a, b: (a[0] + b[0], a[1])),
        lambda r: r.aggregateByKey(0, operator.add, max),
    ):
        assert recognise(aggregator_of(build)).typed_op is None
    list_zero = recognise(aggregator_of(CALLS["aggregateByKey.list"]))
    first, second = list_zero.create(1), list_zero.create(1)
    assert first == second == [1] and first is not second  # a mutable zero is still copied
    assert recognise(aggregator_of(CALLS["groupByKey"])).group_by_key


def test_stop_iteration_in_a_combine_function_fails_as_in_pyspark():
    from pyspark.errors import PySparkRuntimeError

    def bad(c, v):
        raise StopIteration("boom")

    agg = aggregator_of(lambda r: r.reduceByKey(bad))
    merger = SparkMerger(agg, 1)
    merger.mergeValues(iter([(1, 1), (1, 2)]))
    with pytest.raises(PySparkRuntimeError, match="STOP_ITERATION"):
        list(merger.items())


# ---------------------------------------------------------------------- partitionBy's buckets


@settings(max_examples=50, deadline=None)
@given(keys=st.lists(KEYS, max_size=300), partitions=st.integers(1, 7))
def test_partition_numbers_are_portable_hash(keys, partitions):
    import os

    from pyspark.core.rdd import portable_hash

    os.environ.setdefault("PYTHONHASHSEED", "0")
    assert partition_numbers(keys, partitions) == [portable_hash(k) % partitions for k in keys]


def test_partition_numbers_of_int64_edges():
    import os

    from pyspark.core.rdd import portable_hash

    os.environ.setdefault("PYTHONHASHSEED", "0")
    m = (1 << 61) - 1
    edges = [0, 1, -1, -2, m, m - 1, m + 1, -m, -m - 1, -m + 1, 2 * m, -2 * m, 2 * m + 1]
    edges += [2**63 - 1, -(2**63), -(2**63) + 1, 2**62, -(2**62)]
    for n in (1, 2, 3, 7, 200):
        assert partition_numbers(edges, n) == [portable_hash(k) % n for k in edges]


def decode(chunks: list[bytes]) -> dict[int, list[Any]]:
    from pyspark.serializers import read_long

    out: dict[int, list[Any]] = defaultdict(list)
    it = iter(chunks)
    for key in it:
        out[read_long(io.BytesIO(key))].extend(pickle.loads(next(it)))
    return dict(out)


@pytest.mark.parametrize("memory", [0.01, 8.0])
def test_bucket_writer_gives_pyspark_partition_contents_in_order(memory):
    """extagg's writer and PySpark's own ``add_shuffle_key`` (taken from ``partitionBy``) put
    the same records, in the same order, in every partition."""
    import os

    from pyspark.serializers import CPickleSerializer

    os.environ.setdefault("PYTHONHASHSEED", "0")
    records = [((i * 31) % 5000 if i % 4 else f"s{i % 700}", i) for i in range(30_000)]
    records += [(None, 1), ((1, None), 2), (2**70, 3), (-1, 4)]
    stock = pyspark_function(lambda r: r.partitionBy(5), "mapPartitionsWithIndex")
    ours = write_buckets(iter(records), 5, CPickleSerializer(), memory)
    assert decode(list(ours)) == decode(list(stock(0, iter(records))))


def test_worker_imports_stay_light():
    """``extagg.spark.install`` stays the function whatever was imported first, and the
    shuffle merger does not import the DataFrame path (pyarrow)."""
    import subprocess
    import sys

    code = (
        "import sys, extagg.spark as es, extagg.spark.install\n"
        "es.uninstall(); es.install(); es.uninstall()\n"
        "import extagg.spark.merger, extagg.spark.shuffle\n"
        "assert 'pyarrow' not in sys.modules, 'pyarrow imported'\n"
        "assert 'extagg.spark.dataframe' not in sys.modules\n"
        "assert callable(es.aggregate) and 'extagg.spark.dataframe' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_fewer_collections_restores_the_thresholds_when_the_last_block_ends():
    import gc

    from extagg.spark.partial import YOUNG_THRESHOLD, fewer_collections

    before = gc.get_threshold()
    first, second = fewer_collections(), fewer_collections()
    first.__enter__()
    assert gc.get_threshold()[0] == max(YOUNG_THRESHOLD, before[0])
    assert gc.get_threshold()[1:] == before[1:]
    second.__enter__()
    first.__exit__(None, None, None)  # interleaved, as suspended generators end
    assert gc.get_threshold()[0] == max(YOUNG_THRESHOLD, before[0])
    second.__exit__(None, None, None)
    assert gc.get_threshold() == before
    # a merger's generators leave them as they were, read to the end or dropped half-way
    agg = aggregator_of(CALLS["groupByKey"])
    merger = SparkMerger(agg, 1)
    merger.mergeValues(iter([(i % 50, i) for i in range(5000)]))
    items = merger.items()
    next(items)
    assert gc.get_threshold()[0] == max(YOUNG_THRESHOLD, before[0])
    items.close()
    assert gc.get_threshold() == before


def group_by_key_combiner(memory: int) -> PartialCombiner:
    seen = recognise(aggregator_of(CALLS["groupByKey"]))
    assert seen.group_by_key
    return PartialCombiner(seen.create, seen.merge, lists=True, memory=memory)


def test_group_by_key_stops_combining_when_it_does_not_pay():
    """Nearly every key once within the budget: after its first generation groupByKey's map
    side passes each record on as ``(k, [v])``, holding no memory, and the answer is exact."""
    n, keys = 100_000, 90_000
    pairs = [((i * 7919) % keys, i) for i in range(n)]
    combiner = group_by_key_combiner(1 << 20)
    out: dict[Any, list[int]] = defaultdict(list)
    pieces, held = 0, -1
    for k, values in combiner.combine(iter(pairs)):
        pieces += 1
        held = combiner.used  # the last piece is passed through: nothing held by then
        out[k].extend(values)
    assert combiner.passing and combiner.flushes == 1
    assert held == 0
    assert pieces == combiner.emitted > 0.9 * n  # about one piece per record
    assert combiner.metrics.records_read == n
    assert {k: sorted(v) for k, v in out.items()} == reference("groupByKey", pairs)
    assert combiner.closed


def test_group_by_key_keeps_combining_when_keys_repeat():
    """300 keys: each generation saves almost every piece, so the map side keeps combining
    (its generations are still handed on when the value lists outgrow the budget)."""
    n = 200_000
    pairs = [(f"k{i % 300}", i) for i in range(n)]
    combiner = group_by_key_combiner(1 << 20)
    out: dict[Any, list[int]] = defaultdict(list)
    for k, values in combiner.combine(iter(pairs)):
        out[k].extend(values)
    assert combiner.flushes > 0 and not combiner.passing
    assert combiner.emitted < n // 50
    assert {k: sorted(v) for k, v in out.items()} == reference("groupByKey", pairs)


def test_group_by_keeps_owned_lists_and_copies_the_callers():
    from extagg.spark.groupby import SpillingGroupBy

    first, other = [1], [2]
    owned = SpillingGroupBy(memory=1 << 20)
    owned.merge_pieces([("x", first), ("y", other), ("x", [3])], owned=True)
    got = dict(owned)
    assert got == {"x": [1, 3], "y": [2]} and got["x"] is first
    mine = [1]
    copied = SpillingGroupBy(memory=1 << 20)
    copied.merge_pieces([("x", mine), ("x", [2]), ("z", (5, 6))])
    assert dict(copied) == {"x": [1, 2], "z": [5, 6]} and mine == [1]


def test_group_by_key_worker_does_not_import_numba():
    """A worker that only runs groupByKey (both sides, spilling) never loads numba, the
    generic engine's kernels (~100 MiB of its RSS); reduceByKey's reduce side does."""
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        "import sys\n"
        f"sys.path.insert(0, {here!r})\n"
        "from test_partial import CALLS, aggregator_of\n"
        "from extagg.spark.merger import SparkGroupBy, SparkMerger\n"
        "agg = aggregator_of(CALLS['groupByKey'])\n"
        "m = SparkMerger(agg, 1)\n"
        "m.mergeValues(iter([(i % 20000, i) for i in range(60000)]))\n"
        "g = SparkGroupBy(agg, 1)\n"
        "g.mergeCombiners(m.items())\n"
        "assert sum(len(v) for _, v in g.items()) == 60000\n"
        "assert 'numba' not in sys.modules, 'numba imported by groupByKey'\n"
        "r = SparkMerger(aggregator_of(CALLS['aggregateByKey']), 1)\n"
        "r.mergeCombiners(iter([(1, (2, 1)), (1, (3, 1))]))\n"
        "assert list(r.items()) == [(1, (5, 2))] and 'numba' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("kind", ["int", "str"])
def test_typed_generations_are_handed_on_a_slice_at_a_time(monkeypatch, kind):
    """reduceByKey(add)'s typed fold hands each generation on in slices (a few Python objects
    beside the table at a time); keys repeat across generations and the merge is exact."""
    import extagg.spark.partial as partial

    monkeypatch.setattr(partial, "HAND_ON_SLICE", 1000)
    n, keys = 200_000, 60_000
    pairs = [((i * 7919) % keys if kind == "int" else f"k{(i * 7919) % keys}", i % 100)
             for i in range(n)]  # fmt: skip
    seen = recognise(aggregator_of(CALLS["reduceByKey"]))
    assert seen.typed_op is not None
    combiner = PartialCombiner(seen.create, seen.merge, typed_op=seen.typed_op, memory=1 << 20)
    out: dict[Any, int] = defaultdict(int)
    pieces = 0
    for k, c in combiner.combine(iter(pairs)):
        out[k] += c
        pieces += 1
    assert combiner.flushes > 1 and pieces == combiner.emitted > keys
    assert out == reference("reduceByKey", pairs)


FROM_ZERO_VALUES = st.one_of(
    st.integers(-(2**62), 2**62),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([-0.0, 0.0, 2**63 - 1, -(2**63)]),
)


@settings(max_examples=60, deadline=None)
@given(
    call=st.sampled_from(["aggregateByKey", "foldByKey", "aggregateByKey.lambdas"]),
    values_kind=st.sampled_from(["int", "float", "mixed"]),
    data=st.data(),
)
def test_sums_from_zero_fold_typed_exactly_as_python(call, values_kind, data):
    """``foldByKey(0, add)`` and ``aggregateByKey((0, 0), sum, count)`` on the typed fold:
    bit for bit what PySpark's own functions compute (``0 + -0.0`` is ``0.0``; an int sum
    leaving int64 and a float among ints leave the typed fold)."""
    values = {
        "int": st.integers(-(2**62), 2**62),
        "float": st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([-0.0]),
        "mixed": FROM_ZERO_VALUES,
    }[values_kind]
    pairs = data.draw(st.lists(st.tuples(st.integers(0, 30), values), max_size=2000))
    build = {
        "aggregateByKey": CALLS["aggregateByKey"],
        "foldByKey": CALLS["foldByKey"],
        "aggregateByKey.lambdas": lambda r: r.aggregateByKey(
            (0, 0), lambda c, v: (c[0] + v, c[1] + 1), lambda a, b: (a[0] + b[0], a[1] + b[1])
        ),
    }[call]
    agg = aggregator_of(build)
    seen = recognise(agg)
    assert seen.typed_op is not None and seen.typed_from_zero
    combiner = PartialCombiner(
        seen.create,
        seen.merge,
        typed_op=seen.typed_op,
        typed_from_zero=seen.typed_from_zero,
        memory=1 << 20,
    )
    ours: dict[Any, Any] = {}
    for k, c in combiner.combine(iter(pairs)):  # a key twice only after an int sum overflowed
        ours[k] = agg.mergeCombiners(ours[k], c) if k in ours else c
    stock: dict[Any, Any] = {}
    for k, v in pairs:  # PySpark's own functions, as its merger calls them
        stock[k] = agg.mergeValue(stock[k], v) if k in stock else agg.createCombiner(v)
    assert {k: _bits(c) for k, c in ours.items()} == {k: _bits(c) for k, c in stock.items()}


def _bits(value: Any) -> Any:
    """A value with its types and float bits (NaN payloads aside: which NaN an add returns is
    the compiler's choice of operand order)."""
    if isinstance(value, tuple):
        return tuple(_bits(v) for v in value)
    if type(value) is float:
        return ("nan",) if value != value else (float, struct.pack("<d", value))
    return (type(value), value)
