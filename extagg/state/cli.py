"""``extagg state show|changes|metadata <checkpoint>``: print a checkpoint's state.

The main CLI wires these in with :func:`add_state_subcommands` and dispatches to
:func:`run_state_command`. Rows stream to the output (text, CSV or JSON lines) or to a Parquet
file written batch by batch, so a state larger than memory can be dumped.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import decimal
import io
import json
import math
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from extagg.errors import CorruptFileError, ExtaggError
from extagg.state import spark as spark_state
from extagg.state.atomic import atomic_open
from extagg.state.reader import (
    is_spark_checkpoint,
    read_change_feed,
    read_diff,
    read_metadata,
    read_state,
)
from extagg.state.rows import Rows

__all__ = ["add_state_subcommands", "run_state_command", "main"]

FORMATS = ("table", "text", "csv", "jsonl", "parquet")


def _add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="output format (default: the --output file's extension, .csv, .jsonl/.json, "
        ".parquet, .txt/.tsv for table; else table -- tab-separated text --, and Parquet for "
        "export)",
    )
    parser.add_argument(
        "--output",
        "-o",
        help="write to this file instead of standard output (-o -: standard output)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing --output file"
    )
    parser.add_argument("--limit", type=int, default=None, help="print at most this many rows")


def _add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="checkpoint directory (holds state/ and commits/)")
    parser.add_argument("--operator-id", type=int, default=0, help="operator id (default 0)")
    parser.add_argument("--store-name", default="default", help="store name (default 'default')")
    parser.add_argument("--partition-id", type=int, default=None, help="only this partition")


def add_state_subcommands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``state`` (with ``show``, ``changes``, ``metadata``) to an argparse subparsers object.

    The parsed namespace has ``state_command`` and ``handler=run_state_command``.
    """
    state = subparsers.add_parser(
        "state",
        help="read a checkpoint's state store: a version, the change feed, the metadata",
        description="Read the state store of a checkpoint: extagg's own, or one written by "
        "Spark Structured Streaming (HDFS-backed provider), detected from its files.",
    )
    commands = state.add_subparsers(
        dest="state_command", metavar="{show,changes,metadata,diff,export}"
    )
    commands.required = True

    show = commands.add_parser("show", help="the state at a batch (default: the last committed)")
    _add_store_options(show)
    show.add_argument("--batch-id", type=int, default=None, help="batch to read")
    show.add_argument(
        "--snapshot-start-batch-id",
        type=int,
        default=None,
        help="rebuild from this batch's snapshot file (needs --partition-id)",
    )
    show.add_argument(
        "--join-side",
        choices=("left", "right"),
        default=None,
        help="Spark stream-stream join: one side's state (its stores recombined)",
    )
    _add_output_options(show)

    diff = commands.add_parser("diff", help="keys added, removed or changed between two batches")
    _add_store_options(diff)
    diff.add_argument("--from-batch", type=int, required=True, help="the older batch")
    diff.add_argument("--to-batch", type=int, required=True, help="the newer batch")
    _add_output_options(diff)

    export = commands.add_parser(
        "export", help="write the state at a batch to a file (Parquet unless --format says)"
    )
    _add_store_options(export)
    export.add_argument("--batch-id", type=int, default=None, help="batch to export")
    export.add_argument(
        "--join-side",
        choices=("left", "right"),
        default=None,
        help="Spark stream-stream join: one side's state (its stores recombined)",
    )
    _add_output_options(export)

    changes = commands.add_parser("changes", help="the change feed between batches")
    _add_store_options(changes)
    changes.add_argument("--start-batch-id", type=int, required=True, help="first batch")
    changes.add_argument("--end-batch-id", type=int, default=None, help="last batch")
    _add_output_options(changes)

    metadata = commands.add_parser("metadata", help="operators and stores of the checkpoint")
    metadata.add_argument("checkpoint", help="checkpoint directory")
    _add_output_options(metadata)

    state.set_defaults(handler=run_state_command)
    return state


def _rows_for(args: argparse.Namespace) -> Rows[Any]:
    if args.state_command in ("show", "export") and getattr(args, "join_side", None):
        if not is_spark_checkpoint(args.checkpoint):
            raise ValueError("--join-side applies to Spark checkpoints only")
        return spark_state.read_state(
            args.checkpoint,
            batch_id=args.batch_id,
            operator_id=args.operator_id,
            partition_id=args.partition_id,
            snapshot_start_batch_id=getattr(args, "snapshot_start_batch_id", None),
            join_side=args.join_side,
            store_name=args.store_name,  # not ignored: Spark refuses it beside joinSide
        )
    if args.state_command == "export":
        return read_state(
            args.checkpoint,
            batch_id=args.batch_id,
            operator_id=args.operator_id,
            store_name=args.store_name,
            partition_id=args.partition_id,
        )
    if args.state_command == "diff":
        return read_diff(
            args.checkpoint,
            args.from_batch,
            args.to_batch,
            operator_id=args.operator_id,
            store_name=args.store_name,
        )
    if args.state_command == "show":
        return read_state(
            args.checkpoint,
            batch_id=args.batch_id,
            operator_id=args.operator_id,
            store_name=args.store_name,
            partition_id=args.partition_id,
            snapshot_start_batch_id=args.snapshot_start_batch_id,
        )
    if args.state_command == "changes":
        return read_change_feed(
            args.checkpoint,
            args.start_batch_id,
            args.end_batch_id,
            operator_id=args.operator_id,
            store_name=args.store_name,
            partition_id=args.partition_id,
        )
    if args.state_command == "metadata":
        return read_metadata(args.checkpoint)
    raise ValueError(f"unknown state command {args.state_command!r}")


def _text_cell(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (spark_state.SparkRow, decimal.Decimal, dt.date, dt.timedelta)):
        return json.dumps(_json_value(value), ensure_ascii=False, allow_nan=False)
    return value if isinstance(value, str) else repr(value)


#: what the tab-separated table escapes in a cell (a tab or a newline in a key broke its row)
_TABLE_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _table_cell(value: Any) -> str:
    return _text_cell(value).translate(_TABLE_ESCAPES)


def _json_value(value: Any) -> Any:
    if isinstance(value, spark_state.SparkRow):
        names = spark_state.unique_names(value.__fields__)
        return {name: _json_value(item) for name, item in zip(names, value)}
    if isinstance(value, float) and not math.isfinite(value):
        # JSON has no such numbers (bare NaN is refused by strict readers): Spark's strings
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    if isinstance(value, (tuple, list)):
        return [_json_value(item) for item in value]
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dt.timedelta):
        return _iso_duration(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _iso_duration(value: dt.timedelta) -> str:
    """An ISO 8601 duration, days and time exact to the microsecond: ``P1DT2H3M4.5S``,
    ``-P0DT0H0M0.000001S`` (JSON has no duration; ``repr`` gave
    ``datetime.timedelta(days=1)``)."""
    micros = value // dt.timedelta(microseconds=1)
    sign, micros = ("-", -micros) if micros < 0 else ("", micros)
    days, micros = divmod(micros, 86_400_000_000)
    hours, micros = divmod(micros, 3_600_000_000)
    minutes, micros = divmod(micros, 60_000_000)
    seconds, micros = divmod(micros, 1_000_000)
    second_text = f"{seconds}.{micros:06d}".rstrip("0").rstrip(".") if micros else str(seconds)
    return f"{sign}P{days}DT{hours}H{minutes}M{second_text}S"


def _limited(rows: Iterable[Any], limit: int | None) -> Iterable[Any]:
    if limit is None:
        yield from rows
        return
    for count, row in enumerate(rows):
        if count >= limit:
            return
        yield row


def _write_rows(rows: Rows[Any], fmt: str, out: TextIO, limit: int | None) -> int:
    count = 0
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(rows.fields)
        for row in _limited(rows, limit):
            writer.writerow(["" if v is None else _text_cell(v) for v in row])
            count += 1
    elif fmt == "jsonl":
        for row in _limited(rows, limit):
            fields = {k: _json_value(v) for k, v in zip(rows.fields, row)}
            out.write(json.dumps(fields, allow_nan=False) + "\n")
            count += 1
    else:
        out.write("\t".join(rows.fields) + "\n")
        for row in _limited(rows, limit):
            out.write("\t".join(_table_cell(v) for v in row) + "\n")
            count += 1
    return count


def _write_parquet(
    rows: Rows[Any], path: str, limit: int | None, stdout: TextIO | None = None
) -> int:
    """Write ``rows`` as Parquet to ``path`` (atomically), or to ``stdout``'s binary buffer
    when ``path`` is ``-`` (as ``extagg aggregate -o - --output-format parquet`` does)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    limited = rows.limited(limit)
    writer = None
    count = 0
    if path == "-":
        binary = getattr(stdout if stdout is not None else sys.stdout, "buffer", None)
        if binary is None:
            raise ValueError("standard output takes no binary data here; give -o FILE")
        target: Any = contextlib.nullcontext(binary)
    else:
        target = atomic_open(path)  # the file appears only complete
    try:
        with target as handle:
            try:
                for batch in limited.iter_batches():
                    if writer is None:
                        writer = pq.ParquetWriter(handle, batch.schema)
                    elif batch.schema != writer.schema:
                        batch = batch.cast(writer.schema)
                    writer.write_batch(batch)
                    count += batch.num_rows
                if writer is None:  # no rows: an empty table with the fixed column types
                    table = limited.to_arrow()
                    pq.write_table(table, handle)
            finally:
                if writer is not None:
                    writer.close()
            handle.flush()
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        # keys (or values) of several types in one column: a Python state store takes them
        raise TypeError(
            f"cannot write {path} as Parquet: {exc}; Parquet holds one type per column: "
            "--format jsonl or csv writes each row as it is"
        ) from None
    return count


def run_state_command(
    args: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run a parsed ``state`` command; returns the exit status (0 ok, 1 error, 2 a usage
    error: an existing output without ``--overwrite`` — as ``extagg aggregate`` refuses it:
    the file was replaced silently —, an output whose format cannot be told, an output
    missing where the format needs a file)."""
    stdout = sys.stdout if stdout is None else stdout
    stderr = sys.stderr if stderr is None else stderr
    fmt = args.format
    to_stdout = args.output == "-"  # what the output errors suggest, as for `extagg aggregate`
    if fmt is None:
        extension = os.path.splitext(args.output or "")[1].lower().lstrip(".")
        default = "parquet" if args.state_command == "export" else "text"
        known = {"csv": "csv", "jsonl": "jsonl", "json": "jsonl", "ndjson": "jsonl",
                 "parquet": "parquet", "pq": "parquet", "txt": "text", "tsv": "text",
                 "tab": "text"}  # fmt: skip
        if extension and extension not in known and not to_stdout:
            stderr.write(
                f"extagg state {args.state_command}: error: cannot tell the output format of "
                f"{args.output!r} from its extension; give --format ({', '.join(FORMATS)})\n"
            )
            return 2
        fmt = known.get(extension, default)
    if fmt == "table":
        fmt = "text"
    usage = None
    if args.state_command == "export" and not args.output:
        usage = "state export needs --output FILE"
    elif fmt == "parquet" and not args.output:
        usage = "--format parquet needs --output FILE (-o - for standard output)"
    if usage is not None:  # usage errors, before anything is read: exit 2
        stderr.write(f"extagg state {args.state_command}: error: {usage}\n")
        return 2
    if args.output and not to_stdout:
        from extagg._input_paths import output_problem

        problem = output_problem(args.output, getattr(args, "overwrite", False))
        if problem is not None:
            stderr.write(f"extagg state {args.state_command}: error: {problem}\n")
            return 2
    try:
        if os.path.exists(args.checkpoint) and not os.path.isdir(args.checkpoint):
            raise ValueError(
                f"{args.checkpoint} is a file; give the checkpoint directory (it holds state/ "
                "and commits/)"
            )
        if args.limit is not None and args.limit < 0:
            raise ValueError(f"--limit cannot be negative, got {args.limit}")
        rows = _rows_for(args)
        if args.state_command == "metadata":
            listed = rows.to_list()
            if not listed:
                raise ValueError(
                    f"no readable operator metadata in {args.checkpoint} (state/<op>/_metadata)"
                )
            rows = Rows(lambda: iter(listed), rows.fields, rows.types, rows.arrow_types)
        if fmt == "parquet":
            _write_parquet(rows, args.output, args.limit, stdout)
        elif args.output and not to_stdout:
            with atomic_open(args.output) as raw:  # the file appears only complete
                # a lone surrogate (str keys may hold one) escaped (\ud800), not an error mid-output
                text = io.TextIOWrapper(
                    raw, encoding="utf-8", errors="backslashreplace", newline=""
                )
                _write_rows(rows, fmt, text, args.limit)
                text.flush()
                text.detach()
        else:
            reconfigure = getattr(stdout, "reconfigure", None)
            if reconfigure is not None:  # as for a file: a lone surrogate escaped
                reconfigure(errors="backslashreplace")
            _write_rows(rows, fmt, stdout, args.limit)
            stdout.flush()
    except BrokenPipeError:  # e.g. piped into `head`
        return 0
    except (ExtaggError, CorruptFileError, OSError, ValueError, TypeError) as exc:
        stderr.write(f"extagg state {args.state_command}: error: {exc}\n")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m extagg.state.cli show <checkpoint> ...``."""
    parser = argparse.ArgumentParser(prog="extagg")
    add_state_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["state", *(argv if argv is not None else sys.argv[1:])])
    return run_state_command(args)


if __name__ == "__main__":
    sys.exit(main())
