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

Typed batches: when the records are the hand-on of extagg's map-side combine and it folded on
the typed path (``reduceByKey(add | min | max)`` & co. over int/str keys and int/float values),
its groups come as :class:`~extagg.collection.pair_arrays.PairArrays` blocks; they are
partitioned as arrays (the same partition numbers) and each partition's pairs pickled as one
block: the keys and combiners as raw ``int64``/``float64``/UTF-8 bytes (protocol 5), not one
pickled tuple per pair. Unpickled, a block is an iterable of the same pairs in the same order,
so PySpark's own reader reads it as the list it stands for; extagg's reduce side
(:meth:`extagg.spark.merger.SparkMerger.mergeCombiners`) folds it from its arrays.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from extagg.collection.pair_arrays import PairArrays
from extagg.spark.partial import HandedOn

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


def _int_partitions(arr: Any, partitions: int) -> Any:
    """``hash(key) % partitions`` of ``int64`` keys as CPython computes ``hash(int)``."""
    import numpy as np

    rest = arr % MERSENNE_61  # floor modulo: in [0, M)
    hashes = np.where(arr < 0, -((MERSENNE_61 - rest) % MERSENNE_61), rest)
    hashes[hashes == -1] = -2
    return hashes % partitions  # floor modulo, as Python's %


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
            parts: list[int] = _int_partitions(arr, partitions).tolist()
            return parts
    return [
        (portable_hash(k) if k is None or isinstance(k, tuple) else hash(k)) % partitions
        for k in keys
    ]


def _block_partitions(block: PairArrays, partitions: int) -> Any:
    """:func:`partition_numbers` of a typed block's keys, as an ``int64`` array."""
    import numpy as np

    _portable_hash()(0)  # PySpark's own error when PYTHONHASHSEED is not set
    if block.int_keys is not None:
        return _int_partitions(block.int_keys, partitions)
    keys = block.key_objects()  # str: the builtin hash, as portable_hash
    return np.fromiter((hash(k) % partitions for k in keys), dtype=np.int64, count=len(keys))


def write_buckets(
    records: Iterable[tuple[Any, Any]], partitions: int, serializer: Any, limit_mib: float
) -> Iterator[bytes]:
    """``add_shuffle_key``'s output for ``records``: ``pack_long(partition)`` then the pickled
    list of that partition's records, for every non-empty bucket, every so often.

    ``limit_mib`` is the memory PySpark lets its buckets hold (half the worker memory); the
    buckets are pickled when they hold that many bytes' worth of records (estimated), or
    :data:`MAX_PENDING` records. When ``records`` is a map-side combiner's hand-on
    (:class:`~extagg.spark.partial.HandedOn`), its typed blocks are partitioned as arrays and
    each partition's part pickled as one :class:`~extagg.collection.pair_arrays.PairArrays`
    (which PySpark's reader, iterating it, reads as the same pairs)."""
    most = max(CHUNK, min(MAX_PENDING, int(limit_mib * (1 << 20)) // RECORD_BYTES))
    buckets = _Buckets(partitions, serializer, most)
    if isinstance(records, HandedOn):
        for part in records.parts():
            if isinstance(part, PairArrays):
                yield from buckets.add_block(part)
            else:
                yield from buckets.add_records(iter(part))
    else:
        yield from buckets.add_records(iter(records))
    yield from buckets.flush()


class _Buckets:
    """A map task's pending shuffle output per partition: records (lists) or typed blocks.

    Within a partition the records keep their order: pending records are written before a
    typed block is added, and pending blocks before records are."""

    def __init__(self, partitions: int, serializer: Any, most: int) -> None:
        self.partitions = partitions
        self.serializer = serializer
        self.most = most
        self.records: list[list[Any]] = [[] for _ in range(partitions)]
        self.blocks: list[list[PairArrays]] = [[] for _ in range(partitions)]
        self.pending = 0
        self.holds: str | None = None  # "records" or "blocks"

    def _switch(self, kind: str) -> Iterator[bytes]:
        if self.holds is not None and self.holds != kind:
            yield from self.flush()
        self.holds = kind

    def add_records(self, it: Iterator[tuple[Any, Any]]) -> Iterator[bytes]:
        """Partition records a chunk at a time (PySpark's ``portable_hash``)."""
        buckets = self.records
        while chunk := list(islice(it, CHUNK)):
            yield from self._switch("records")
            keys = [k for k, _ in chunk]  # a record that is no pair fails as in PySpark
            for part, record in zip(partition_numbers(keys, self.partitions), chunk):
                buckets[part].append(record)
            self.pending += len(chunk)
            if self.pending >= self.most:
                yield from self.flush()

    def add_block(self, block: PairArrays) -> Iterator[bytes]:
        """Partition a typed block: each partition's pairs, in order, become a block of their
        own (copied out of ``block``, which may be a view of a table being handed on)."""
        import numpy as np

        if not len(block):
            return
        yield from self._switch("blocks")
        numbers = _block_partitions(block, self.partitions)
        order = np.argsort(numbers, kind="stable")
        bounds = np.searchsorted(numbers[order], np.arange(self.partitions + 1))
        for part in range(self.partitions):
            lo, hi = int(bounds[part]), int(bounds[part + 1])
            if hi > lo:
                self.blocks[part].append(block.take(order[lo:hi]))
        self.pending += len(block)
        if self.pending >= self.most:
            yield from self.flush()

    def flush(self) -> Iterator[bytes]:
        """``pack_long(partition)`` and the pickled batch of every non-empty partition."""
        from pyspark.serializers import pack_long

        dumps = self.serializer.dumps
        for part in range(self.partitions):
            if self.records[part]:
                batch, self.records[part] = self.records[part], []
                yield pack_long(part)
                yield dumps(batch)
            elif self.blocks[part]:
                blocks, self.blocks[part] = self.blocks[part], []
                yield pack_long(part)
                yield dumps(PairArrays.concat(blocks))
                del blocks
        self.pending = 0
