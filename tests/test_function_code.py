"""Combiners written as lambdas, recognised by their code (``extagg.function_code``): a sum, a
count and a mean as PySpark jobs write them fold on the typed path and give exactly what the
general path (every record calling the lambdas) gives; anything that merely looks alike is
called as given."""

from __future__ import annotations

import operator

from hypothesis import given, settings
from hypothesis import strategies as st

from extagg import Aggregator
from extagg.function_code import computes_like, is_identity, is_plain_add
from extagg.generic.typed_map import TypedReduceMap, aggregator_op
from tests.test_typed_path import run_aggregator as run
from tests.test_typed_path import workloads


def _identity_def(value):
    """A docstring does not make it another function."""
    return value


def _pair_create(v):
    return (v, 1)


def test_identity_and_plain_add_are_recognised_whatever_the_names():
    assert is_identity(lambda v: v) and is_identity(lambda item: item)
    assert is_identity(_identity_def)
    assert is_plain_add(lambda x, y: x + y) and is_plain_add(operator.add)

    def nested():  # a lambda made inside a function has other code flags: still the same
        return lambda a, b: a + b

    assert is_plain_add(nested())


def test_lookalikes_are_not_recognised():
    offset = 0
    for other in (
        lambda v: v + 0,
        lambda v: v + offset,  # a closure
        lambda *v: v,
        lambda v, w: v,
        lambda v: -v,
        abs,
        "not a function",
    ):
        assert not is_identity(other), other

    def generator(v):
        yield v

    assert not is_identity(generator)
    assert not is_plain_add(lambda a, b: b + a)  # not the same for strings or tuples


def test_constants_are_compared_with_their_types():
    assert computes_like(lambda v: (v, 1), _pair_create)
    assert not computes_like(lambda v: (v, True), _pair_create)  # True == 1, but not a count
    assert not computes_like(lambda v: (v, 1.0), _pair_create)
    assert not computes_like(lambda v: (v, 2), _pair_create)
    assert not computes_like(lambda v: [v, 1], _pair_create)


LAMBDA_SUM = Aggregator(lambda v: v, lambda c, v: c + v, lambda a, b: a + b)
LAMBDA_COUNT = Aggregator(lambda v: 1, lambda c, v: c + 1, lambda a, b: a + b)
LAMBDA_MEAN = Aggregator(
    lambda v: (v, 1), lambda c, v: (c[0] + v, c[1] + 1), lambda a, b: (a[0] + b[0], a[1] + b[1])
)


def test_pyspark_style_lambdas_take_the_typed_path():
    assert aggregator_op(LAMBDA_SUM) == aggregator_op(Aggregator.summing())
    assert LAMBDA_COUNT.pattern == "count"
    assert LAMBDA_MEAN.pattern == "sum_count"
    merge = LAMBDA_MEAN.merge_combiners
    assert Aggregator(lambda v: v, merge, merge).pattern == "sum_count_merge"
    pairs = [(i % 100, float(i)) for i in range(5000)]
    for agg in (LAMBDA_SUM, LAMBDA_COUNT, LAMBDA_MEAN):
        _, _, kind = run(pairs, agg, True, memory="64m")
        assert kind is TypedReduceMap, agg
    # a lookalike mean (the count starts at True) stays on the general path, and is right
    odd = Aggregator(lambda v: (v, True), LAMBDA_MEAN.merge_value, LAMBDA_MEAN.merge_combiners)
    assert odd.pattern is None
    out, _, kind = run(pairs[:10], odd, True, memory="64m")
    assert kind is not TypedReduceMap and len(out) == 10


@settings(max_examples=60, deadline=None)
@given(
    workloads(),
    st.sampled_from(["sum", "count", "mean"]),
    st.sampled_from([None, 1, 7, 64]),
)
def test_lambdas_fold_exactly_as_when_called(pairs, which, every):
    """Typed path (recognised lambdas) == general path (the lambdas called per record), same
    order and bits, with forced spills; mixed keys and values, big ints and NaN included
    (records that do not fit hand the map over to the general path)."""
    agg = {"sum": LAMBDA_SUM, "count": LAMBDA_COUNT, "mean": LAMBDA_MEAN}[which]
    typed, typed_spills, _ = run(pairs, agg, True, memory="16m", force_spill_every=every)
    general, general_spills, _ = run(pairs, agg, False, memory="16m", force_spill_every=every)
    assert typed == general
    assert typed_spills == general_spills
