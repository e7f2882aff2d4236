"""External sort of result batches by key columns, inside the memory manager's budget.

Batches are buffered while the memory manager grants their size; when it does not, the buffer
is sorted and written as a run (an Arrow IPC file in a spill directory) and its memory given
back. The runs are then merged k ways, vectorised: each round loads one batch per run where
needed, sorts what is loaded, and emits every row up to the smallest "last loaded key" of the
runs (no unread row of any run can sort before it). Rows with equal keys keep no particular
order (result groups are unique, so there are none).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from extagg.memory import MemoryConsumer, TaskMemoryManager
from extagg.memory.task import Consumer
from extagg.metrics import RunMetrics
from extagg.spill.tempdir import SpillDirs

__all__ = ["external_sort"]

log = logging.getLogger(__name__)

RUN_BATCH_ROWS = 16_384


class _SortBuffer(MemoryConsumer):
    """Buffered result batches whose memory is granted by the task's memory manager."""

    def __init__(self, tmm: TaskMemoryManager) -> None:
        super().__init__(tmm, None)
        self.batches: list[pa.RecordBatch] = []

    def spill(self, size: int, trigger: Consumer) -> int:
        return 0  # the sorter writes its own runs when a grant falls short


def _sort_keys(keys: Sequence[str]) -> list[tuple[str, str]]:
    return [(k, "ascending") for k in keys]


def _sorted(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    idx = pc.sort_indices(table, sort_keys=_sort_keys(keys))
    return table.take(idx)


def external_sort(
    batches: Iterator[pa.RecordBatch],
    schema: pa.Schema,
    keys: Sequence[str],
    tmm: TaskMemoryManager,
    spill_dirs: Sequence[str] | str | None,
    metrics: RunMetrics | None = None,
) -> Iterator[pa.RecordBatch]:
    """``batches`` sorted by ``keys`` ascending (nulls last), in bounded memory."""
    buf = _SortBuffer(tmm)
    dirs = SpillDirs(
        list(spill_dirs) if spill_dirs is not None and not isinstance(spill_dirs, str)
        else spill_dirs
    )  # fmt: skip
    runs: list[str] = []
    try:
        for batch in batches:
            need = batch.nbytes
            got = buf.acquire_memory(need)
            if got < need:
                if got:
                    buf.free_memory(got)
                if buf.batches:
                    runs.append(_write_run(buf, schema, keys, dirs))
                    if metrics is not None:
                        metrics.sort_runs += 1
                got = buf.acquire_memory(need)  # one batch is always let through
            buf.batches.append(batch)
        if not runs:
            table = _sorted(pa.Table.from_batches(buf.batches, schema=schema), keys)
            buf.batches.clear()
            yield from table.to_batches(max_chunksize=RUN_BATCH_ROWS)
            return
        if buf.batches:
            runs.append(_write_run(buf, schema, keys, dirs))
            if metrics is not None:
                metrics.sort_runs += 1
        yield from _merge(runs, schema, keys)
    finally:
        buf.batches.clear()
        buf.close_memory()
        dirs.cleanup()


def _write_run(buf: _SortBuffer, schema: pa.Schema, keys: Sequence[str], dirs: SpillDirs) -> str:
    table = _sorted(pa.Table.from_batches(buf.batches, schema=schema), keys)
    buf.batches.clear()
    path = dirs.new_path("sort")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for batch in table.to_batches(max_chunksize=RUN_BATCH_ROWS):
            writer.write_batch(batch)
    del table
    buf.free_memory(buf.used)
    log.info("sort run %s written", path)
    return path


def _merge(paths: list[str], schema: pa.Schema, keys: Sequence[str]) -> Iterator[pa.RecordBatch]:
    readers: list[Any] = [pa.ipc.open_file(pa.memory_map(p)) for p in paths]
    next_batch = [0] * len(readers)
    last_row: list[pa.Table | None] = [None] * len(readers)  # last loaded row of each run
    carry = schema.empty_table()

    def load(i: int) -> pa.Table | None:
        r = readers[i]
        if next_batch[i] >= r.num_record_batches:
            last_row[i] = None
            return None
        b = r.get_batch(next_batch[i])
        next_batch[i] += 1
        last_row[i] = pa.Table.from_batches([b.slice(b.num_rows - 1, 1)])
        return pa.Table.from_batches([b])

    loaded = [t for t in (load(i) for i in range(len(readers))) if t is not None]
    carry = pa.concat_tables([carry, *loaded])
    while True:
        live = [i for i, row in enumerate(last_row) if row is not None]
        if not live:
            yield from _sorted(carry, keys).to_batches(max_chunksize=RUN_BATCH_ROWS)
            return
        bounds = pa.concat_tables([last_row[i] for i in live])
        first = pc.sort_indices(bounds, sort_keys=_sort_keys(keys))
        owner = live[first[0].as_py()]
        bound = last_row[owner]
        assert bound is not None
        combined = pa.concat_tables([carry, bound]).combine_chunks()
        order = pc.sort_indices(combined, sort_keys=_sort_keys(keys))
        order_np = order.to_numpy()
        sentinel = combined.num_rows - 1  # stable sort: the real row comes before its copy
        cut = int((order_np == sentinel).nonzero()[0][0])
        out = combined.take(order_np[:cut])
        carry = combined.take(order_np[cut + 1 :])
        yield from out.to_batches(max_chunksize=RUN_BATCH_ROWS)
        nxt = load(owner)
        if nxt is not None:
            carry = pa.concat_tables([carry, nxt])
