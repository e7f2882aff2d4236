"""Row types of the state readers and the lazy, re-iterable results that stream them.

A :class:`Rows` result reads from disk each time it is iterated, one file at a time, and can
also be turned into PyArrow record batches (bounded) or one table. Tuple keys and values become
Arrow structs with fields ``f0``, ``f1``, ... (Spark's state reader shows them as structs too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, NamedTuple, TypeVar

__all__ = ["StateRow", "ChangeRow", "MetadataRow", "Rows", "to_arrow_array"]

T = TypeVar("T", bound=tuple)

#: rows per Arrow record batch
DEFAULT_BATCH_ROWS = 65_536


class StateRow(NamedTuple):
    """One key of a state store at a version."""

    key: Any
    value: Any
    partition_id: int


class ChangeRow(NamedTuple):
    """One change of a version: ``change_type`` is ``"update"`` (a put) or ``"delete"``."""

    batch_id: int
    change_type: str
    key: Any
    value: Any
    partition_id: int


class MetadataRow(NamedTuple):
    """One operator and store of a checkpoint; batch ids from the commit log (-1 if none)."""

    operator_id: int
    operator_name: str
    store_name: str
    num_partitions: int
    min_batch_id: int
    max_batch_id: int


def to_arrow_array(values: list[Any], name: str, type_alias: str | None = None) -> Any:
    """``values`` as a PyArrow array; tuples become structs (``f0``, ``f1``, ...).

    ``type_alias`` (e.g. ``"int32"``) fixes the type; otherwise it is inferred. ``TypeError``
    names the column when the values do not fit one Arrow type.
    """
    import pyarrow as pa

    if type_alias is not None:
        return pa.array(values, type=pa.type_for_alias(type_alias))
    present = [value for value in values if value is not None]
    if present and all(type(value) is tuple for value in present):
        width = len(present[0])
        if width and all(len(value) == width for value in present):
            children = [
                to_arrow_array(
                    [None if value is None else value[i] for value in values], f"{name}.f{i}"
                )
                for i in range(width)
            ]
            mask = pa.array([value is None for value in values], type=pa.bool_())
            return pa.StructArray.from_arrays(
                children, names=[f"f{i}" for i in range(width)], mask=mask
            )
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        kinds = sorted({type(value).__name__ for value in present})
        raise TypeError(
            f"cannot convert column {name!r} to Arrow (value types: {', '.join(kinds)}): {exc}"
        ) from None


class Rows(Generic[T]):
    """A lazy result: iterate it (each iteration streams from disk again), or convert it.

    Parameters
    ----------
    produce
        Called for each iteration; returns a fresh iterator of rows.
    fields
        Column names of the rows.
    types
        Arrow type aliases by field for :meth:`to_arrow` (default: inferred).
    arrow_types
        Exact PyArrow types of some columns (e.g. Spark state's key/value structs); they take
        precedence over ``types``.
    arrow_produce
        Like ``produce``, but the rows :meth:`iter_batches` / :meth:`to_arrow` convert: values
        in the form Arrow takes for ``arrow_types`` (Spark dates and timestamps as their day /
        microsecond counts, which Arrow holds past Python's year 9999). Default ``produce``.
    """

    def __init__(
        self,
        produce: Callable[[], Iterator[T]],
        fields: tuple[str, ...],
        types: dict[str, str] | None = None,
        arrow_types: dict[str, Any] | None = None,
        arrow_produce: Callable[[], Iterator[T]] | None = None,
    ) -> None:
        self._produce = produce
        self._arrow_produce = produce if arrow_produce is None else arrow_produce
        self.fields = fields
        self.types = dict(types or {})
        #: exact PyArrow types of some columns (e.g. Spark state's key/value structs)
        self.arrow_types = dict(arrow_types or {})

    def limited(self, limit: int | None) -> Rows[T]:
        """The same rows, at most ``limit`` of them (``None``: all)."""
        if limit is None:
            return self

        def first(rows: Callable[[], Iterator[T]]) -> Callable[[], Iterator[T]]:
            def produce() -> Iterator[T]:
                for count, row in enumerate(rows()):
                    if count >= limit:
                        return
                    yield row

            return produce

        return Rows(
            first(self._produce),
            self.fields,
            self.types,
            self.arrow_types,
            first(self._arrow_produce),
        )

    def __iter__(self) -> Iterator[T]:
        return self._produce()

    def to_list(self) -> list[T]:
        """Every row in a list (holds them all)."""
        return list(self._produce())

    def _columns(self, rows: list[T]) -> list[Any]:
        import pyarrow as pa

        columns = []
        for i, name in enumerate(self.fields):
            values = [row[i] for row in rows]
            arrow_type = self.arrow_types.get(name)
            if arrow_type is not None:
                columns.append(pa.array(values, type=arrow_type))
            else:
                columns.append(to_arrow_array(values, name, self.types.get(name)))
        return columns

    def _batch(self, rows: list[T]) -> Any:
        import pyarrow as pa

        return pa.RecordBatch.from_arrays(self._columns(rows), names=list(self.fields))

    def iter_batches(self, batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[Any]:
        """PyArrow record batches of at most ``batch_rows`` rows (types inferred per batch)."""
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be positive, got {batch_rows}")
        rows: list[T] = []
        for row in self._arrow_produce():
            rows.append(row)
            if len(rows) >= batch_rows:
                yield self._batch(rows)
                rows = []
        if rows:
            yield self._batch(rows)

    def to_arrow(self) -> Any:
        """One PyArrow table of every row (types inferred over all rows)."""
        import pyarrow as pa

        rows = list(self._arrow_produce())
        return pa.Table.from_arrays(self._columns(rows), names=list(self.fields))
