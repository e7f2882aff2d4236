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

    ``create_combiner(v)`` for the first value of a key in a map, ``merge_value(c, v)`` for the
    next ones, ``merge_combiners(c1, c2)`` when maps or runs holding the same key are merged.
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


def _identity(value: Any) -> Any:
    return value
