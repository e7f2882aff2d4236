"""The three combiner functions of Spark's ``combineByKey``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

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

    @property
    def reduce_function(self) -> Callable[[Any, Any], Any] | None:
        """``func`` when this aggregator is ``Aggregator.reducing(func)`` (the identity creates
        the combiner, ``func`` merges values and combiners), else ``None``. The generic engine
        folds ``operator.add``, ``min`` and ``max`` over plain numbers in compiled code."""
        if self.create_combiner is _identity and self.merge_value is self.merge_combiners:
            return self.merge_value
        return None


def _identity(value: Any) -> Any:
    return value
