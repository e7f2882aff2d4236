"""How a :class:`~extagg.columnar.HashAggregator` sizes its working buffers for a budget.

Besides the table, the aggregator holds the temporaries of one input chunk and one spill batch
being encoded; both are accounted to the memory manager, so their sizes follow the budget: small
budgets get small chunks and small run batches (so that a merge of many runs still fits).
"""

from __future__ import annotations

from dataclasses import dataclass

from extagg.columnar.layout import BlockLayout

__all__ = [
    "BATCH_VAR_BYTES",
    "IO_COPIES",
    "MERGE_COPIES",
    "BufferPlan",
    "partition_chunks",
    "plan_buffers",
]

MAX_CHUNK_ROWS = 1 << 16
MIN_CHUNK_ROWS = 1 << 10
#: key bytes per spill batch beyond which a batch is cut short
BATCH_VAR_BYTES = 1 << 20
#: the fewest rows and key bytes a run batch is cut at when a merge limit sizes it
MIN_RUN_ROWS = 16
MIN_BATCH_VAR_BYTES = 1024
#: gathering, encoding and compressing one batch holds about this many copies of it
IO_COPIES = 3
#: merge buffers per source, in batches: its pending rows (up to about one and a half), their
#: concatenation for the combine, the combine's scratch (at most 32 bytes per row: group ids,
#: first rows, the merged order, and the hashes' copy when many pieces are sorted) and output
MERGE_COPIES = 4


@dataclass(frozen=True)
class BufferPlan:
    """Rows per input chunk and per run batch, and the bytes their buffers hold."""

    chunk_rows: int
    scratch_bytes: int  # temporaries of one input chunk (encoded keys, group ids, values)
    run_rows: int
    batch_var_bytes: int  # variable-length key bytes per run batch at most
    io_bytes: int  # one spill batch being gathered, encoded and compressed


def plan_buffers(
    layout: BlockLayout,
    columns: int,
    max_memory: int,
    batch_size: int,
    chunk_rows: int | None = None,
    chunk_share: int = 64,
    merge_limit: int | None = None,
) -> BufferPlan:
    """Size the buffers for ``max_memory``: a chunk's temporaries about ``1/chunk_share`` of it
    (1/64 next to a growing table; 1/8 for a partition's aggregator, which reads large
    batches), run batches small enough that a two-way merge fits in a sixteenth of it
    (``columns``: input columns read; ``chunk_rows``: a fixed chunk size instead), and in
    ``merge_limit`` bytes if given (an aggregator merged beside others: ``count_distinct``'s
    levels, each with a share of the budget)."""
    keys = layout.keys
    fixed = max(1, layout.fixed_row_bytes)
    per_row = keys.scratch_bytes(1, 0) + 16 * columns + 8
    rows = max(1, chunk_rows or _pow2_clamp(max_memory // (chunk_share * per_row)))
    scratch = keys.scratch_bytes(rows, 0) + rows * (16 * columns + 8)
    run_rows = min(batch_size, max(64, max_memory // (32 * fixed * MERGE_COPIES)))
    batch_var_bytes = min(BATCH_VAR_BYTES, max(4096, max_memory // 64))
    if merge_limit is not None:  # two read buffers of MERGE_COPIES batches within the limit
        per_batch = merge_limit // (2 * MERGE_COPIES)
        if keys.has_var:
            batch_var_bytes = min(batch_var_bytes, max(MIN_BATCH_VAR_BYTES, per_batch // 2))
            per_batch -= batch_var_bytes
        run_rows = min(run_rows, max(MIN_RUN_ROWS, per_batch // fixed))
    var = batch_var_bytes if keys.has_var else 0
    io_bytes = IO_COPIES * (run_rows * fixed + var)
    return BufferPlan(rows, scratch, run_rows, batch_var_bytes, io_bytes)


def partition_chunks(layout: BlockLayout, columns: int, max_memory: int) -> tuple[int, int]:
    """Rows per input chunk once the input is partitioned, and the bytes of their buffers.

    There is no table to share the memory with any more, so chunks may take an eighth of the
    budget instead of a sixty-fourth (fewer, larger writes per partition): the encoded keys
    plus two copies of the columns read (grouped by partition, then cut per partition).
    """
    per_row = layout.keys.scratch_bytes(1, 0) + 2 * 16 * columns + 16
    rows = _pow2_clamp(max_memory // (8 * per_row))
    return rows, rows * per_row


def _pow2_clamp(rows: int) -> int:
    rows = max(MIN_CHUNK_ROWS, min(MAX_CHUNK_ROWS, rows))
    return 1 << (rows.bit_length() - 1)
