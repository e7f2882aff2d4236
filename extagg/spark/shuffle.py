"""The map side of PySpark's ``partitionBy`` while :func:`extagg.spark.install` is in effect.

PySpark's ``RDD.partitionBy`` runs ``add_shuffle_key`` in the Python worker: for every record it
calls ``partitionFunc(key) % numPartitions`` (``portable_hash``, which looks up
``os.environ["PYTHONHASHSEED"]`` on every call) and appends the record to its bucket, and
every so often pickles the buckets. :func:`write_buckets` does the same work with the same
result — the same partition number for every record, the records of a partition in the same
order, pickled by the shuffle's own serializer (PySpark's pickle serializer, protocol 5) in
lists — but computes the partition numbers a chunk at a time: for ``int`` keys as one NumPy
expression that reproduces CPython's ``hash(int)`` (the key modulo the Mersenne prime
``2**61 - 1``, sign kept, ``-1`` → ``-2``), for other keys with the builtin ``hash``
(what ``portable_hash`` returns for anything but ``None`` and tuples) after checking
``PYTHONHASHSEED`` once per chunk, and ``portable_hash`` itself for ``None`` and tuples.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

__all__ = ["MERSENNE_61", "RECORD_BYTES", "partition_numbers", "write_buckets"]

#: CPython's modulus for ``hash(int)`` on 64-bit builds (``sys.hash_info.modulus``)
MERSENNE_61 = (1 << 61) - 1
#: records whose partition numbers are computed at once
CHUNK = 4096
#: a record's bytes as Python objects, to turn PySpark's byte limit into a record count
RECORD_BYTES = 128
#: most records held in the buckets before they are pickled
MAX_PENDING = 1 << 14


def _portable_hash() -> Any:
    for name in ("pyspark.core.rdd", "pyspark.rdd"):  # PySpark 4, 3
        try:
            return importlib.import_module(name).portable_hash
        except (ImportError, AttributeError):
            continue
    raise ImportError("extagg.spark.shuffle needs PySpark: portable_hash was not found")


def partition_numbers(keys: list[Any], partitions: int) -> list[int]:
    """``portable_hash(key) % partitions`` for every key, exactly as PySpark computes it."""
    if not keys:
        return []
    portable_hash = _portable_hash()
    portable_hash(0)  # raises PySpark's own error when PYTHONHASHSEED is not set
    if all(type(k) is int for k in keys):
        import numpy as np

        try:
            arr = np.array(keys, dtype=np.int64)
        except OverflowError:
            pass  # an int beyond int64: the builtin hash below
        else:
            rest = arr % MERSENNE_61  # floor modulo: in [0, M)
            hashes = np.where(arr < 0, -((MERSENNE_61 - rest) % MERSENNE_61), rest)
            hashes[hashes == -1] = -2
            return (hashes % partitions).tolist()  # floor modulo, as Python's %
    return [
        (portable_hash(k) if k is None or isinstance(k, tuple) else hash(k)) % partitions
        for k in keys
    ]


def write_buckets(
    records: Iterable[tuple[Any, Any]], partitions: int, serializer: Any, limit_mib: float
) -> Iterator[bytes]:
    """``add_shuffle_key``'s output for ``records``: ``pack_long(partition)`` then the pickled
    list of that partition's records, for every non-empty bucket, every so often.

    ``limit_mib`` is the memory PySpark lets its buckets hold (half the worker memory); the
    buckets are pickled when they hold that many bytes' worth of records (estimated), or
    :data:`MAX_PENDING` records."""
    from pyspark.serializers import pack_long

    most = max(CHUNK, min(MAX_PENDING, int(limit_mib * (1 << 20)) // RECORD_BYTES))
    buckets: list[list[Any]] = [[] for _ in range(partitions)]
    pending = 0
    it = iter(records)
    while True:
        chunk = list(islice(it, CHUNK))
        if chunk:
            keys = [k for k, _ in chunk]  # a record that is no pair fails as in PySpark
            for part, record in zip(partition_numbers(keys, partitions), chunk):
                buckets[part].append(record)
            pending += len(chunk)
        if pending and (pending >= most or not chunk):
            for part, bucket in enumerate(buckets):
                if bucket:
                    yield pack_long(part)
                    yield serializer.dumps(bucket)
                    buckets[part] = []
            pending = 0
        if not chunk:
            return
