"""Generic collections: Spark's AppendOnlyMap with a sampled size estimate.

* :class:`AppendOnlyMap` - open-addressing map of Python keys, batch :meth:`~AppendOnlyMap.fold`
  probed by a numba kernel, destructive sort by deterministic key hash for spilling;
* :class:`SizeTracker` and :class:`SizeTrackingAppendOnlyMap` - Spark's O(1) sampled size estimate;
* :func:`estimate_size` - deterministic deep size of a Python object.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from extagg.collection.append_only_map import AppendOnlyMap
    from extagg.collection.size_estimator import estimate_size
    from extagg.collection.size_tracker import SizeTracker, SizeTrackingAppendOnlyMap

__all__ = ["AppendOnlyMap", "SizeTracker", "SizeTrackingAppendOnlyMap", "estimate_size"]

#: public name -> the module that defines it, imported on first use: importing
#: ``extagg.collection.size_estimator`` (a PySpark worker's groupByKey does) must not load
#: numba, which the map's kernels need (~100 MiB of a worker's RSS)
_LAZY = {
    "AppendOnlyMap": "extagg.collection.append_only_map",
    "estimate_size": "extagg.collection.size_estimator",
    "SizeTracker": "extagg.collection.size_tracker",
    "SizeTrackingAppendOnlyMap": "extagg.collection.size_tracker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'extagg.collection' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
