"""PySpark integration (needs the ``spark`` extra: ``pip install extagg[spark]``)."""

from extagg.spark.combine import (
    combine_by_key,
    combine_partition,
    merge_partition,
    spark_partition_func,
    worker_memory,
)

__all__ = [
    "combine_by_key",
    "combine_partition",
    "merge_partition",
    "spark_partition_func",
    "worker_memory",
]
