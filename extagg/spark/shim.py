"""The classes :func:`extagg.spark.install` puts in place of PySpark's shuffle mergers.

This module is pickled *by value* into the closures PySpark ships to its Python workers
(``cloudpickle.register_pickle_by_value``), so a worker can unpickle a job even when it cannot
import extagg, and then fail with a message that names the fix instead of a bare
``ModuleNotFoundError`` from deep inside the unpickler. Keep it free of module-level imports of
extagg: everything here must work in a worker that does not have it.
"""

from __future__ import annotations

import importlib
from itertools import chain
from typing import Any

__all__ = [
    "ExternalGroupBy",
    "ExternalMerger",
    "MISSING_MESSAGE",
    "ShuffleStream",
    "bucket_writer",
    "shuffle_deserializer",
]

MISSING_MESSAGE = (
    "extagg.spark.install() made this job aggregate with extagg, but this Python worker cannot "
    "import extagg ({cause}). Install extagg on every executor (the same version as the "
    "driver), or ship it with the job: spark.submit.pyFiles / --py-files / "
    "SparkContext.addPyFile with a zip of the extagg package; or call "
    "extagg.spark.uninstall() to go back to PySpark's own merger."
)


def _load(name: str, module: str = "merger") -> Any:
    try:
        loaded = importlib.import_module(f"extagg.spark.{module}")
    except ImportError as exc:
        raise ModuleNotFoundError(MISSING_MESSAGE.format(cause=exc), name="extagg") from exc
    return getattr(loaded, name)


def bucket_writer(partitions: int, serializer: Any, limit_mib: float) -> Any:
    """``partitionBy``'s map-side function (PySpark's ``add_shuffle_key``) by extagg:
    :func:`extagg.spark.shuffle.write_buckets`."""

    def add_shuffle_key(split: int, iterator: Any) -> Any:
        write = _load("write_buckets", "shuffle")
        return write(iterator, partitions, serializer, limit_mib)

    return add_shuffle_key


class ExternalMerger:
    """Stands in for ``pyspark.shuffle.ExternalMerger``; builds extagg's ``SparkMerger``."""

    def __class_getitem__(cls, _params: Any) -> Any:
        return cls  # PySpark writes ExternalMerger[K, V, C](...)

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _load("SparkMerger")(*args, **kwargs)


class ExternalGroupBy:
    """Stands in for ``pyspark.shuffle.ExternalGroupBy``; builds extagg's ``SparkGroupBy``."""

    def __class_getitem__(cls, _params: Any) -> Any:
        return cls

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _load("SparkGroupBy")(*args, **kwargs)


class ShuffleStream:
    """The records of a shuffle read by :class:`ShuffleBatches`: an iterator of pairs, as
    PySpark's ``BatchedSerializer`` gives them; a reader that can take whole batches (extagg's
    reduce-side merger) calls :meth:`extagg_batches` instead, before taking any pair."""

    def __init__(self, batches: Any) -> None:
        self._batches = batches
        self._pairs: Any = None

    def __iter__(self) -> Any:
        return self

    def __next__(self) -> Any:
        if self._pairs is None:
            self._pairs = chain.from_iterable(self._batches)
        return next(self._pairs)

    def extagg_batches(self) -> Any:
        """The unpickled batches: lists of pairs, or extagg's typed blocks (iterables of
        pairs)."""
        if self._pairs is not None:
            raise RuntimeError("ShuffleStream: pairs were taken already; the batches are gone")
        return self._batches


_deserializer_class: list[Any] = []


def shuffle_deserializer(serializer: Any) -> Any:
    """The deserializer of a shuffle extagg wrote: PySpark's ``BatchedSerializer(serializer)``
    (the same pairs) whose ``load_stream`` gives a :class:`ShuffleStream`, so that extagg's
    merger can take whole batches. One class per process (PySpark compares deserializers)."""
    if not _deserializer_class:
        from pyspark.serializers import BatchedSerializer

        class ShuffleBatches(BatchedSerializer):
            def load_stream(self, stream: Any) -> ShuffleStream:
                return ShuffleStream(self._load_stream_without_unbatching(stream))

            def __repr__(self) -> str:
                return f"ShuffleBatches({self.serializer})"

        _deserializer_class.append(ShuffleBatches)
    return _deserializer_class[0](serializer)
