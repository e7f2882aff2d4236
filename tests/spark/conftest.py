"""A real local Spark (``local[2]``) shared by the PySpark tests."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")


@pytest.fixture(scope="session")
def spark_context(tmp_path_factory):
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Java 17 is required for the PySpark tests: run `make java` or install a JDK")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    local_dir = tmp_path_factory.mktemp("spark-local")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("extagg-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.local.dir", str(local_dir))
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session.sparkContext
    session.stop()


@pytest.fixture(scope="session")
def spark(spark_context):
    """The SparkSession of the shared ``local[2]`` context (for DataFrame tests)."""
    from pyspark.sql import SparkSession

    return SparkSession.builder.getOrCreate()
