"""extagg.state.spark: Spark's own HDFS-backed state store checkpoints, read and written
without a JVM.

Readers return the rows of Spark's ``statestore`` / ``state-metadata`` sources; the writer
produces checkpoints that Spark's reader reads and a streaming aggregation resumes from.
"""

from extagg.state.spark.checkpoint import (
    SparkCheckpoint,
    UnsupportedCheckpointError,
    is_spark_checkpoint,
)
from extagg.state.spark.framing import CodecUnavailableError
from extagg.state.spark.metadata import UnsupportedLogVersionError
from extagg.state.spark.partitioning import partition_for, spark_hash
from extagg.state.spark.reader import (
    DIFF_FIELDS,
    read_change_feed,
    read_diff,
    read_metadata,
    read_state,
)
from extagg.state.spark.types import (
    ArrayType,
    AtomicType,
    DecimalType,
    MapType,
    StructField,
    StructType,
    UnsupportedSparkTypeError,
    parse_schema,
    to_arrow_type,
    unique_names,
)
from extagg.state.spark.unsaferow import RowDecoder, RowEncoder, SparkRow
from extagg.state.spark.writer import write_state

__all__ = [
    "DIFF_FIELDS",
    "ArrayType",
    "AtomicType",
    "CodecUnavailableError",
    "DecimalType",
    "MapType",
    "RowDecoder",
    "RowEncoder",
    "SparkCheckpoint",
    "SparkRow",
    "StructField",
    "StructType",
    "UnsupportedCheckpointError",
    "UnsupportedLogVersionError",
    "UnsupportedSparkTypeError",
    "is_spark_checkpoint",
    "parse_schema",
    "partition_for",
    "spark_hash",
    "read_change_feed",
    "read_diff",
    "read_metadata",
    "read_state",
    "to_arrow_type",
    "unique_names",
    "write_state",
]
