"""extagg's combineByKey on a real local Spark, against Spark's own combineByKey."""

from __future__ import annotations

import random

import pytest

from extagg.hashing import stable_hash
from extagg.spark import combine_by_key, combine_partition, spark_partition_func

pytestmark = pytest.mark.spark


def create(v):
    return (v, 1)


def merge_value(c, v):
    return (c[0] + v, c[1] + 1)


def merge_combiners(a, b):
    return (a[0] + b[0], a[1] + b[1])


def records(n, keys, seed=7):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randrange(keys)
        key = f"user-{k}" if k % 3 else (k, "x") if k % 2 else k
        out.append((key, rng.randrange(1000)))
    out.append((None, 5))
    return out


@pytest.mark.parametrize(
    ("memory", "force"),
    [("64m", None), ("2m", 500)],
    ids=["in-memory", "spilling"],
)
def test_combine_by_key_equals_spark(spark_context, memory, force):
    data = records(20_000, 3_000)
    rdd = spark_context.parallelize(data, 4)
    ours = combine_by_key(
        rdd,
        create,
        merge_value,
        merge_combiners,
        num_partitions=3,
        memory=memory,
        force_spill_every=force,
    )
    theirs = rdd.combineByKey(create, merge_value, merge_combiners, numPartitions=3)
    assert ours.getNumPartitions() == 3
    assert dict(ours.collect()) == dict(theirs.collect())
    assert len(ours.collect()) == len(dict(ours.collect()))


def test_partitions_follow_the_deterministic_hash(spark_context):
    data = [(f"k{i}", 1) for i in range(500)]
    rdd = spark_context.parallelize(data, 2)
    combined = combine_by_key(
        rdd, create, merge_value, merge_combiners, num_partitions=5, memory="8m"
    )
    for index, part in enumerate(combined.glom().collect()):
        for key, _ in part:
            assert stable_hash(key) % 5 == index
    assert spark_partition_func("k1") == stable_hash("k1")


def test_plain_partition_function_for_users_own_map_partitions(spark_context):
    data = [(i % 10, i) for i in range(1000)]
    rdd = spark_context.parallelize(data, 2)
    fn = combine_partition(create, merge_value, merge_combiners, memory="4m", force_spill_every=50)
    partials = rdd.mapPartitions(fn).collect()
    totals = {}
    for k, (s, n) in partials:
        t = totals.get(k, (0, 0))
        totals[k] = (t[0] + s, t[1] + n)
    assert totals == {k: (sum(range(k, 1000, 10)), 100) for k in range(10)}
    assert len(partials) == 20  # one combiner per key per partition


def test_unsupported_key_type_fails_the_job_clearly(spark_context):
    rdd = spark_context.parallelize([(frozenset([1]), 1)], 1)
    with pytest.raises(Exception, match="frozenset"):
        combine_by_key(rdd, create, merge_value, merge_combiners, memory="4m").collect()


def test_a_budget_below_the_engines_minimum_fails_on_the_driver(spark_context):
    from extagg import BudgetError

    rdd = spark_context.parallelize([(1, 1)], 1)
    with pytest.raises(BudgetError, match=r"90% of it.*below the engines' working minimum"):
        combine_by_key(rdd, create, merge_value, merge_combiners, memory="1m")


def test_local_workers_run_the_drivers_python(spark_context, monkeypatch):
    """getting-started's example, run with the virtualenv's Python without activating it:
    PySpark started the workers with ``python3`` from the PATH, which has no extagg, and
    every task failed with ``No module named 'extagg'`` (``extagg.spark.aggregate`` and
    ``install()`` pointed local workers at this interpreter; ``combine_by_key`` did not)."""
    import operator
    import sys

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.setattr(spark_context, "pythonExec", "/nonexistent/python3")
    rdd = spark_context.parallelize([(i % 10, 1) for i in range(1000)], 4)
    counts = combine_by_key(rdd, lambda v: v, operator.add, operator.add, memory="64m")
    assert spark_context.pythonExec == sys.executable
    assert dict(counts.collect()) == {k: 100 for k in range(10)}
