"""Generic collections: Spark's AppendOnlyMap with a sampled size estimate.

* :class:`AppendOnlyMap` - open-addressing map of Python keys, batch :meth:`~AppendOnlyMap.fold`
  probed by a numba kernel, destructive sort by deterministic key hash for spilling;
* :class:`SizeTracker` and :class:`SizeTrackingAppendOnlyMap` - Spark's O(1) sampled size estimate;
* :func:`estimate_size` - deterministic deep size of a Python object.
"""

from extagg.collection.append_only_map import AppendOnlyMap
from extagg.collection.size_estimator import estimate_size
from extagg.collection.size_tracker import SizeTracker, SizeTrackingAppendOnlyMap

__all__ = ["AppendOnlyMap", "SizeTracker", "SizeTrackingAppendOnlyMap", "estimate_size"]
