"""extagg.columnar: the columnar engine (typed keys, compiled hash aggregation, spilling).

``HashAggregator`` folds record batches into per-group aggregate states in a numba hash table,
spills hash-sorted runs when the memory manager says no, and merges them; ``aggregate`` is the
one-call form.
"""

from extagg.columnar.api import aggregate
from extagg.columnar.distinct import DistinctAggregator
from extagg.columnar.functions import ALIASES, DISTINCT_FUNCTIONS, FUNCTIONS
from extagg.columnar.hash_aggregator import HashAggregator

__all__ = [
    "ALIASES",
    "DISTINCT_FUNCTIONS",
    "FUNCTIONS",
    "DistinctAggregator",
    "HashAggregator",
    "aggregate",
]
