"""extagg: aggregate more data than fits in memory.

The public API::

    from extagg import Aggregator, ExternalAppendOnlyMap        # generic Python records
    from extagg import HashAggregator, aggregate                 # typed columns (numba)
    from extagg import aggregate_files, run_metrics              # Parquet/CSV/JSON/Arrow files
    from extagg import SpillError, CorruptFileError, MemoryLimitError

Memory management lives in :mod:`extagg.memory`, the state store in :mod:`extagg.state`, the
PySpark integration in :mod:`extagg.spark`.

Importing :mod:`extagg` (or :mod:`extagg.memory`) loads neither numba nor pyarrow: the engines
are imported when a name that needs them is first used (module ``__getattr__``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from extagg.errors import (
    BadKeyError,
    BudgetError,
    CorruptFileError,
    DestroyedError,
    ExpressionError,
    ExpressionOverflowError,
    ExpressionValueError,
    ExtaggError,
    InputError,
    MemoryLimitError,
    OutputError,
    QueryError,
    SpillError,
    SumOverflowError,
    UsageError,
)

if TYPE_CHECKING:
    from extagg.columnar.hash_aggregator import HashAggregator
    from extagg.generic.aggregator import Aggregator
    from extagg.generic.external_map import ExternalAppendOnlyMap
    from extagg.hashing import stable_hash
    from extagg.io.expressions import aggregate
    from extagg.io.run import aggregate_files
    from extagg.metrics import RunMetrics, SpillMetrics, run_metrics
    from extagg.spillable import Spillable
    from extagg.state.errors import (
        CommittedBatchUnavailableError,
        StateFileNotFoundError,
        StateSourceConflictError,
        StateSourceError,
        StateSourceOptionError,
        StateStoreCommitError,
        StateStoreError,
        UnexpectedVersionError,
    )

#: public name -> the module that defines it (imported on first use)
_LAZY = {
    "aggregate": "extagg.io.expressions",
    "HashAggregator": "extagg.columnar.hash_aggregator",
    "Aggregator": "extagg.generic.aggregator",
    "ExternalAppendOnlyMap": "extagg.generic.external_map",
    "stable_hash": "extagg.hashing",
    "SpillMetrics": "extagg.metrics",
    "RunMetrics": "extagg.metrics",
    "run_metrics": "extagg.metrics",
    "aggregate_files": "extagg.io.run",
    "Spillable": "extagg.spillable",
    **dict.fromkeys(
        (
            "CommittedBatchUnavailableError",
            "StateFileNotFoundError",
            "StateSourceConflictError",
            "StateSourceError",
            "StateSourceOptionError",
            "StateStoreCommitError",
            "StateStoreError",
            "UnexpectedVersionError",
        ),
        "extagg.state.errors",
    ),
}

__all__ = [
    "Aggregator",
    "BadKeyError",
    "BudgetError",
    "CommittedBatchUnavailableError",
    "CorruptFileError",
    "DestroyedError",
    "ExpressionError",
    "ExternalAppendOnlyMap",
    "ExtaggError",
    "HashAggregator",
    "InputError",
    "MemoryLimitError",
    "OutputError",
    "QueryError",
    "SpillError",
    "RunMetrics",
    "SpillMetrics",
    "Spillable",
    "StateFileNotFoundError",
    "StateSourceConflictError",
    "StateSourceError",
    "StateSourceOptionError",
    "StateStoreCommitError",
    "StateStoreError",
    "SumOverflowError",
    "ExpressionOverflowError",
    "ExpressionValueError",
    "UnexpectedVersionError",
    "UsageError",
    "aggregate",
    "aggregate_files",
    "run_metrics",
    "stable_hash",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'extagg' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    """The public names (and the submodules imported so far), not the helpers of this file
    (``importlib``, ``Any``, ...), so that completion offers what the API is."""
    import types

    modules = {n for n, v in globals().items() if isinstance(v, types.ModuleType)} - {"importlib"}
    return sorted({*__all__, *modules, "__version__"})
