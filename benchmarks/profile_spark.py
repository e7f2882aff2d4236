"""Where a spilling RDD shuffle's Python time goes, stock merger against ``extagg.spark.install()``.

Runs, in this process and on one partition of records, what PySpark's Python workers run for
``reduceByKey``, ``aggregateByKey`` (tuple combiner) and ``groupByKey().mapValues(len)``: the
map side (``combineLocally``: merger ``mergeValues``, then ``items`` read by the shuffle write:
``partitionBy``'s partition function and pickling of the buckets, taken from PySpark's own
``RDD.partitionBy`` by running it on a fake RDD, extagg's while installed), and the reduce side
(the shuffle's deserializer unpickling as ``mergeCombiners`` reads, then ``items``). Each stage is timed (wall and CPU) for the stock merger
and for extagg's. No JVM: what is left of a real job's time is the JVM shuffle and the pipes.

    python benchmarks/profile_spark.py --records 750000 --keys 250000 --memory 14 --keys-type int
    python benchmarks/profile_spark.py --records 4000000 --keys 1000000 --memory 32 --maps 4
"""

from __future__ import annotations

import argparse
import gc
import operator
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

os.environ.setdefault("PYTHONHASHSEED", "0")


def add_pair(c: tuple[int, int], v: int) -> tuple[int, int]:
    return (c[0] + v, c[1] + 1)


def merge_pair(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0] + b[0], a[1] + b[1])


class _Captured(Exception):
    pass


def _fake_rdd() -> Any:
    """Enough of an RDD for PySpark's own methods to build their worker functions."""
    from pyspark.core import rdd as R
    from pyspark.serializers import CPickleSerializer

    captured: list[Any] = []

    class Fake:
        partitioner = None
        combineByKey = R.RDD.combineByKey
        reduceByKey = R.RDD.reduceByKey
        aggregateByKey = R.RDD.aggregateByKey
        groupByKey = R.RDD.groupByKey

        class ctx:
            serializer = _unbatched_serializer = CPickleSerializer()

        _jrdd_deserializer = ctx.serializer

        def _defaultReducePartitions(self) -> int:
            return 4

        def _memory_limit(self) -> float:
            return 512.0

        def mapPartitions(self, f: Any, preservesPartitioning: bool = False) -> Any:
            captured.append(f)
            raise _Captured

        def mapPartitionsWithIndex(self, f: Any, preservesPartitioning: bool = False) -> Any:
            captured.append(f)
            raise _Captured

    return Fake(), captured


def aggregators() -> dict[str, Any]:
    """The ``Aggregator`` each RDD call builds, taken from PySpark's own methods."""
    out = {}
    for call, make in (
        ("reduceByKey", lambda r: r.reduceByKey(operator.add)),
        ("aggregateByKey", lambda r: r.aggregateByKey((0, 0), add_pair, merge_pair)),
        ("groupByKey", lambda r: r.groupByKey()),
    ):
        fake, captured = _fake_rdd()
        try:
            make(fake)
        except _Captured:
            pass
        fn = captured[0]
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__))
        out[call] = cells["agg"].cell_contents
    return out


def records(n: int, keys: int, kind: str) -> list[tuple[Any, int]]:
    if kind == "int":
        return [((i * 40503) % keys, i % 1000) for i in range(n)]
    return [(f"k{(i * 2654435761) % keys}", i % 1000) for i in range(n)]


class Timer:
    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float]] = []

    def run(self, label: str, fn: Callable[..., Any], *args: Any) -> Any:
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        out = fn(*args)
        self.rows.append((label, time.perf_counter() - t, time.process_time() - c))
        return out


def shuffle_write(
    pairs: Iterable[Any], partitions: int, memory_mib: float, engine: str
) -> Iterator[bytes]:
    """``partitionBy``'s map-side function (PySpark's own, or extagg's while installed)."""
    from pyspark.core import rdd as R

    import extagg.spark as es

    fake, captured = _fake_rdd()
    if engine == "extagg":
        es.install()
    try:
        R.RDD.partitionBy(fake, partitions)
    except _Captured:
        pass
    finally:
        es.uninstall()
    return captured[0](0, iter(pairs))


def shuffle_read(chunks: list[bytes], partitions: int) -> list[list[bytes]]:
    """The pickled buckets by reduce partition, as the JVM shuffle would hand them over."""
    out: list[list[bytes]] = [[] for _ in range(partitions)]
    it = iter(chunks)
    import io

    from pyspark.serializers import read_long

    for key in it:
        out[read_long(io.BytesIO(key))].append(next(it))
    return out


def _deserializer(engine: str) -> Any:
    """The shuffled RDD's deserializer: PySpark's, or extagg's while installed (if any)."""
    from pyspark.serializers import BatchedSerializer, CPickleSerializer

    from extagg.spark import shim

    make = getattr(shim, "shuffle_deserializer", None)
    if engine == "extagg" and make is not None:
        return make(CPickleSerializer())
    return BatchedSerializer(CPickleSerializer())


def _framed(blobs: list[bytes]) -> Any:
    """A reduce task's input: the partition's pickled batches, length-framed."""
    import io

    from pyspark.serializers import NoOpSerializer

    buf = io.BytesIO()
    NoOpSerializer().dump_stream(blobs, buf)  # PySpark's own framing of raw bytes
    buf.seek(0)
    return buf


def profile(
    engine: str, call: str, data: list[Any], memory: float, partitions: int, maps: int = 1
) -> Timer:
    """Time one job's Python work: ``maps`` map tasks over ``data`` (split evenly), then the
    reduce side of every partition (``maps`` > 1: each partition gets its share of every map
    task's output, as in a real job; 1: of the one map task's)."""
    from pyspark.shuffle import ExternalGroupBy, ExternalMerger

    if engine == "extagg":
        from extagg.spark.merger import SparkGroupBy as Group
        from extagg.spark.merger import SparkMerger as Merger
    else:
        Group, Merger = ExternalGroupBy, ExternalMerger  # type: ignore[assignment,misc]
    agg = aggregators()[call]
    timer = Timer()
    by_part: list[list[bytes]] = [[] for _ in range(partitions)]
    step = -(-len(data) // maps)
    for start in range(0, len(data), step):
        merger = Merger(agg, memory * 0.9)
        timer.run("map: mergeValues", merger.mergeValues, iter(data[start : start + step]))
        # items() straight into the writer, as PySpark pipelines them (extagg's map side folds
        # lazily as the writer reads, and hands its typed groups on as arrays)
        write = "map: items + shuffle write"
        chunks = timer.run(
            write, lambda m: list(shuffle_write(m.items(), partitions, memory, engine)), merger
        )
        for part, got in enumerate(shuffle_read(chunks, partitions)):
            by_part[part] += got
        del chunks
    total = 0
    deserializer = _deserializer(engine)
    for part in by_part:
        reducer = (Group if call == "groupByKey" else Merger)(agg, memory)
        stream = deserializer.load_stream(_framed(part))  # unpickled as the merger reads
        timer.run("reduce: unpickle + mergeCombiners", reducer.mergeCombiners, stream)
        del part
        if call == "groupByKey":
            count = timer.run("reduce: items", lambda r: sum(len(v) for _, v in r.items()), reducer)
        else:
            count = timer.run("reduce: items", lambda r: len(list(r.items())), reducer)
        total += count
    timer.rows.append(("(groups)", float(total), 0.0))
    return timer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=750_000)
    parser.add_argument("--keys", type=int, default=250_000)
    parser.add_argument("--memory", type=float, default=14.4, help="worker memory, MiB")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--maps", type=int, default=1, help="map tasks (each gets records/maps records)"
    )
    parser.add_argument("--keys-type", choices=["int", "str"], default="int")
    parser.add_argument(
        "--calls", nargs="*", default=["reduceByKey", "aggregateByKey", "groupByKey"]
    )
    parser.add_argument("--engines", nargs="*", default=["stock", "extagg"])
    parser.add_argument("--cprofile", action="store_true", help="cProfile the extagg run")
    args = parser.parse_args()
    data = records(args.records, args.keys, args.keys_type)
    print(
        f"# {args.records:,} {args.keys_type} records, {args.keys:,} keys, "
        f"{args.memory} MiB, load {os.getloadavg()[0]:.1f}"
    )
    for call in args.calls:
        for engine in args.engines:
            if args.cprofile and engine == "extagg":
                import cProfile
                import pstats

                prof = cProfile.Profile()
                timer = prof.runcall(
                    profile, engine, call, data, args.memory, args.partitions, args.maps
                )
                pstats.Stats(prof).sort_stats("tottime").print_stats(18)
            else:
                timer = profile(engine, call, data, args.memory, args.partitions, args.maps)
            agg: dict[str, list[float]] = {}
            for label, wall, cpu in timer.rows:
                agg.setdefault(label, [0.0, 0.0])
                agg[label][0] += wall
                agg[label][1] += cpu
            total = sum(w for k, (w, _) in agg.items() if not k.startswith("("))
            cpu = sum(c for k, (_, c) in agg.items() if not k.startswith("("))
            parts = ", ".join(
                f"{k} {w:.2f}/{c:.2f}" if not k.startswith("(") else f"{k} {int(w)}"
                for k, (w, c) in agg.items()
            )
            print(
                f"{call:15s} {engine:7s} wall {total:6.2f} s cpu {cpu:6.2f} s | "
                f"stage wall/cpu s: {parts}",
                flush=True,
            )


if __name__ == "__main__":
    main()
