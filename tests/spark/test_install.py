"""extagg.spark.install(): the RDD API's own calls, with and without extagg, on a real local[2]."""

from __future__ import annotations

import operator
import sys
import time
from collections import Counter, defaultdict
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import extagg.spark as es
from extagg.generic.external_map import ExternalAppendOnlyMap
from extagg.spark.merger import ENGINE_SHARE, SparkMerger
from extagg.spark.partial import PartialCombiner

pytestmark = pytest.mark.spark


@contextmanager
def spark_setting(sc, key: str, value: str):
    """``key=value`` in the driver's conf (read by PySpark at each job) for the block."""
    conf = sc._conf
    old = conf.get(key, None)
    conf.set(key, value)
    try:
        yield
    finally:
        if old is None:
            conf._jconf.remove(key)
        else:
            conf.set(key, old)


def merger_in_stack() -> float | None:
    """Inside a worker: the memory (MiB) PySpark gave the extagg merger calling us (its engine
    accounts for ENGINE_SHARE of it), or None (stock)."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, SparkMerger):
            assert candidate.budget == int(candidate.memory_limit * 2**20 * ENGINE_SHARE)
            return candidate.memory_limit
        if isinstance(candidate, PartialCombiner):  # the map side folds in its own frames
            return candidate.budget.max_memory / 2**20 / ENGINE_SHARE
        if isinstance(candidate, ExternalAppendOnlyMap) and frame.f_back is not None:
            outer = frame.f_back.f_locals.get("self")
            if isinstance(outer, SparkMerger):
                return outer.memory_limit
        frame = frame.f_back
    return None


def passing_in_stack() -> bool | None:
    """Inside a worker: whether the groupByKey map side calling us passes records through
    uncombined (None: no extagg map side)."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, PartialCombiner):
            return candidate.passing
        frame = frame.f_back
    return None


def tagged(v):
    return (v, merger_in_stack())


def add_tagged(c, v):
    return (c[0] + v, c[1])


def merge_tagged(a, b):
    return (a[0] + b[0], a[1] if a[1] is not None else b[1])


def spill_totals(sc, group: str) -> tuple[int, int]:
    """(memory, disk) bytes spilled by the jobs of ``group``, from Spark's status store."""
    tracker = sc.statusTracker()
    store = sc._jsc.sc().statusStore()
    deadline = time.monotonic() + 10
    while True:
        stages = [
            s for j in tracker.getJobIdsForGroup(group) for s in tracker.getJobInfo(j).stageIds
        ]
        try:
            data = [store.lastStageAttempt(s) for s in stages]
            if all(d.status().toString() in ("COMPLETE", "SKIPPED") for d in data) or (
                time.monotonic() > deadline
            ):
                break
        except Exception:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)
    return sum(d.memoryBytesSpilled() for d in data), sum(d.diskBytesSpilled() for d in data)


def mixed_pairs(n: int, keys: int, seed: int = 3) -> list[tuple[object, int]]:
    import random

    rng = random.Random(seed)
    out: list[tuple[object, int]] = []
    for i in range(n):
        k = rng.randrange(keys)
        key = None if k == 0 else f"s{k}" if k % 3 == 0 else (k, "t") if k % 3 == 1 else k
        out.append((key, i % 97))
    return out


def _add_pairs(a, b):
    return (a[0] + b[0], a[1] + b[1])


def reference_groups(data):
    groups = defaultdict(list)
    for k, v in data:
        groups[k].append(v)
    return groups


def all_calls(rdd, quick: bool = False):
    """Every RDD call the drop-in covers, as comparable plain values."""
    if quick:  # one map-side and one group-by shuffle
        return {
            "aggregateByKey": dict(
                rdd.aggregateByKey((0, 0), lambda c, v: (c[0] + v, c[1] + 1), _add_pairs).collect()
            ),
            "groupByKey": dict(rdd.groupByKey(3).mapValues(sorted).collect()),
        }
    return {
        "reduceByKey": dict(rdd.reduceByKey(operator.add, 3).collect()),
        "foldByKey": dict(rdd.foldByKey(0, operator.add, 2).collect()),
        "aggregateByKey": dict(
            rdd.aggregateByKey(
                (0, 0), lambda c, v: (c[0] + v, c[1] + 1), lambda a, b: (a[0] + b[0], a[1] + b[1])
            ).collect()
        ),
        "combineByKey": dict(
            rdd.combineByKey(lambda v: [v], lambda c, v: [*c, v], lambda a, b: a + b)
            .mapValues(sorted)
            .collect()
        ),
        "groupByKey": dict(rdd.groupByKey(3).mapValues(sorted).collect()),
        "countByKey": dict(rdd.countByKey()),
    }


def test_every_call_equals_stock_while_spilling(spark_context):
    data = mixed_pairs(30_000, 8_000)
    rdd = spark_context.parallelize(data, 4)
    groups = reference_groups(data)
    # 1m workers: extagg's maps spill. (PySpark's own groupByKey fails when it spills keys of
    # mixed types, sorting them: the stock comparison below runs at the default 512m.)
    with spark_setting(spark_context, "spark.python.worker.memory", "1m"), es.installed():
        spark_context.setJobGroup("install-spill", "extagg merger, 1m workers")
        ours = all_calls(rdd)
        spark_context.setJobGroup("other", "other")
    memory_spilled, disk_spilled = spill_totals(spark_context, "install-spill")
    assert ours["reduceByKey"] == {k: sum(v) for k, v in groups.items()}
    assert ours["aggregateByKey"] == {k: (sum(v), len(v)) for k, v in groups.items()}
    assert ours["groupByKey"] == {k: sorted(v) for k, v in groups.items()}
    assert ours["countByKey"] == dict(Counter(k for k, _ in data))
    assert None in ours["groupByKey"]
    # the task metrics carry extagg's spills, as PySpark's own merger reports them
    assert memory_spilled > 0 and disk_spilled > 0
    # PySpark's own merger at its default budget gives the same answers
    assert not es.is_installed()
    assert all_calls(rdd) == ours


def test_workers_really_use_extagg_and_uninstall_restores(spark_context):
    rdd = spark_context.parallelize([(i % 7, 1) for i in range(700)], 2)
    with es.installed():
        assert es.is_installed()
        with_extagg = dict(rdd.combineByKey(tagged, add_tagged, merge_tagged).collect())
    assert not es.is_installed()
    stock = dict(rdd.combineByKey(tagged, add_tagged, merge_tagged).collect())
    assert {k: v[0] for k, v in with_extagg.items()} == {k: 100 for k in range(7)}
    assert all(v[1] is not None for v in with_extagg.values())
    assert {k: v[0] for k, v in stock.items()} == {k: 100 for k in range(7)}
    assert all(v[1] is None for v in stock.values())


@settings(
    max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pairs=st.lists(
        st.tuples(
            st.one_of(
                st.none(), st.integers(-5, 40), st.text("ab", max_size=3), st.tuples(st.booleans())
            ),
            st.integers(-1000, 1000),
        ),
        max_size=400,
    )
)
def test_random_pairs_same_as_stock(spark_context, pairs):
    """Every call the drop-in covers (reduceByKey, foldByKey, aggregateByKey, combineByKey,
    groupByKey, countByKey) over random pairs of mixed key types, None keys included, with
    and without install(); ours with 1m workers (the engines' smallest budget)."""
    rdd = spark_context.parallelize(pairs, 3)
    stock = all_calls(rdd)
    with spark_setting(spark_context, "spark.python.worker.memory", "1m"), es.installed():
        ours = all_calls(rdd)
    assert ours == stock
    groups = reference_groups(pairs)
    assert ours["reduceByKey"] == {k: sum(v) for k, v in groups.items()}
    assert ours["countByKey"] == {k: len(v) for k, v in groups.items()}


def test_budget_reaches_the_worker_from_each_setting(spark_context):
    sc = spark_context
    rdd = sc.parallelize([(1, 1), (2, 2)], 1)

    def budgets():
        with es.installed():
            out = rdd.combineByKey(tagged, add_tagged, merge_tagged).collect()
        return {round(v[1]) for _, v in out}

    with spark_setting(sc, "spark.python.worker.memory", "40m"):
        assert budgets() == {36}  # the map side gets 90%, as PySpark's own combineByKey
        # 60 MiB for the executor's Python, shared by the 2 task slots of local[2]
        with spark_setting(sc, "spark.executor.pyspark.memory", "60m"):
            assert budgets() == {27}
            with spark_setting(sc, "spark.python.worker.memory", "20m"):
                assert budgets() == {18}


@pytest.mark.parametrize(
    ("settings_", "master", "expected_mib"),
    [
        ({}, "local[2]", 512),
        ({"spark.python.worker.memory": "1g"}, "local[2]", 1024),
        ({"spark.executor.pyspark.memory": "600m"}, "local[3]", 200),
        ({"spark.executor.pyspark.memory": "2048"}, "local[1]", 512),  # MiB without a unit
        (
            {"spark.executor.pyspark.memory": "4g", "spark.executor.cores": "8"},
            "yarn",
            512,
        ),
        (
            {
                "spark.executor.pyspark.memory": "1g",
                "spark.executor.cores": "8",
                "spark.task.cpus": "2",
            },
            "spark://h:7077",
            256,
        ),
    ],
)
def test_worker_budget_from_settings(settings_, master, expected_mib):
    assert es.worker_budget(settings_, master) == expected_mib * 2**20


def test_spills_inside_a_task_go_under_spark_local_dirs(spark_context):
    def spill_here(it):
        import os

        from extagg import Aggregator, ExternalAppendOnlyMap

        emap = ExternalAppendOnlyMap(
            Aggregator(lambda v: v, operator.add, operator.add), memory="4m", force_spill_every=10
        )
        emap.insert_all((i, 1) for i in range(100))
        files = list(emap.spill_files)
        emap.close()
        yield os.environ.get("SPARK_LOCAL_DIRS", ""), files

    [(local_dirs, files)] = spark_context.parallelize([0], 1).mapPartitions(spill_here).collect()
    roots = [d for d in local_dirs.split(",") if d]
    assert roots and files
    assert all(any(f.startswith(root + "/") for root in roots) for f in files)


def test_dataframe_where_an_rdd_belongs(spark_context):
    from pyspark.sql import SparkSession

    df = SparkSession.builder.getOrCreate().createDataFrame([(1, 2)], ["k", "v"])
    with pytest.raises(TypeError, match=r"DataFrame.*extagg\.spark\.aggregate"):
        es.combine_by_key(df, lambda v: v, operator.add, operator.add)


def test_worker_without_extagg_names_the_fix(spark_context, tmp_path):
    # a sitecustomize on the workers' PYTHONPATH makes `import extagg` fail there, as on an
    # executor where the package was never installed; the driver still has it
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'extagg' or name.startswith('extagg.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Hide())\n"
    )
    env = spark_context.environment
    env["PYTHONPATH"] = str(tmp_path)
    try:
        rdd = spark_context.parallelize([(1, 1), (2, 2)], 2)
        with es.installed(), pytest.raises(Exception) as info:
            rdd.reduceByKey(operator.add).collect()
        # the same workers run stock PySpark fine: only extagg is missing there
        assert sorted(rdd.reduceByKey(operator.add).collect()) == [(1, 1), (2, 2)]
    finally:
        del env["PYTHONPATH"]
    message = str(info.value)
    assert "cannot import extagg" in message
    assert "spark.submit.pyFiles" in message


def test_group_by_key_of_one_key_bigger_than_the_budget(spark_context):
    # 300k values of one key (~10 MiB as Python objects) through 1 MiB workers
    data = spark_context.parallelize(range(300_000), 4).map(lambda i: ("big" if i % 10 else i, i))
    with spark_setting(spark_context, "spark.python.worker.memory", "1m"), es.installed():
        out = dict(
            data.groupByKey(2)
            .mapValues(
                lambda r: (len(r), type(r.data).__name__, getattr(r.data, "on_disk", 0), sum(r))
            )
            .filter(lambda kv: kv[0] == "big" or kv[0] < 50)
            .collect()
        )
    n, kind, on_disk, total = out["big"]
    assert n == 270_000 and total == sum(i for i in range(300_000) if i % 10)
    assert kind == "SpilledValues" and on_disk > n // 2  # streamed back from disk
    assert out[0][0] == 1 and out[10][3] == 10


def test_group_by_key_without_map_side_combine_equals_stock(spark_context):
    """Many keys, each seldom twice within a map task's 1 MiB: extagg's groupByKey stops
    combining on the map side after its first generation (seen from inside the workers), and
    gives stock's answer."""
    n, keys = 60_000, 50_000
    rdd = spark_context.parallelize(range(n), 2).map(lambda i: ((i * 7919) % keys, i))
    probed = rdd.map(lambda kv: (kv[0], (kv[1], passing_in_stack())))
    with spark_setting(spark_context, "spark.python.worker.memory", "1m"), es.installed():
        ours = dict(probed.groupByKey(3).mapValues(sorted).collect())
    flags = Counter(flag for values in ours.values() for _, flag in values)
    assert flags[True] > n // 2 and flags[False] > 0 and set(flags) == {True, False}
    stock = dict(rdd.groupByKey(3).mapValues(sorted).collect())
    assert {k: [v for v, _ in values] for k, values in ours.items()} == stock


def test_partition_by_gives_stock_partitions_and_partitioner(spark_context):
    """While installed, ``partitionBy`` (extagg writes the buckets) puts the same records in
    the same order in every partition, and the partitioners compare equal to PySpark's."""
    data = [*mixed_pairs(20000, 3000), (2**70, 1), (-1, 2), (-(2**63), 3), (2**63 - 1, 4)]
    rdd = spark_context.parallelize(data, 3)
    stock = rdd.partitionBy(4)
    stock_parts = stock.glom().collect()
    with es.installed():
        ours = rdd.partitionBy(4)
        ours_parts = ours.glom().collect()
        assert ours.partitionBy(4) is ours  # already partitioned so: PySpark's own shortcut
        reduced = ours.reduceByKey(operator.add, 4)
        assert reduced.partitioner == stock.partitioner
        custom = rdd.partitionBy(4, lambda k: 0).glom().collect()  # PySpark's own path
    assert ours.partitioner == stock.partitioner
    assert ours_parts == stock_parts
    assert [len(p) for p in custom] == [len(data), 0, 0, 0]


@pytest.mark.parametrize("kind", ["int", "str"])
def test_typed_keys_spilling_same_as_stock(spark_context, kind):
    """reduceByKey(add) / (max) over int or str keys: the typed fold on both sides of the
    shuffle (1m workers: the map side hands combiners on, the reduce side spills)."""
    n, keys = 60_000, 20_000

    def record(i):
        k = (i * 7919) % keys
        return (k if kind == "int" else f"k{k}", i % 1000)

    rdd = spark_context.parallelize(range(n), 4).map(record)
    stock = {
        "add": dict(rdd.reduceByKey(operator.add, 3).collect()),
        "max": dict(rdd.reduceByKey(max, 3).collect()),
    }
    with spark_setting(spark_context, "spark.python.worker.memory", "1m"), es.installed():
        spark_context.setJobGroup(f"typed-{kind}", "typed keys")
        ours = {
            "add": dict(rdd.reduceByKey(operator.add, 3).collect()),
            "max": dict(rdd.reduceByKey(max, 3).collect()),
        }
        spark_context.setJobGroup("other", "other")
    assert ours == stock
    assert len(ours["add"]) == keys
    _, disk_spilled = spill_totals(spark_context, f"typed-{kind}")
    assert disk_spilled > 0


@pytest.mark.parametrize("values", ["int", "float"])
def test_sums_from_zero_typed_same_as_stock(spark_context, values):
    """foldByKey(0, add) and aggregateByKey((0, 0), sum and count) fold typed on both sides
    (1m workers: hand-ons and spills) and give stock's answers, types and zero signs included:
    a key whose values are all -0.0 sums to 0.0 (``0 + -0.0``), as in PySpark."""
    n, keys = 60_000, 15_000

    def record(i):
        k = (i * 7919) % keys
        if k == 0:
            return (k, -0.0 if values == "float" else 0)
        return (k, (i % 1000) / 2 if values == "float" else i % 1000)

    rdd = spark_context.parallelize(range(n), 4).map(record)
    calls = {
        "fold": lambda r: r.foldByKey(0, operator.add, 3),
        "mean": lambda r: r.aggregateByKey(
            (0, 0), lambda c, v: (c[0] + v, c[1] + 1), lambda a, b: (a[0] + b[0], a[1] + b[1]), 3
        ),
    }
    stock = {name: dict(call(rdd).collect()) for name, call in calls.items()}
    with spark_setting(spark_context, "spark.python.worker.memory", "1m"), es.installed():
        ours = {name: dict(call(rdd).collect()) for name, call in calls.items()}
    assert ours == stock
    assert len(ours["fold"]) == keys
    for name in calls:  # types and the sign of zero too
        assert {k: repr(v) for k, v in ours[name].items()} == {
            k: repr(v) for k, v in stock[name].items()
        }
    assert repr(ours["fold"][0]) == ("0.0" if values == "float" else "0")


def test_keys_and_combiners_of_classes_the_workers_know_by_value_only(spark_context):
    """Classes of the driver's ``__main__`` (a script's, a notebook's) or local to a function
    reach the workers by value (PySpark's cloudpickle): plain ``pickle`` cannot name them, so
    a job keyed or combined by them failed at its first spill ("Can't pickle <class
    '__main__.UserId'>"); stock PySpark runs them."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class UserId:
        n: int

    class Stats:
        def __init__(self, v):
            self.n, self.s = 1, v

        def add(self, v):
            self.n, self.s = self.n + 1, self.s + v
            return self

        def merge(self, other):
            self.n, self.s = self.n + other.n, self.s + other.s
            return self

    data = [(UserId(i % 15_000), i) for i in range(45_000)]
    rdd = spark_context.parallelize(data, 3)
    with spark_setting(spark_context, "spark.python.worker.memory", "1m"), es.installed():
        spark_context.setJobGroup("by-value", "classes known by value, 1m workers")
        sums = dict(rdd.reduceByKey(operator.add, 2).collect())
        stats = rdd.map(lambda kv: (kv[0].n, kv[1])).combineByKey(Stats, Stats.add, Stats.merge)
        combined = {k: (c.n, c.s) for k, c in stats.collect()}
        groups = dict(rdd.groupByKey(2).mapValues(len).collect())
        spark_context.setJobGroup("other", "other")
    assert spill_totals(spark_context, "by-value")[1] > 0
    expected = defaultdict(int)
    for key, v in data:
        expected[key.n] += v
    assert {k.n: s for k, s in sums.items()} == expected
    assert combined == {k: (3, s) for k, s in expected.items()}
    assert {k.n: n for k, n in groups.items()} == dict.fromkeys(expected, 3)


def test_enum_keys_of_a_class_the_workers_know_by_value_only(spark_context):
    """An ``Enum`` of the driver's ``__main__`` compares by identity and its members come
    back as themselves from PySpark's cloudpickle, but plain ``pickle`` cannot name it in a
    worker: every call keyed by it failed with ``BadKeyError`` ("compare by identity")."""
    import enum

    class Color(enum.Enum):
        RED = 1
        BLUE = 2

    data = [(Color.RED if i % 3 else Color.BLUE, i) for i in range(30_000)]
    rdd = spark_context.parallelize(data, 3)
    stock = dict(rdd.reduceByKey(operator.add, 2).collect())
    with spark_setting(spark_context, "spark.python.worker.memory", "1m"), es.installed():
        ours = dict(rdd.reduceByKey(operator.add, 2).collect())
        counts = rdd.countByKey()
    assert {k.name: v for k, v in ours.items()} == {k.name: v for k, v in stock.items()}
    assert {k.name: v for k, v in counts.items()} == {"RED": 20_000, "BLUE": 10_000}
