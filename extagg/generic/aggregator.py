"""The three combiner functions of Spark's ``combineByKey``."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from extagg.function_code import computes_like, is_identity, is_plain_add

__all__ = ["Aggregator"]

V = TypeVar("V")
C = TypeVar("C")


@dataclass(frozen=True)
class Aggregator(Generic[V, C]):
    """How values fold into combiners, called exactly as Spark's ``combineByKey`` calls them.

    Parameters
    ----------
    create_combiner
        ``create_combiner(v)`` makes the combiner of a key from its first value in a map.
    merge_value
        ``merge_value(c, v)`` folds a further value into a combiner (may mutate and return ``c``).
    merge_combiners
        ``merge_combiners(c1, c2)`` merges two combiners of one key (maps or spilled runs).

    Examples
    --------
    >>> import operator
    >>> mean = Aggregator(lambda v: (v, 1), lambda c, v: (c[0] + v, c[1] + 1),
    ...                   lambda a, b: (a[0] + b[0], a[1] + b[1]))
    >>> Aggregator.reducing(operator.add).merge_value(1, 2)
    3
    """

    create_combiner: Callable[[V], C]
    merge_value: Callable[[C, V], C]
    merge_combiners: Callable[[C, C], C]

    def __post_init__(self) -> None:
        for name in ("create_combiner", "merge_value", "merge_combiners"):
            if not callable(getattr(self, name)):
                raise TypeError(f"Aggregator.{name} must be callable, got {getattr(self, name)!r}")

    @classmethod
    def reducing(cls, func: Callable[[Any, Any], Any]) -> Aggregator[Any, Any]:
        """An aggregator for ``reduceByKey``-style folds: ``func`` merges values and combiners."""
        return cls(_identity, func, func)

    @classmethod
    def counting(cls) -> Aggregator[Any, int]:
        """Count the values of each key (``rdd.map(lambda kv: (kv[0], 1)).reduceByKey(add)``
        without the ones): the combiner is an ``int``; values are not looked at. The
        generic engine folds it in compiled code for plain ``int``/``str`` keys, whatever the
        values.

        >>> Aggregator.counting().merge_value(Aggregator.counting().create_combiner("x"), "y")
        2
        """
        return Aggregator[Any, int](_count_create, _count_merge_value, operator.add)

    @classmethod
    def summing(cls) -> Aggregator[Any, Any]:
        """Sum the values of each key: ``Aggregator.reducing(operator.add)`` (typed path for
        plain ``int``/``float`` values)."""
        return cls.reducing(operator.add)

    @classmethod
    def sum_count(cls) -> Aggregator[Any, tuple[Any, int]]:
        """The ``(sum, count)`` of each key's values — the combiner PySpark jobs build for a
        mean (``combineByKey(lambda v: (v, 1), lambda c, v: (c[0] + v, c[1] + 1), lambda a,
        b: (a[0] + b[0], a[1] + b[1]))``); the mean is ``sum / count``. Folded in compiled
        code for plain ``int``/``str`` keys and plain ``int`` or ``float`` values.

        >>> agg = Aggregator.sum_count()
        >>> agg.merge_combiners(agg.merge_value(agg.create_combiner(1.5), 2.5), (1.0, 1))
        (5.0, 3)
        """
        return Aggregator[Any, tuple[Any, int]](
            _sum_count_create, _sum_count_merge_value, _sum_count_merge_combiners
        )

    @property
    def pattern(self) -> str | None:
        """``"count"`` for :meth:`counting`, ``"sum_count"`` for :meth:`sum_count`,
        ``"sum_count_merge"`` for ``Aggregator.reducing(Aggregator.sum_count().merge_combiners)``
        (the reduce side of a mean: it merges ``(sum, count)`` combiners), else ``None``; the
        same functions, however the aggregator was built, and the same computations written
        as the lambdas PySpark jobs pass (``lambda v: 1``, ``lambda c, v: c + 1``, ``lambda a,
        b: a + b``; ``lambda v: (v, 1)``, ... — see :mod:`extagg.function_code`)."""
        functions = (self.create_combiner, self.merge_value, self.merge_combiners)
        if _same_code(functions, (_count_create, _count_merge_value, operator.add)):
            return "count"
        if _same_code(
            functions, (_sum_count_create, _sum_count_merge_value, _sum_count_merge_combiners)
        ):
            return "sum_count"
        merge = _sum_count_merge_combiners
        if _same_code(functions, (_identity, merge, merge)):
            return "sum_count_merge"
        return None

    @property
    def reduce_function(self) -> Callable[[Any, Any], Any] | None:
        """``func`` when this aggregator is ``Aggregator.reducing(func)`` (the identity creates
        the combiner, ``func`` merges values and combiners), else ``None``; an aggregator of
        lambdas ``lambda v: v`` and ``lambda a, b: a + b`` (twice) is ``reducing(operator.add)``.
        The generic engine folds ``operator.add``, ``min`` and ``max`` over plain numbers in
        compiled code."""
        if not is_identity(self.create_combiner):
            return None
        if self.merge_value is self.merge_combiners:
            return self.merge_value
        if is_plain_add(self.merge_value) and is_plain_add(self.merge_combiners):
            return operator.add
        return None


def _same_code(
    functions: tuple[Callable[..., Any], ...], references: tuple[Callable[..., Any], ...]
) -> bool:
    """Whether each function is its reference or computes like it (operator.add: a plain +)."""
    for func, reference in zip(functions, references):
        if func is reference:
            continue
        if reference is operator.add:
            if not is_plain_add(func):
                return False
        elif not computes_like(func, reference):
            return False
    return True


def _identity(value: Any) -> Any:
    return value


def _count_create(_value: Any) -> int:
    return 1


def _count_merge_value(count: int, _value: Any) -> int:
    return count + 1


def _sum_count_create(value: Any) -> tuple[Any, int]:
    return (value, 1)


def _sum_count_merge_value(combiner: tuple[Any, int], value: Any) -> tuple[Any, int]:
    return (combiner[0] + value, combiner[1] + 1)


def _sum_count_merge_combiners(a: tuple[Any, int], b: tuple[Any, int]) -> tuple[Any, int]:
    return (a[0] + b[0], a[1] + b[1])
