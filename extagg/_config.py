"""Configuration: byte-size strings, ``EXTAGG_*`` environment variables and defaults.

Precedence everywhere: explicit argument > environment variable > default.
"""

from __future__ import annotations

import os
import re

from extagg.errors import QueryError

__all__ = [
    "parse_size",
    "format_size",
    "env_size",
    "env_int",
    "env_flag",
    "default_spill_dirs",
    "resolve_threads",
    "resolve_file_threads",
    "THREADS_ENV",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_FAN_IN",
    "INITIAL_MEMORY_THRESHOLD",
]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

#: records per independently decodable batch in a run file (Spark's spark.shuffle.spill.batchSize)
DEFAULT_BATCH_SIZE = 10_000
#: runs merged at once; more runs are merged in passes
DEFAULT_FAN_IN = 64
#: Spark's spark.shuffle.spill.initialMemoryThreshold: no spill is smaller than this
INITIAL_MEMORY_THRESHOLD = 5 * MiB

_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kb": KiB,
    "kib": KiB,
    "m": MiB,
    "mb": MiB,
    "mib": MiB,
    "g": GiB,
    "gb": GiB,
    "gib": GiB,
    "t": 1024 * GiB,
    "tb": 1024 * GiB,
    "tib": 1024 * GiB,
    "p": 1024**5,
    "pb": 1024**5,
    "pib": 1024**5,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str, *, name: str = "size", allow_zero: bool = False) -> int:
    """Parse a byte size: an int, or a string such as ``"256m"``, ``"1.5g"``, ``"64MiB"``.

    Units follow Spark: ``k``, ``m``, ``g``, ``t``, ``p`` (optionally followed by ``b``) are
    binary, as are the IEC spellings ``KiB``/``MiB``/``GiB``. Empty strings, negative numbers,
    unknown units and (unless ``allow_zero``) zero raise :class:`~extagg.errors.QueryError` (a
    ``ValueError``) naming the bad value.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a byte count or a size string, not bool")
    if isinstance(value, int):
        size = value
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QueryError(f"invalid {name} {value!r}: not a finite number")
        if value != int(value):  # memory=1.5 was 1 byte
            raise QueryError(
                f"invalid {name} {value!r}: a number of bytes is whole (for 1.5 MiB write '1.5m')"
            )
        size = int(value)
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        if not match and value.strip().startswith("-"):
            raise QueryError(
                f"invalid {name} {value!r}: negative size (a size is a number of bytes >= 0)"
            )
        if not match:
            raise QueryError(
                f"invalid {name} {value!r}: expected a number with an optional unit "
                "(b, k, m, g, t, p, kb, mb, KiB, MiB, ...), e.g. '256m'"
            )
        number, unit = match.groups()
        factor = _UNITS.get(unit.lower())
        if factor is None:
            raise QueryError(f"invalid {name} {value!r}: unknown unit {unit!r}")
        if "." in number and factor == 1 and float(number) != int(float(number)):
            raise QueryError(  # "1.5" was 1 byte
                f"invalid {name} {value!r}: a number of bytes is whole "
                f"(for {number} MiB write '{number}m')"
            )
        size = int(float(number) * factor) if "." in number else int(number) * factor
    else:
        raise TypeError(f"{name} must be a byte count or a size string, not {type(value).__name__}")
    if size < 0:
        raise QueryError(f"invalid {name} {value!r}: negative size (must not be negative)")
    if size == 0 and not allow_zero:
        raise QueryError(f"invalid {name} {value!r}: must be greater than zero")
    return size


def format_size(num_bytes: float) -> str:
    """Format bytes with binary units the way Spark's ``bytesToString`` does (``"63.2 MiB"``)."""
    value = float(num_bytes)
    for unit in ("EiB", "PiB", "TiB", "GiB", "MiB", "KiB"):
        scale = 1024.0 ** ("KMGTPE".index(unit[0]) + 1)
        if abs(value) >= 2 * scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.1f} B"


def env_size(var: str, default: int | None = None, *, allow_zero: bool = False) -> int | None:
    """A byte size from environment variable ``var``, or ``default`` when it is unset or empty."""
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    return parse_size(raw, name=f"environment variable {var}", allow_zero=allow_zero)


def env_int(var: str, default: int | None = None) -> int | None:
    """A positive integer from environment variable ``var``, or ``default``."""
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {var}={raw!r} is not an integer") from None
    if value <= 0:
        raise ValueError(f"environment variable {var}={raw!r} must be positive")
    return value


#: environment variable with the default thread count of the columnar engine
THREADS_ENV = "EXTAGG_THREADS"


def resolve_threads(threads: int | None) -> int:
    """The thread count to use: ``threads``, else ``EXTAGG_THREADS``, else the CPUs this
    process may run on (``os.sched_getaffinity``). ``ValueError`` unless a positive int."""
    if threads is None:
        from_env = env_int(THREADS_ENV)
        if from_env is not None:
            return from_env
        affinity = getattr(os, "sched_getaffinity", None)
        return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    if threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads}")
    return threads


def resolve_file_threads(threads: int | None) -> int:
    """The fold threads of a file query: :func:`resolve_threads`, except that when neither
    the caller nor ``EXTAGG_THREADS`` chose, one fewer than the CPUs (at least one). The scan's
    reader thread decodes the file on a core of its own beside the folds: with two CPUs, two
    fold threads made TPC-H SF10 ``GROUP BY l_orderkey`` (Parquet, in memory) take 7.2-8.5 s
    against 5.1-5.2 s with one (the threads' partitioning is extra work, and three busy
    threads shared two cores)."""
    if threads is None and env_int(THREADS_ENV) is None:
        return max(1, resolve_threads(None) - 1)
    return resolve_threads(threads)


def env_flag(var: str, default: bool) -> bool:
    """A boolean from environment variable ``var`` (``0/false/no/off`` are false)."""
    raw = os.environ.get(var, "").strip().lower()
    if not raw:
        return default
    return raw not in ("0", "false", "no", "off")


def default_spill_dirs() -> list[str]:
    """Where spills go when no directory is given.

    ``EXTAGG_SPILL_DIR`` (several separated by ``os.pathsep``), else Spark's ``SPARK_LOCAL_DIRS``
    (comma-separated; Spark sets it for every Python worker, so engines used inside a Spark task
    spill where Spark spills), else the system temp directory.
    """
    raw = os.environ.get("EXTAGG_SPILL_DIR", "").strip()
    if raw:
        dirs = [d for d in raw.split(os.pathsep) if d]
        if dirs:
            return dirs
    spark = [d.strip() for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d.strip()]
    if spark:
        return spark
    import tempfile

    return [tempfile.gettempdir()]
