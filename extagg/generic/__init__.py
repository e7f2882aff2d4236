"""extagg.generic: the generic engine (any picklable Python key and combiner).

``ExternalAppendOnlyMap`` folds ``(key, value)`` records into combiners made by an
``Aggregator``, spills hash-sorted runs when the memory manager says no, and merges them.
"""

from extagg.generic.aggregator import Aggregator
from extagg.generic.external_map import ExternalAppendOnlyMap

__all__ = ["Aggregator", "ExternalAppendOnlyMap"]
