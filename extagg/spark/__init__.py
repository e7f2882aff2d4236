"""PySpark integration (needs the ``spark`` extra: ``pip install extagg[spark]``).

- :func:`install` / :func:`uninstall` / :func:`installed`: the RDD API's own ``combineByKey``,
  ``reduceByKey``, ``foldByKey``, ``aggregateByKey``, ``groupByKey`` and ``countByKey`` use
  extagg in the Python workers, with no other change to the job.
- :func:`aggregate`: ``df.groupBy(...).agg(...)`` through ``mapInArrow`` with the columnar
  engine (partial states per partition, a shuffle, a final merge); :func:`partial_aggregate`
  and :func:`final_aggregate` for the two stages apart.
- :func:`stateful_aggregate` / :class:`StatefulAggregate`: Structured Streaming running
  aggregates merged into :mod:`extagg.state` once per micro-batch (``foreachBatch``).
- :func:`combine_by_key` and the partition functions: the same, called explicitly.

Names are imported on first use (module ``__getattr__``): a Python worker that only needs the
shuffle merger (:mod:`extagg.spark.merger`) does not import the DataFrame path's pyarrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# eager (light: PySpark's own modules only), and so that the submodule ``install`` never
# shadows the function of that name when it is imported on its own
from extagg.spark.install import install, installed, is_installed, uninstall

if TYPE_CHECKING:
    from extagg.spark.combine import (
        combine_by_key,
        combine_partition,
        merge_partition,
        spark_partition_func,
    )
    from extagg.spark.dataframe import (
        AggregationPlan,
        aggregate,
        final_aggregate,
        partial_aggregate,
    )
    from extagg.spark.settings import executor_slots, worker_budget, worker_memory
    from extagg.spark.streaming import StatefulAggregate, finish_states, stateful_aggregate

#: public name -> the module that defines it (imported on first use)
_LAZY = {
    **dict.fromkeys(
        ("combine_by_key", "combine_partition", "merge_partition", "spark_partition_func"),
        "extagg.spark.combine",
    ),
    **dict.fromkeys(
        ("AggregationPlan", "aggregate", "final_aggregate", "partial_aggregate"),
        "extagg.spark.dataframe",
    ),
    **dict.fromkeys(("executor_slots", "worker_budget", "worker_memory"), "extagg.spark.settings"),
    **dict.fromkeys(
        ("StatefulAggregate", "finish_states", "stateful_aggregate"), "extagg.spark.streaming"
    ),
}

__all__ = [
    "StatefulAggregate",
    "finish_states",
    "stateful_aggregate",
    "AggregationPlan",
    "aggregate",
    "final_aggregate",
    "partial_aggregate",
    "combine_by_key",
    "combine_partition",
    "executor_slots",
    "install",
    "installed",
    "is_installed",
    "merge_partition",
    "spark_partition_func",
    "uninstall",
    "worker_budget",
    "worker_memory",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'extagg.spark' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
