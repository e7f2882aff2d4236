"""extagg: aggregate more data than fits in memory.

The public API::

    from extagg import Aggregator, ExternalAppendOnlyMap        # generic Python records
    from extagg import HashAggregator, aggregate                 # typed columns (numba)
    from extagg import aggregate_files, run_metrics              # Parquet/CSV/JSON/Arrow files
    from extagg import SpillError, CorruptFileError, MemoryLimitError

Memory management lives in :mod:`extagg.memory`, the state store in :mod:`extagg.state`, the
PySpark integration in :mod:`extagg.spark`.
"""

from extagg.columnar.api import aggregate
from extagg.columnar.hash_aggregator import HashAggregator
from extagg.errors import (
    CorruptFileError,
    ExtaggError,
    MemoryLimitError,
    SpillError,
    SumOverflowError,
)
from extagg.generic.aggregator import Aggregator
from extagg.generic.external_map import ExternalAppendOnlyMap
from extagg.hashing import stable_hash
from extagg.metrics import RunMetrics, SpillMetrics, run_metrics

__all__ = [
    "Aggregator",
    "CorruptFileError",
    "ExternalAppendOnlyMap",
    "ExtaggError",
    "HashAggregator",
    "MemoryLimitError",
    "SpillError",
    "SumOverflowError",
    "RunMetrics",
    "SpillMetrics",
    "aggregate",
    "aggregate_files",
    "run_metrics",
    "stable_hash",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # aggregate_files needs pyarrow.dataset (which imports pandas): loaded on first use only,
    # so that `import extagg` stays as light for the engines that do not read files
    if name == "aggregate_files":
        from extagg.io.run import aggregate_files

        return aggregate_files
    raise AttributeError(f"module 'extagg' has no attribute {name!r}")
