"""Keys and aggregate arguments that are expressions over the input's columns —
``--by 'year(l_shipdate)'``, ``sum(l_extendedprice * (1 - l_discount))``, as DuckDB's and
Spark's ``GROUP BY expr`` and ``SUM(expr)`` — computed for each batch as columns the engine
aggregates (a key ``unnest(list)`` makes a row of each element, as DuckDB's); and
:func:`aggregate`, :func:`extagg.columnar.aggregate` with them, on Arrow data in memory
(:func:`extagg.aggregate_files` plans its own for files).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from extagg._names import split_key_aliases
from extagg.errors import ExpressionError, ExpressionOverflowError, QueryError
from extagg.io.where import (
    ParsedExpression,
    StructField,
    eager_cast,
    parse_expression,
    shared_subexpressions,
    struct_field,
)

__all__ = [
    "AggregateArguments",
    "ComputedColumn",
    "aggregate",
    "result_columns",
    "split_aggregate_expressions",
    "with_computed",
]


class ComputedColumn:
    """An aggregate's argument that is an expression over the input's columns (``sum(price *
    (1 - discount))``, DuckDB's and Spark's ``SUM(expr)``): computed for every batch by the
    ``--where`` grammar's eager kernels and aggregated as a column named by its text. A 256-bit
    decimal (a product past 38 digits of precision) is narrowed to ``decimal(38, scale)``,
    which the aggregates take; a value past 38 digits there is an error naming the aggregate."""

    def __init__(
        self,
        text: str,
        name: str,
        parsed: ParsedExpression,
        typ: pa.DataType,
        key: bool = False,
        unnest: bool = False,
    ) -> None:
        self.text = text
        #: a key (``--by 'year(d)'``): the result's column, named as given
        self.key = key
        #: a key ``unnest(list)``: :attr:`parsed` gives lists, each row becomes one per element
        #: (:func:`with_computed`), ``typ`` is the elements' type
        self.unnest = unnest
        #: the column's name in the batches: its text in parentheses, which no input column
        #: read beside it has (the input may have one named as the text: ``a-b``)
        self.name = name
        self.parsed = parsed
        self.type = typ
        wide = pa.types.is_decimal256(typ) and typ.scale <= 38 and not unnest
        self.narrowed = pa.decimal128(38, typ.scale) if wide else None

    def values(self, batch: Any) -> Any:
        """The expression's values for the rows of ``batch`` (a record batch or a table).
        Arrow's errors on the values (a decimal past 38 digits) are a runtime
        :class:`~extagg.errors.ExpressionOverflowError` naming the expression, not a read
        error of the file."""
        try:
            return self._values(batch)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise ExpressionOverflowError(
                f"computing {self.text!r} failed on a batch's values: {exc}", self.text, 0
            ) from None

    def _values(self, batch: Any) -> Any:
        assert self.parsed.evaluate_values is not None
        out = self.parsed.evaluate_values(batch)
        to_arrow = getattr(out, "to_arrow", None)
        if to_arrow is not None:  # a decimal's 64-bit values: written once, narrowed already
            return to_arrow(self.narrowed)
        if isinstance(out, pa.Scalar):  # no column in it (``sum(1)``)
            out = pa.repeat(out, batch.num_rows)
        if isinstance(batch, pa.RecordBatch) and isinstance(out, pa.ChunkedArray):
            out = out.combine_chunks()
        if self.narrowed is not None:
            try:
                out = eager_cast(out, self.narrowed)
            except pa.ArrowInvalid:
                raise ExpressionOverflowError(
                    f"the values of {self.text!r} pass 38 decimal digits ({self.type}); "
                    "cast a column to double in the expression's place, or aggregate fewer "
                    "digits", self.text, 0,
                ) from None  # fmt: skip
        return out


class AggregateArguments:
    """What the query reads from the input: the keys and the aggregates' arguments, each a
    plain column or an expression (:class:`ComputedColumn`) — an unquoted text that is not a
    plain name (``--by 'year(l_shipdate)'``, ``sum(price * (1 - discount))``). One that reads
    a column the input does not have is taken for a column of its very name (a CSV header
    ``unit-price``); quoted (``sum("a-b")``) it is always one."""

    def __init__(self, keys: Sequence[str], asked: Mapping[str, Any]) -> None:
        from extagg._names import ColumnName, ExpressionText, is_plain_name

        self.columns: list[str] = []
        self.parsed: dict[str, ParsedExpression] = {}
        #: unquoted keys and arguments that do not parse: columns of that name, or this error
        self.syntax: dict[str, ExpressionError] = {}
        #: the expressions that are keys (their columns are named by their text: the result's)
        self.keys = {k for k in keys if not isinstance(k, ColumnName) and not is_plain_name(k)}
        #: the keys and arguments given as plain names (a dotted one may be a struct's field)
        self._plain_keys = {k for k in keys if not isinstance(k, ColumnName) and is_plain_name(k)}
        args = [s[0] if isinstance(s, (tuple, list)) and s else None for s in asked.values()]
        self._plain_args = {
            a for a in args
            if isinstance(a, str) and not isinstance(a, ColumnName) and is_plain_name(a)
        }  # fmt: skip
        #: the dotted names read as fields of struct columns (see :meth:`read_struct_field`)
        self.fields: dict[str, StructField] = {}
        #: the expressions that are aggregates' arguments (columns named ``(text)``)
        self.arguments = {
            a for a in args
            if isinstance(a, str) and not isinstance(a, ColumnName) and not is_plain_name(a)
        }  # fmt: skip
        #: a key ``unnest(list)`` → the list's expression (parsed as the key's)
        self.unnested: dict[str, str] = {}
        for col in [*keys, *args]:
            if not isinstance(col, str):
                continue
            inner = None if isinstance(col, ColumnName) else unnest_argument(col)
            if inner is not None:
                self._unnest(col, inner, col in self.arguments)
                continue
            if isinstance(col, ColumnName) or is_plain_name(col):
                if col not in self.columns:
                    self.columns.append(str(col))
                continue
            if col in self.parsed or col in self.syntax:
                continue
            try:
                self.parsed[col] = parse_expression(col)
            except ExpressionError as exc:
                self.columns.append(col)
                if isinstance(col, ExpressionText) or col in self.keys:
                    self.syntax[col] = exc

    def _unnest(self, text: str, inner: str, argument: bool) -> None:
        """The key ``text`` = ``unnest(inner)``: ``inner`` parsed as its expression."""
        if argument:
            raise QueryError(
                f"{text!r}: unnest() makes a row of each element of a list, so it is a key "
                f"(--by '{text} AS element'), not an aggregate's argument"
            )
        if self.unnested and text not in self.unnested:
            raise QueryError(
                f"one key may be unnest(...), not two ({next(iter(self.unnested))!r} and "
                f"{text!r}): the rows of one list's elements"
            )
        if text not in self.unnested:
            self.unnested[text] = inner
            self.parsed[text] = parse_expression(inner)

    def needed(self) -> list[str]:
        """The input columns the aggregates read."""
        read = [c for c in self.columns if c != "*"]
        for parsed in self.parsed.values():
            read.extend(parsed.columns)
        return list(dict.fromkeys(read))

    def take_as_column(self, text: str) -> None:
        """The expression ``text`` is a column of that name."""
        del self.parsed[text]
        self.columns.append(text)

    def take_as_columns(self, missing: str) -> list[str]:
        """The expressions that read ``missing`` (a column the input lacks) become columns of
        their text; those texts."""
        texts = [t for t, p in self.parsed.items() if missing in p.columns]
        for text in texts:
            del self.parsed[text]
            self.columns.append(text)
        return texts

    def read_struct_field(self, name: str, field: StructField) -> None:
        """The dotted name ``name`` (a column the input lacks) is ``field`` of a struct
        column: a key or an argument given as ``name`` becomes an expression reading that
        column (the result's key column keeps the name), and so do the expressions that
        read it."""
        self.fields[name] = field
        if name in self.columns and (name in self._plain_keys or name in self._plain_args):
            self.columns.remove(name)
            self.parsed[name] = parse_expression(name, self.fields)
            if name in self._plain_keys:
                self.keys.add(name)
            if name in self._plain_args:
                self.arguments.add(name)
        for text, parsed in list(self.parsed.items()):
            if name in parsed.columns:
                self.parsed[text] = parse_expression(self.unnested.get(text, text), self.fields)

    def struct_paths(
        self, also: Sequence[ParsedExpression] = ()
    ) -> dict[str, list[tuple[str, ...]]]:
        """The struct columns the query reads only through fields (its own expressions and
        ``also``'s: the filter), each with the fields' paths: a scan may parse those alone."""
        paths: dict[str, set[tuple[str, ...]]] = {}
        whole = set(self.columns)
        for parsed in [*self.parsed.values(), *also]:
            whole |= parsed.whole
            for root, found in parsed.paths.items():
                paths.setdefault(root, set()).update(found)
        return {root: sorted(found) for root, found in paths.items() if root not in whole}

    def read_struct_fields(self, schema: pa.Schema) -> None:
        """Every dotted name read that ``schema`` lacks and that is a field of one of its
        struct columns: read as that field (see :meth:`read_struct_field`)."""
        structs = {f.name: f.type for f in schema if pa.types.is_struct(f.type)}
        if not structs:
            return
        names = [*self.columns, *(c for p in self.parsed.values() for c in p.columns)]
        for name in dict.fromkeys(names):
            if "." in name and name not in schema.names and name not in self.fields:
                field = struct_field(name, structs)
                if field is not None:
                    self.read_struct_field(name, field)

    def computed(self, schema: pa.Schema) -> list[ComputedColumn]:
        """The expressions fitted to the input's types (an operator whose operands do not fit:
        an ``ExpressionError`` at it)."""
        out = []
        taken = set(schema.names)
        for text, parsed in self.parsed.items():
            typ = parsed.bind_value(schema)
            if text in self.unnested:
                if not (pa.types.is_list(typ) or pa.types.is_large_list(typ)):
                    if not pa.types.is_null(typ):
                        raise QueryError(
                            f"{text!r}: unnest() takes a list (a JSON array, a Parquet list), "
                            f"not {typ}"
                        )
                    typ = pa.list_(pa.null())  # null wherever read: no rows
                out.append(ComputedColumn(text, text, parsed, typ.value_type, True, True))
                continue
            if text in self.keys:  # the result's key column, named as the key was given
                out.append(ComputedColumn(text, text, parsed, typ, key=True))
            if text in self.arguments:
                name = f"({text})"
                while name in taken:
                    name = f"({name})"
                taken.add(name)
                out.append(ComputedColumn(text, name, parsed, typ))
        return out


def with_computed(
    batch: Any, computed: Sequence[ComputedColumn], keep: Iterable[str] | None = None
) -> Any:
    """``batch`` (a record batch or a table) with the computed keys and aggregate arguments
    appended (see :class:`ComputedColumn`). With a key ``unnest(list)``, each row becomes one
    row per element of its list (none for an empty or null list), the element the key's
    value, as DuckDB's ``unnest``: the rest is computed on the rows as read (an expression of
    a row is the same on each of its copies) and the rows are then repeated, of their columns
    only ``keep`` (those the aggregation reads; ``None``: all) and the computed ones — not the
    struct a field was computed from, nor the lists."""
    unnest = next((column for column in computed if column.unnest), None)
    if unnest is not None:
        computed = [column for column in computed if column is not unnest]
    with shared_subexpressions():  # of one batch: appending makes another
        values = [column.values(batch) for column in computed]
        lists = None if unnest is None else unnest.values(batch)
    for column, array in zip(computed, values, strict=True):
        batch = batch.append_column(column.name, array)
    if unnest is None:
        return batch
    assert lists is not None
    if keep is not None:
        kept = {*keep, *(column.name for column in computed)}
        batch = batch.select([name for name in batch.schema.names if name in kept])
    return _unnested(batch, unnest, lists)


def _unnested(batch: Any, unnest: ComputedColumn, lists: Any) -> Any:
    """``batch``'s rows repeated once per element of its row's list in ``lists``, the
    elements appended as ``unnest``'s column."""
    import pyarrow.compute as pc

    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    if pa.types.is_null(lists.type):
        lists = pa.array([None] * len(lists), pa.list_(pa.null()))
    parents = pc.list_parent_indices(lists)
    return batch.take(parents).append_column(unnest.name, pc.list_flatten(lists))


def unnest_argument(text: str) -> str | None:
    """The list expression of a key ``unnest(...)`` (DuckDB's), or ``None`` for another."""
    import re

    head = re.match(r"\s*unnest\s*\(", text, re.IGNORECASE)
    if head is None:
        return None
    close_at = _closing(text, head.end() - 1)
    if close_at < 0 or text[close_at + 1 :].strip():
        return None
    return text[head.end() : close_at]


def computed_aggs(
    asked: Mapping[str, Any], computed: Sequence[ComputedColumn]
) -> Mapping[str, Any]:
    """``asked`` with each expression argument replaced by its computed column's name."""
    from extagg._names import ColumnName

    named = {c.text: c.name for c in computed if not c.key}
    return {
        out: (named[spec[0]], *spec[1:])
        if isinstance(spec, (tuple, list))
        and spec[0] in named
        and not isinstance(spec[0], ColumnName)
        else spec
        for out, spec in asked.items()
    }


def aggregate(
    source: Any,
    keys: str | Sequence[str],
    aggs: Mapping[str, tuple[str, str]] | Sequence[str] | str,
    *,
    progress: bool | Callable[..., None] = False,
    **options: Any,
) -> pa.Table:
    """Group ``source`` by ``keys`` and compute ``aggs`` in one call; returns a ``pyarrow.Table``.

    :func:`extagg.columnar.aggregate` (the same parameters, result and errors), whose keys
    and aggregates' arguments may also be expressions over the input's columns, in the
    grammar of ``extagg aggregate --where`` (docs/files.md): ``aggregate(t, "year(d)",
    {"rev": ("price * (1 - disc)", "sum")})``, or ``["rev=sum(price * (1 - disc))"]``. A
    key expression's result column is named by its text. A text that is a column of the
    input is that column (``unit-price``), whatever it would parse as.

    Parameters
    ----------
    source
        One batch (pyarrow ``RecordBatch`` or ``Table``, pandas ``DataFrame``, dict of NumPy
        arrays), a ``pyarrow.RecordBatchReader``, a ``pyarrow.dataset.Dataset`` (scanned with
        only the columns the query reads), an object that exports Arrow data by its PyCapsule
        interface (a Polars ``DataFrame``, a DuckDB relation), or an iterable of batches (read
        lazily). With expressions, pandas and dicts are converted with ``pyarrow``.
    keys
        Grouping column names or expressions.
    aggs
        Output name → ``(column or expression, function)``; ``("*", "count")`` counts rows.
        Or the ``extagg aggregate --agg`` texts: ``["n=count(*)", "total=sum(amount)"]``.
    progress
        ``True`` shows a bar of rows folded on stderr; a callable gets the live
        :class:`~extagg.metrics.SpillMetrics` after every batch.
    **options
        Passed to :class:`~extagg.HashAggregator` (``memory``, ``memory_manager``,
        ``spill_dirs``, ``threads``, ...).

    Returns
    -------
    pyarrow.Table
        Key columns then one column per aggregate, rows in key-hash order; the run's metrics
        in its schema metadata (``extagg.run_metrics(table)``).

    Raises
    ------
    ValueError, TypeError, OverflowError
        As :func:`extagg.columnar.aggregate`; :class:`~extagg.errors.QueryError` (a
        ``ValueError``) for an expression that reads a column the input lacks (the available
        ones, the closest), :class:`~extagg.errors.ExpressionError` for operands that do not
        fit their operator, :class:`~extagg.errors.ExpressionOverflowError` for a value past
        its type (a decimal past 38 digits).

    Examples
    --------
    >>> import pyarrow as pa
    >>> t = pa.table({"k": ["a", "b", "a"], "p": [10.0, 20.0, 30.0], "d": [0.5, 0.0, 0.1]})
    >>> out = aggregate(t, "k", ["rev=sum(p * (1 - d))", "n=count(*)"])
    >>> sorted(out.to_pylist(), key=lambda r: r["k"])
    [{'k': 'a', 'rev': 32.0, 'n': 2}, {'k': 'b', 'rev': 20.0, 'n': 1}]
    """
    post: list[tuple[str, str]] = []
    outputs: list[str] = []
    if isinstance(aggs, str) or (
        isinstance(aggs, Sequence) and aggs and all(isinstance(a, str) for a in aggs)
    ):  # texts: some may be expressions over aggregates (r=sum(a) / sum(b))
        engine, post, outputs = split_aggregate_expressions(
            [aggs] if isinstance(aggs, str) else list(aggs)
        )
        aggs = engine
    key_list, key_names = split_key_aliases([keys] if isinstance(keys, str) else list(keys))
    if key_names != key_list:
        repeated = sorted({k for k in key_names if key_names.count(k) > 1})
        if repeated:
            raise QueryError(f"two keys named {repeated}: give them different names")
        from extagg.columnar.functions import agg_mapping

        clash = sorted(set(key_names) & {*(agg_mapping(aggs) or ()), *outputs})
        if clash:
            raise QueryError(f"aggregate output(s) {clash} have the names of key columns")
    table = _aggregate(source, key_list, aggs, progress, options)
    if post:
        table = with_results_computed(table, post, [*key_list, *outputs])
    if key_names != key_list:
        names = [*key_names, *table.schema.names[len(key_list) :]]
        table = table.rename_columns(names).replace_schema_metadata(table.schema.metadata)
    return table


def with_results_computed(
    table: pa.Table, post: Sequence[tuple[str, str]], names: Sequence[str]
) -> pa.Table:
    """``table`` (an aggregation's result) with the expressions over its aggregates ``post``
    (``(output, expression text)``) computed, and only ``names``, in that order."""
    columns = result_columns([(name, parse_expression(text)) for name, text in post], table.schema)
    out = with_computed(table, columns).select(list(names))
    return out.replace_schema_metadata(table.schema.metadata)


def result_columns(
    post: Sequence[tuple[str, ParsedExpression]], schema: pa.Schema
) -> list[ComputedColumn]:
    """The expressions over aggregates ``post`` fitted to the result's ``schema``, as
    columns named by their outputs (operands that do not fit: a usage error naming it)."""
    columns = []
    for name, parsed in post:
        try:
            typ = parsed.bind_value(schema)
        except ExpressionError as exc:
            raise QueryError(f"aggregate {name!r}: {exc.reason}") from None
        columns.append(ComputedColumn(name, name, parsed, typ))
    return columns


def _aggregate(
    source: Any, keys: str | Sequence[str], aggs: Any, progress: Any, options: dict[str, Any]
) -> pa.Table:
    """:func:`aggregate` of plain aggregates (of columns or expressions over columns)."""
    from extagg.columnar.api import aggregate as aggregate_columns
    from extagg.columnar.functions import NO_AGGREGATES, agg_mapping

    asked = agg_mapping(aggs)
    key_list = [keys] if isinstance(keys, str) else list(keys)
    arguments = AggregateArguments(key_list, {} if asked is NO_AGGREGATES else asked)
    structs = False  # whether a dotted name may be a field of a struct column of the source
    if any("." in c for c in arguments.columns):
        structs, source = _holds_arrow(source)
    if not arguments.parsed and not structs:
        return aggregate_columns(source, keys, aggs, progress=progress, **options)
    schema, batches = _arrow_batches(source, arguments)
    for text, parsed in list(arguments.parsed.items()):
        if text in schema.names:  # a column named like an expression (``unit-price``)
            arguments.take_as_column(text)
            continue
        missing = [c for c in parsed.columns if c not in schema.names]
        if missing:
            raise _unknown(missing[0], schema.names, f"in {text!r}")
    if not arguments.parsed:
        reader = pa.RecordBatchReader.from_batches(schema, batches)  # the types, even of none
        return aggregate_columns(reader, keys, aggs, progress=progress, **options)
    for text, error in arguments.syntax.items():
        if text not in schema.names:
            raise _unknown(
                text, schema.names,
                f"(read as an expression, it fails: {error.reason} at position {error.position})",
            )  # fmt: skip
    computed = arguments.computed(schema)
    out = aggregate_columns(
        (with_computed(batch, computed) for batch in batches),
        keys,
        computed_aggs(asked, computed) if asked is not NO_AGGREGATES else asked,
        progress=progress,
        **options,
    )
    return out


def _unknown(name: str, available: Sequence[str], where: str) -> QueryError:
    from extagg.io.inputs import unknown_column

    error = unknown_column(name, available)
    error.args = (f"{error.args[0]} {where}",)
    return error


def _holds_arrow(source: Any) -> tuple[bool, Any]:
    """Whether ``source`` holds Arrow data (pyarrow's batches, tables, readers, datasets, an
    Arrow stream export, an iterable whose first item is a pyarrow batch or table), and
    ``source`` to read from then (an iterable's first item put back). pandas and dicts do
    not: their columns go to the engine as they are."""
    from extagg.columnar.columns import is_batch, is_dataset

    if isinstance(source, (pa.RecordBatch, pa.Table, pa.RecordBatchReader)) or is_dataset(source):
        return True, source
    if is_batch(source):  # pandas (whose frames export Arrow streams too), a dict
        return False, source
    if hasattr(source, "__arrow_c_stream__") or type(source).__name__ in ("Scanner", "LazyFrame"):
        return True, source
    try:
        items = iter(source)
    except TypeError:
        return False, source  # the engine's error names what it takes
    first = next(items, None)
    if first is None:
        return False, iter(())
    return isinstance(first, (pa.RecordBatch, pa.Table)), itertools.chain([first], items)


def _arrow_batches(
    source: Any, arguments: AggregateArguments
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """``source`` as its schema and its record batches (a dataset scanned for the columns
    the query reads; pandas and dicts converted), read lazily."""
    from extagg.columnar.columns import arrow_stream, is_batch, is_dataset

    stream = arrow_stream(source)
    if stream is not None:
        source = stream
    if is_dataset(source):
        names = source.schema.names
        arguments.read_struct_fields(source.schema)
        read = [c for c in arguments.needed() if c in names]
        source = source.scanner(columns=read).to_reader()
    if isinstance(source, pa.RecordBatchReader):
        arguments.read_struct_fields(source.schema)
        return source.schema, iter(source)
    if is_batch(source):
        table = _as_arrow(source)
        arguments.read_struct_fields(table.schema)
        return table.schema, iter(table.to_batches())
    try:
        items: Iterable[Any] = iter(source)
    except TypeError:
        raise TypeError(
            "aggregate()'s source must be a pyarrow RecordBatch, Table, RecordBatchReader or "
            "Dataset, a pandas DataFrame, a dict of NumPy arrays, or an iterable of them; not "
            f"{type(source).__module__}.{type(source).__qualname__}"
        ) from None
    converted = (_as_arrow(item) for item in items)
    first = next(converted, None)
    if first is None:
        raise QueryError("aggregate() with expressions needs at least one batch (their types)")
    arguments.read_struct_fields(first.schema)
    return first.schema, _record_batches(first, converted)


def _record_batches(first: pa.Table, rest: Iterator[pa.Table]) -> Iterator[pa.RecordBatch]:
    yield from first.to_batches()
    for table in rest:
        yield from table.to_batches()


def _as_arrow(obj: Any) -> pa.Table:
    """One batch as an Arrow table: pandas through ``pyarrow.Table.from_pandas`` (no index),
    a dict of arrays through ``pyarrow.table``."""
    if isinstance(obj, pa.Table):
        return obj
    if isinstance(obj, pa.RecordBatch):
        return pa.Table.from_batches([obj])
    if isinstance(obj, Mapping):
        return pa.table(dict(obj))
    if type(obj).__name__ == "DataFrame" and hasattr(obj, "columns"):
        return pa.Table.from_pandas(obj, preserve_index=False)
    raise TypeError(
        f"aggregate() with expressions reads Arrow data; not {type(obj).__module__}."
        f"{type(obj).__qualname__}"
    )


def split_aggregate_expressions(
    texts: Sequence[str],
) -> tuple[Sequence[str] | dict[str, Any], list[tuple[str, str]], list[str]]:
    """``--agg`` texts, some of which may be expressions over aggregates (``r=sum(a) /
    sum(b)``, ``pct=100.0 * count(*) / count(x)``, TPC-H Q14's ``100 * sum(case ...) /
    sum(...)``), as (the aggregates the engine computes: ``texts`` itself when there is no
    such expression, else ``{output: (column, function)}`` where each call inside an
    expression is one more aggregate named by its text, equal calls computed once; the
    expressions to compute on the result, over those names; the output names in the order
    given)."""
    from extagg.columnar.functions import (
        ALIASES,
        DISTINCT_FUNCTIONS,
        FUNCTIONS,
        QUANTILE_ALIASES,
        QUANTILE_FUNCTIONS,
        REWRITTEN,
        parse_agg_texts,
    )

    known = {
        f.lower()
        for f in (*FUNCTIONS, *DISTINCT_FUNCTIONS, *ALIASES, *REWRITTEN, *QUANTILE_FUNCTIONS,
                  *QUANTILE_ALIASES, "size")
    }  # fmt: skip
    engine: dict[str, Any] = {}
    post: list[tuple[str, str]] = []
    outputs: list[str] = []
    for text in texts:
        name, rest = _named(text)
        calls = _aggregate_calls(rest, known) if name is not None else []
        if not calls or (len(calls) == 1 and calls[0] == (0, len(rest))):
            one = parse_agg_texts([text])  # one aggregate, or its own error
            engine.update(one)
            outputs.extend(one)
            continue
        assert name is not None
        pieces, at = [], 0
        for start, end in calls:
            call = rest[start:end].strip()
            ((_, spec),) = parse_agg_texts([call]).items()
            if engine.setdefault(call, spec) != spec:
                raise QueryError(f"an aggregate is named {call!r}, as a call in {text!r} is")
            pieces += [rest[at:start], '"' + call.replace('"', '""') + '"']
            at = end
        pieces.append(rest[at:])
        post.append((name, "".join(pieces)))
        outputs.append(name)
    return (engine if post else texts), post, outputs


def _named(text: str) -> tuple[str | None, str]:
    """``"name = rest"`` as (name, rest), or (``None``, text) without a name (an operator
    or a parenthesis before any ``=``)."""
    from extagg._names import outside_quotes

    for i, c, depth in outside_quotes(text):
        if c == "=" and depth == 0:
            if text[i + 1 : i + 2] == "=":
                break  # a comparison, not a name
            name = text[:i].strip()
            return (name or None), text[i + 1 :].strip()
        if c in "(<>!":
            break
    return None, text.strip()


def _aggregate_calls(text: str, known: set[str]) -> list[tuple[int, int]]:
    """The ``(start, end)`` of each call of an aggregate function (``sum(...)``) in ``text``,
    outside quotes, outermost only."""
    calls: list[tuple[int, int]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "'\"`":
            close = text.find(c, i + 1)
            i = n if close < 0 else close + 1
            continue
        if c.isalpha() or c == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] in "_."):
                j += 1
            k = j
            while k < n and text[k] == " ":
                k += 1
            if text[i:j].lower() in known and k < n and text[k] == "(":
                end = _closing(text, k)
                if end < 0:
                    return []  # unbalanced: the aggregate's own error says so
                calls.append((i, end + 1))
                i = end + 1
                continue
            i = j
            continue
        i += 1
    return calls


def _closing(text: str, open_at: int) -> int:
    """The index of the parenthesis closing the one at ``open_at`` (quotes skipped), or -1."""
    from extagg._names import outside_quotes

    for i, c, depth in outside_quotes(text, open_at):
        if c == ")" and depth == 0:
            return i
    return -1
