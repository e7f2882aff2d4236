"""``extagg aggregate``: group the rows of Parquet/CSV/JSON Lines/Arrow files from the shell.

Exit status: 0 success; 2 usage error (unknown column or function, bad size, bad expression,
bad option); 1 runtime failure (unreadable input, disk full); 130 interrupted (Ctrl-C), after
removing spill files and any partial output. Progress goes to stderr (on a terminal, unless
``--quiet`` or ``EXTAGG_PROGRESS=0``), then a one-paragraph summary; results go to ``-o``.
"""

from __future__ import annotations

import argparse
import errno
import importlib.abc
import json
import os
import sys
from typing import Any

__all__ = [
    "add_aggregate_command",
    "import_arrow_without_pandas",
    "return_freed_pages_sooner",
    "run_aggregate",
    "use_returning_memory_pool",
]

SHOW_ROWS = 20


def add_aggregate_command(sub: Any) -> None:
    """Register ``aggregate`` on the ``extagg`` parser's subcommands."""
    p = sub.add_parser(
        "aggregate",
        help="group the rows of Parquet/CSV/JSON Lines/Arrow files (larger than memory)",
        description="Group the rows of files by keys and compute aggregates, in bounded memory. "
        "Results come in hash order of the keys unless --sort or --order-by is given.",
    )
    p.add_argument(
        "paths",
        nargs="+",
        help="files, globs or directories (hive key=value dirs); - for standard input",
    )
    p.add_argument(
        "--by", action="append", default=[],
        help="key columns or expressions, comma separated (e.g. 'year(d) AS y,k'; a field of "
        "a JSON object or Parquet struct: payload.geo.country); quote a name with spaces or "
        "commas: '\" name\",x'",
    )  # fmt: skip
    p.add_argument(
        "--agg",
        action="append",
        default=[],
        metavar="NAME=FUNC(COL)",
        help="an aggregate, e.g. 'n=count(*)', 'total=sum(amount)', 'r=sum(p * (1 - d))', "
        "'u=count(distinct x)', 'avg_d=sum(p * d) / sum(p)' (repeatable); none: the distinct "
        "values of --by (SELECT DISTINCT)",
    )
    p.add_argument(
        "--where",
        help="filter on input columns, e.g. \"d <= date '1998-09-02' and lower(s) like 'a%%'\"",
    )
    p.add_argument("--having", help="filter on result columns, e.g. 'n > 10'")
    p.add_argument("--memory", help="memory budget, e.g. 256m, 2g (default: EXTAGG_MEMORY/auto)")
    p.add_argument(
        "-o",
        "--output",
        help="output file (.parquet .csv .tsv .jsonl .arrow; text also .gz .zst .bz2), - for CSV",
    )
    p.add_argument("--output-format", help="parquet, csv, tsv, jsonl or ipc (default: extension)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--sort", action="store_true", help="sort results by the keys")
    p.add_argument(
        "--order-by",
        metavar="COLS",
        help="sort results by result columns, e.g. 'n desc, user' (instead of --sort)",
    )
    p.add_argument("--limit", type=_rows_shown, metavar="N", help="keep the first N result rows")
    p.add_argument("--format", help="input format: parquet, csv, tsv, json, ipc")
    p.add_argument(
        "--delimiter",
        help="CSV field delimiter (default: tab for .tsv; for .csv a comma, or the ;, | or tab "
        "between the header's names if it has no comma)",
    )
    p.add_argument(
        "--column-types",
        help="CSV and JSON Lines column types, e.g. 'id=int64,price=decimal(15,2)' (instead of "
        "those inferred from the first block)",
    )
    p.add_argument(
        "--quote",
        default='"',
        help="the CSV/TSV quote character (default \"), or 'none' for text that quotes "
        "nothing (TSV as databases and Unix tools write it)",
    )
    p.add_argument(
        "--encoding",
        help="the encoding of CSV/TSV text not in UTF-8, e.g. latin-1, cp1252 (default: utf-8)",
    )
    p.add_argument(
        "--decimal-comma",
        action="store_true",
        help="CSV/TSV numbers are written with a decimal comma (1,5), as in ';'-separated files "
        "of locales that write them so",
    )
    p.add_argument("--schema", help="all CSV columns in order, e.g. 'id:int64,name:string'")
    p.add_argument("--no-header", action="store_true", help="CSV files have no header line")
    p.add_argument("--spill-dir", action="append", dest="spill_dirs", help="spill directory")
    p.add_argument(
        "--threads",
        type=int,
        help="fold threads (default: EXTAGG_THREADS, else the CPUs usable less one for the reader)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar, no summary")
    p.add_argument("--json-summary", metavar="FILE", help="write the run's metrics as JSON")
    p.add_argument(
        "--show", type=_rows_shown, default=SHOW_ROWS, help="rows shown without -o (0: the count)"
    )


def _rows_shown(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"give a number of rows, 0 or more, not {text!r}")
    return value


def _schema(text: str | None) -> Any:
    if not text:
        return None
    import pyarrow as pa

    from extagg.io.inputs import parse_column_types

    return pa.schema(list(parse_column_types(text).items()))


class _NoPandas(importlib.abc.MetaPathFinder):
    """Makes ``import pandas`` fail while installed (see :func:`import_arrow_without_pandas`)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError(f"{name} is not needed by extagg aggregate")
        return None


def import_arrow_without_pandas() -> None:
    """Import ``pyarrow.dataset`` without importing pandas.

    pyarrow's pandas shim tries ``import pandas`` the first time any value goes through
    ``pyarrow.scalar``, which ``pyarrow._dataset`` does when it is imported (its literal
    ``true`` expression): 0.4-0.9 s and ~40 MiB of RSS in a process that reads files and never
    sees a DataFrame. That one probe is made to fail, so the shim records "no pandas" for its
    silent checks (``pyarrow.array`` then treats no argument as a pandas object, and none is
    one here); an explicit conversion (``to_pandas()``) still imports pandas. Only the command
    line does this, as it owns its process: the library leaves a user's pyarrow as it is.
    """
    if "pyarrow.dataset" in sys.modules or "pandas" in sys.modules:
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        import pyarrow.dataset  # noqa: F401
    finally:
        sys.meta_path.remove(finder)


def use_returning_memory_pool() -> None:
    """Make Arrow's default memory pool one that returns freed memory to the system.

    Arrow's default pool in its Linux wheels is mimalloc, which keeps freed pages for reuse:
    on TPC-H Q1 at a 32 MiB budget the process peaked 62 MiB above its fixed RSS with it,
    17 MiB with jemalloc (decay 1 s), 20 MiB with the C library's malloc, for the same
    batches. Arrow reads the choice from ``ARROW_DEFAULT_MEMORY_POOL`` once, when pyarrow is
    imported (``pyarrow.set_memory_pool`` does not reach the Parquet reader's own
    allocations), so this must run first: jemalloc on Linux (in Arrow's wheels there), the
    system allocator elsewhere. A value the user set is obeyed. Only the command line does
    this, as it owns its process.
    """
    if "pyarrow" in sys.modules:
        return
    os.environ.setdefault(
        "ARROW_DEFAULT_MEMORY_POOL", "jemalloc" if sys.platform.startswith("linux") else "system"
    )


#: how long (ms) jemalloc keeps freed pages before it returns them (Arrow's default: 1 000)
JEMALLOC_DECAY_MS = 100


def return_freed_pages_sooner() -> None:
    """Let Arrow's jemalloc return freed pages after :data:`JEMALLOC_DECAY_MS` instead of a
    second.

    Why: the pages the scan's batches freed stay resident for up to a second while the merge
    allocates its own (NumPy's, from the C heap): the demo's Q2 (1 M groups, 32 MiB) peaked
    43.6-45.7 MiB above its fixed RSS, 36.9-41.1 with 100 ms. 0 ms (every free returned at
    once) made TPC-H SF1 Q1 3x slower; 100 ms changed neither Q1 (SF1 and SF10) nor
    ``GROUP BY l_orderkey`` at 26 MiB. Process-wide, so only the command line does it, after
    :func:`use_returning_memory_pool`; a jemalloc setting the user made
    (``JE_ARROW_MALLOC_CONF``) is obeyed, and other pools are left as they are.
    """
    if "JE_ARROW_MALLOC_CONF" in os.environ:
        return
    import pyarrow as pa

    if pa.default_memory_pool().backend_name != "jemalloc":
        return
    try:
        pa.jemalloc_set_decay_ms(JEMALLOC_DECAY_MS)
    except (NotImplementedError, pa.ArrowNotImplementedError):  # a build without jemalloc
        pass


def run_aggregate(args: argparse.Namespace) -> int:
    """Run ``extagg aggregate``; returns the exit status."""
    from extagg._interrupts import latched_interrupts

    with latched_interrupts():  # a Ctrl-C lost in a __del__ still stops the run
        return _run_aggregate(args)


def split_names(text: str) -> list[str]:
    """The column names of a ``--by`` list: separated by commas, space around them dropped; a
    name in double quotes or backticks is taken as written (``" name"``, ``"name, full"``; a
    doubled quote inside is one), as ``--agg`` and ``--where`` read quoted names. An
    unquoted key may be an expression, ``year(l_shipdate)``: its commas inside parentheses
    or '' quotes do not separate keys."""
    from extagg._names import ColumnName, split_alias  # not pyarrow: the pool is not chosen yet
    from extagg.errors import QueryError

    names: list[str] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t,":
            i += 1
        if i >= n:
            break
        if text[i] in '"`':
            start = i
            quote, i, name = text[i], i + 1, []
            while True:
                if i >= n:
                    raise QueryError(f"unterminated {quote} in --by {text!r}")
                if text[i] == quote:
                    if i + 1 < n and text[i + 1] == quote:
                        name.append(quote)
                        i += 2
                        continue
                    i += 1
                    break
                name.append(text[i])
                i += 1
            while i < n and text[i] in " \t":
                i += 1
            if i < n and text[i] != ",":
                end = _top_level_comma(text, i)
                if split_alias(text[start:end].strip())[1] is None:
                    raise QueryError(
                        f"expected ',' or 'as NAME' after a quoted name in --by {text!r}"
                    )
                names.append(text[start:end].strip())  # '"Unit price" as p': split later
                i = end
                continue
            names.append(ColumnName("".join(name)))
        else:
            end = _top_level_comma(text, i)
            names.append(text[i:end].strip())
            i = end
    return names


def _top_level_comma(text: str, start: int) -> int:
    """The index of the first comma at or after ``start`` outside parentheses and quotes
    (``''``, ``""``, backquotes; the text's length if none)."""
    from extagg._names import outside_quotes

    for i, c, depth in outside_quotes(text, start):
        if c == "," and depth <= 0:
            return i
    return len(text)


def _run_aggregate(args: argparse.Namespace) -> int:
    from extagg._progress import progress_enabled
    from extagg._spooled_input import SpooledInputs
    from extagg.errors import QueryError

    query = None
    progress = not args.quiet and progress_enabled(True)
    spooled = SpooledInputs(args.paths, args.format, args.spill_dirs, progress)
    try:
        by = [name for group in args.by for name in split_names(group)]
        if not args.agg and not by:
            raise QueryError(
                "give --by (its distinct values) or at least one --agg, e.g. --agg 'n=count(*)'"
            )
        _check_early(args)  # before pyarrow and the kernels load (~0.8 s): typos fail at once
        use_returning_memory_pool()
        import_arrow_without_pandas()
        return_freed_pages_sooner()
        from extagg.io.run import plan_query

        aggs = list(args.agg) if args.agg else None  # None: the distinct keys

        output = args.output
        fmt = None
        if output is not None:
            from extagg._input_paths import output_problem
            from extagg.io.output import output_format

            fmt = output_format(output, args.output_format)
            problem = output_problem(output, args.overwrite)
            if problem is not None:
                raise QueryError(problem)
        if args.json_summary:
            _check_summary_path(args, output)
        spooled.copy_streams()  # standard input and pipes copied to files, after the checks
        query = plan_query(
            spooled.paths, by=by, aggs=aggs, where=args.where, having=args.having,
            memory=args.memory, spill_dirs=args.spill_dirs, sort=args.sort,
            order_by=args.order_by, limit=args.limit, format=args.format,
            delimiter=args.delimiter, column_types=_column_types(args.column_types),
            schema=_schema(args.schema), header=not args.no_header, threads=args.threads,
            encoding=args.encoding, quote=args.quote, decimal_comma=args.decimal_comma,
        )  # fmt: skip
        from extagg._input_paths import output_is_an_input

        clash = output_is_an_input(output, query.scan.files)
        if clash is not None:
            raise QueryError(clash)
        _execute(query, args, output, fmt)
    except QueryError as exc:
        _close(query)
        print(f"extagg aggregate: error: {spooled.described(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _close(query)
        print("extagg aggregate: interrupted; spill files and partial output removed",
              file=sys.stderr)  # fmt: skip
        return 130
    except (ValueError, TypeError, OSError, MemoryError, ArithmeticError,
            NotImplementedError) as exc:  # fmt: skip
        # runtime: input, disk, budget, a sum past its type's range, a type Arrow cannot
        # convert or sort (its ArrowNotImplementedError)
        _close(query)
        if _reader_of_stdout_left(exc):
            return 128 + 13  # as a command killed by SIGPIPE, without a word
        print(f"extagg aggregate: error: {spooled.described(str(exc))}", file=sys.stderr)
        return 1
    finally:
        spooled.remove()
    return 0


def _reader_of_stdout_left(exc: BaseException) -> bool:
    """Whether ``exc`` is a write to standard output whose reader has gone (``-o - | head``:
    ``head`` took its lines and left). Standard output then goes to ``/dev/null``, so that
    the interpreter's last flush does not fail again."""
    broken = isinstance(exc, BrokenPipeError) or getattr(exc, "errno", None) == errno.EPIPE
    if not broken and "Broken pipe" not in str(exc):
        return False
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor (a test's captured stdout)
        pass
    return True


def _check_early(args: argparse.Namespace) -> None:
    """The checks that need no pyarrow: the input paths exist (a runtime error, as when
    read), the budget is a size the engines can run in and the settings from the environment
    are readable (usage errors: a bad ``EXTAGG_MAX_SPILL_BYTES`` failed at the first spill)."""
    from extagg._config import env_size
    from extagg._input_paths import expand_input_paths
    from extagg._spooled_input import is_stream
    from extagg.errors import QueryError
    from extagg.memory.unified import resolve_wait_timeout

    files = [p for p in args.paths if not is_stream(p)]
    if files or not args.paths:
        expand_input_paths(files)
    try:
        env_size("EXTAGG_MAX_SPILL_BYTES")
        resolve_wait_timeout(None)
    except (TypeError, ValueError) as exc:
        raise QueryError(str(exc)) from None
    if args.memory is not None:
        from extagg._config import parse_size
        from extagg.memory import check_engine_budget

        try:
            check_engine_budget(parse_size(args.memory, name="memory"))
        except (TypeError, ValueError) as exc:
            raise QueryError(str(exc)) from None


def _check_summary_path(args: argparse.Namespace, output: str | None) -> None:
    """``--json-summary``'s file: as ``-o`` (an existing file needs ``--overwrite``, its
    directory must exist), and neither the output nor an input (it replaced either, exit 0)."""
    from extagg._input_paths import expand_input_paths, output_problem
    from extagg.errors import QueryError

    summary = args.json_summary
    problem = output_problem(summary, args.overwrite)
    if problem is not None:
        raise QueryError(f"--json-summary: {problem}")
    if output not in (None, "-") and _same_path(summary, output):
        raise QueryError(f"--json-summary {summary} is the output (-o): give another file")
    if not os.path.exists(summary):
        return
    for path, _ in expand_input_paths(args.paths):
        if os.path.samefile(summary, path):
            raise QueryError(f"--json-summary {summary} is an input: give another file")


def _same_path(a: str, b: str) -> bool:
    """Whether two paths name one file, existing or not (``out.csv`` and ``./out.csv``)."""
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def _column_types(text: str | None) -> Any:
    if not text:
        return None
    from extagg.io.inputs import parse_column_types

    return parse_column_types(text)


def _close(query: Any) -> None:
    if query is not None:
        query.close()


def _execute(query: Any, args: argparse.Namespace, output: str | None, fmt: str | None) -> None:
    from extagg._interrupts import raise_if_interrupted
    from extagg._progress import progress_bar, progress_enabled
    from extagg.io.run import bar_options, make_bar_callback

    show_bar = not args.quiet and progress_enabled(True)
    bar = progress_bar(enabled=show_bar, leave=False, **bar_options(query.metrics))
    summary_written = False
    try:
        reader = query.run(make_bar_callback(bar) if show_bar else None)
        if output is not None:
            from extagg.io.output import ResultWriter

            assert fmt is not None
            with ResultWriter(output, fmt, reader.schema, overwrite=args.overwrite) as writer:
                for batch in reader:
                    writer.write(batch)
                raise_if_interrupted()  # before the output appears under its name
                if args.json_summary and output != "-":
                    # before the output is renamed into place: a summary that cannot be
                    # written (a full disk, Ctrl-C) leaves the old output as it was
                    _write_summary(args, output, query.metrics)
                    summary_written = True
            if output == "-":
                sys.stdout.flush()
        else:
            bar.close()
            _print_table(reader, args.show)
    finally:
        bar.close()
    m = query.metrics
    if not args.quiet:
        print(m.summary(), file=sys.stderr)
    if args.json_summary and not summary_written:
        _write_summary(args, output, m)


def _write_summary(args: argparse.Namespace, output: str | None, metrics: Any) -> None:
    """``--json-summary``: the run's metrics as JSON, written whole or not at all."""
    from extagg.errors import OutputError
    from extagg.io.output import atomic_output

    info = {"paths": list(args.paths), "output": output, **metrics.as_dict()}
    text = json.dumps(info, indent=2) + "\n"
    path = args.json_summary
    try:
        with atomic_output(path) as f:  # a reader never sees half a summary
            f.write(text.encode("utf-8"))
    except OSError as exc:
        if isinstance(exc, OutputError):
            raise
        folder = os.path.dirname(os.path.abspath(path))
        code = getattr(exc, "errno", None)
        reason = exc.strerror or str(exc)
        if code == errno.ENOSPC:
            reason = f"disk full ({reason})"
        raise OutputError(
            f"cannot write the summary {path}: {reason}", directory=folder,
            bytes_needed=len(text), errno=code,
        ) from exc  # fmt: skip


def _print_table(reader: Any, limit: int) -> None:
    """The first ``limit`` rows as an aligned table, then the row count; reads all batches."""
    import pyarrow as pa

    shown: list[Any] = []
    have = 0
    total = 0
    for batch in reader:
        total += batch.num_rows
        if have < limit:
            part = batch.slice(0, limit - have)
            shown.append(part)
            have += part.num_rows
    out = sys.stdout
    if limit <= 0:  # --show 0: the count alone
        out.write(f"{_rows(total)}\n")
        out.flush()
        return
    from extagg.io.output import dates_beyond_python_as_text

    table = dates_beyond_python_as_text(pa.Table.from_batches(shown, schema=reader.schema))
    names = table.column_names
    cols = [[_cell(v) for v in table.column(n).to_pylist()] for n in names]
    numeric = [
        pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
        for t in table.schema.types
    ]
    widths = [max([len(n), *(len(c) for c in col)]) for n, col in zip(names, cols)]
    out.write("  ".join(n.rjust(w) if r else n.ljust(w) for n, w, r in zip(names, widths, numeric)))
    out.write("\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for i in range(table.num_rows):
        cells = (c[i].rjust(w) if r else c[i].ljust(w) for c, w, r in zip(cols, widths, numeric))
        out.write("  ".join(cells).rstrip() + "\n")
    more = f" (first {table.num_rows} shown; -o FILE writes all)" if total > table.num_rows else ""
    out.write(f"{_rows(total)}{more}\n")
    out.flush()


def _rows(n: int) -> str:
    return f"{n:,} row{'' if n == 1 else 's'}"


#: control characters shown escaped in the table (a newline in a value broke its rows)
_ESCAPES = {
    **{c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]},
    ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t",
}  # fmt: skip


def _cell(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e15 else f"{value:.6e}"
    if type(value).__name__ == "MonthDayNano":  # pyarrow's interval: as DuckDB shows it
        from extagg.io.output import interval_text

        return interval_text(value)
    return str(value).translate(_ESCAPES)
