"""Spark settings that size extagg inside Python workers.

PySpark gives each Python worker ``spark.python.worker.memory`` (default ``512m``) for its
shuffle aggregation. When ``spark.executor.pyspark.memory`` caps the Python memory of a whole
executor, that cap is shared by the executor's concurrent Python workers (one per task slot:
executor cores / ``spark.task.cpus``), so a worker's budget is the smaller of the two.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
from typing import Any

from extagg._config import MiB, parse_size

__all__ = [
    "DEFAULT_WORKER_MEMORY",
    "executor_slots",
    "local_workers_run_this_python",
    "worker_budget",
    "worker_memory",
]

log = logging.getLogger(__name__)

DEFAULT_WORKER_MEMORY = "512m"

_LOCAL = re.compile(r"^local(?:\[(\*|\d+)(?:\s*,\s*\d+)?\])?$")


def _get(conf: Any, key: str) -> str | None:
    """``conf.get(key)`` for a ``SparkConf``, a ``RuntimeConfig`` or a plain dict."""
    try:
        value = conf.get(key, None)
    except Exception:  # RuntimeConfig raises for unset keys without a default on some versions
        return None
    return None if value is None or str(value).strip() == "" else str(value)


def worker_memory(conf: Any) -> int:
    """PySpark's per-worker aggregation budget in bytes: ``spark.python.worker.memory``.

    Parameters
    ----------
    conf
        The Spark settings: a ``SparkConf``, a session's ``spark.conf`` or a plain dict.

    Returns
    -------
    int
        The budget in bytes (Spark's default ``512m`` when unset).
    """
    raw = _get(conf, "spark.python.worker.memory") or DEFAULT_WORKER_MEMORY
    return parse_size(raw, name="spark.python.worker.memory")


def executor_slots(conf: Any, master: str | None = None) -> int:
    """How many tasks (so Python workers) run at once in one executor.

    ``local[N]`` → N (``local[*]`` → the CPU count), else ``spark.executor.cores`` (default 1),
    divided by ``spark.task.cpus`` (default 1); never below 1.

    Parameters
    ----------
    conf
        The Spark settings: a ``SparkConf``, a session's ``spark.conf`` or a plain dict.
    master
        The master URL (``local[4]``, ...); default ``spark.master`` from ``conf``.

    Returns
    -------
    int
        The number of concurrent tasks per executor.
    """
    master = master if master is not None else _get(conf, "spark.master")
    cores = None
    if master:
        match = _LOCAL.match(master.strip())
        if match:
            count = match.group(1)
            cores = os.cpu_count() or 1 if count == "*" else int(count or 1)
    if cores is None:
        cores = int(_get(conf, "spark.executor.cores") or 1)
    task_cpus = int(_get(conf, "spark.task.cpus") or 1)
    return max(1, cores // max(1, task_cpus))


def worker_budget(conf: Any, master: str | None = None) -> int:
    """The bytes one Python worker may aggregate in, from the Spark settings ``conf`` holds.

    ``spark.python.worker.memory``, lowered to ``spark.executor.pyspark.memory`` divided among
    the executor's Python workers (:func:`executor_slots`) when that is set and smaller.

    Parameters
    ----------
    conf
        The Spark settings: a ``SparkConf``, a session's ``spark.conf`` or a plain dict.
    master
        The master URL (``local[4]``, ...); default ``spark.master`` from ``conf``.

    Returns
    -------
    int
        The budget in bytes (at least 1 MiB).
    """
    budget = worker_memory(conf)
    raw = _get(conf, "spark.executor.pyspark.memory")
    if raw is not None:
        # Spark reads this one in MiB when it has no unit
        text = raw.strip()
        total = parse_size(
            text + "m" if text.isdigit() else text, name="spark.executor.pyspark.memory"
        )
        budget = min(budget, total // executor_slots(conf, master))
    return max(budget, MiB)


def local_workers_run_this_python(sc: Any) -> bool:
    """In local mode, start the Python workers with this interpreter unless the user chose one.

    Without ``PYSPARK_PYTHON`` (or ``spark.pyspark.python``) PySpark starts its workers with
    ``python3`` from the ``PATH``, which is often not the interpreter extagg is installed in
    (a virtualenv's): every task then fails with ``ModuleNotFoundError: No module named
    'extagg'``. In local mode the workers run on this machine, so this interpreter is the one
    they need. Returns whether the setting was changed (``sc.pythonExec``).

    Parameters
    ----------
    sc
        The ``SparkContext`` (``None``, or a Spark Connect session's absent one: nothing done).
    """
    master = str(getattr(sc, "master", "") or "")
    if sc is None or not _LOCAL.match(master):
        return False
    if os.environ.get("PYSPARK_PYTHON"):
        return False
    try:
        if _get(sc.getConf(), "spark.pyspark.python"):
            return False
    except Exception:  # a context being stopped
        return False
    current = str(getattr(sc, "pythonExec", "") or "")
    found = shutil.which(current) if current else None
    if found and os.path.abspath(found) == os.path.abspath(sys.executable):
        return False
    sc.pythonExec = sys.executable
    log.info(
        "local Spark: Python workers run %s (this interpreter) instead of %r; set "
        "PYSPARK_PYTHON to choose another", sys.executable, current,
    )  # fmt: skip
    return True
