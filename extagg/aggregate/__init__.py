"""extagg.aggregate: the columnar engine (typed keys, compiled hash aggregation, spilling).

``HashAggregator`` folds record batches into per-group aggregate states in a numba hash table,
spills hash-sorted runs when the memory manager says no, and merges them; ``aggregate`` is the
one-call form.
"""

from extagg.aggregate.api import aggregate
from extagg.aggregate.functions import ALIASES, FUNCTIONS
from extagg.aggregate.hash_aggregator import HashAggregator

__all__ = ["ALIASES", "FUNCTIONS", "HashAggregator", "aggregate"]
