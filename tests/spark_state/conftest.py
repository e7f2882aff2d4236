"""One local Spark (``local[1]``) for the Spark-state tests, and the checkpoints its streaming
queries write, built once per session."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sys
import time

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from tests.spark_state import builders

SQL_CONFS = {
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot": "1",
    "spark.sql.streaming.stateStore.maintenanceInterval": "100ms",
}


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Java 17 is required for the Spark state tests: run `make java`")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[1]")
        .appName("extagg-spark-state-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local")))
    )
    for key, value in SQL_CONFS.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    for key, value in SQL_CONFS.items():  # an existing session (tests/spark) gets them too
        session.conf.set(key, value)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


class Checkpoints:
    """Builds each query's checkpoint on first use, then hands out the path."""

    def __init__(self, spark, root: str) -> None:
        self.spark = spark
        self.root = root
        self.paths: dict[str, str] = {}

    def get(self, name: str) -> str:
        if name not in self.paths:
            build = {
                "agg_update": lambda: builders.build_aggregation(self.spark, self.root, "update"),
                "agg_complete": lambda: builders.build_aggregation(
                    self.spark, self.root, "complete"
                ),
                "global": lambda: builders.build_global_aggregation(self.spark, self.root),
                "typed": lambda: builders.build_typed_aggregation(self.spark, self.root),
                "window": lambda: builders.build_window(self.spark, self.root),
                "dedup": lambda: builders.build_dedup(self.spark, self.root),
                "maps": lambda: builders.build_map_values(self.spark, self.root),
                "join": lambda: builders.build_join(self.spark, self.root),
                "pandas_state": lambda: builders.build_pandas_state(self.spark, self.root),
                "rocksdb": lambda: builders.build_rocksdb(self.spark, self.root),
                "zstd": lambda: builders.build_compressed(self.spark, self.root, "zstd"),
            }[name]
            self.paths[name] = build()
            time.sleep(0.3)  # let maintenance write its snapshots
        return self.paths[name]


@pytest.fixture(scope="session")
def checkpoints(spark, tmp_path_factory) -> Checkpoints:
    return Checkpoints(spark, str(tmp_path_factory.mktemp("spark-checkpoints")))


def normalize(value):
    """A value of a Spark ``Row`` (collect) or of extagg's rows, in one comparable form:
    structs as tuples, maps as lists of pairs, timestamps as naive local datetimes."""
    if isinstance(value, dict):
        return [(normalize(k), normalize(v)) for k, v in value.items()]
    if isinstance(value, tuple):
        return tuple(normalize(v) for v in value)
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone().replace(tzinfo=None)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def sort_key(row):
    return repr(row)
