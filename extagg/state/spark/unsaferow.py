"""Spark's ``UnsafeRow`` binary row format, decoded and encoded by a ``StructType``.

Layout (``UnsafeRow.java``, ``UnsafeRowWriter``, ``UnsafeArrayData``, ``UnsafeMapData``):

* a row is a null bitset of ``ceil(n / 64)`` little-endian 8-byte words, then one 8-byte slot
  per field, then a variable-length region. Primitives sit in their slot (zero-padded, little
  endian); decimals of at most 18 digits are the unscaled long; strings, binaries, big
  decimals, nested structs, arrays and maps are ``offset << 32 | size`` into the variable
  region, offsets counted from the row's start and data padded to 8 bytes. A null field has its
  bit set and a zero slot -- except a big decimal, which keeps its 16 reserved bytes and its
  offset (size 0), as Spark's generated projection writes it.
* an array is ``numElements`` (8 bytes), a null bitset of ``ceil(n / 64)`` words, the elements
  at their natural width (1, 2, 4 or 8 bytes; 8 for variable-length ones, offsets counted from
  the array's start) padded to 8 bytes, then the variable data.
* a map is the key array's size in bytes (8 bytes), the key array, then the value array.

Values: booleans, ints, floats, ``decimal.Decimal``, ``str``, ``bytes``, ``datetime.date``,
``datetime.datetime`` (UTC-aware for ``timestamp``, naive for ``timestamp_ntz``), ``dict`` for a
struct (a tuple or list by position is accepted when encoding), ``list`` for an array, a list of
``(key, value)`` pairs for a map (a ``dict`` is accepted when encoding), ``None`` for null.
Encoding is byte-for-byte what Spark writes, so the same row gives the same bytes.
"""

from __future__ import annotations

import datetime as dt
import decimal
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from extagg.state.errors import StateSourceError
from extagg.state.spark.types import (
    ATOMIC_TYPES,
    MAX_LONG_DIGITS,
    ArrayType,
    AtomicType,
    DecimalType,
    MapType,
    SparkType,
    StructType,
    UnsupportedSparkTypeError,
)

__all__ = [
    "RowDecoder",
    "RowEncoder",
    "SparkRow",
    "row_decoder",
    "row_encoder",
    "bitset_words",
]

EPOCH_DATE = dt.date(1970, 1, 1)
EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
EPOCH_NAIVE = dt.datetime(1970, 1, 1)
ONE_US = dt.timedelta(microseconds=1)

_LONG = struct.Struct("<q")
_unpack_long = _LONG.unpack_from
_pack_long = _LONG.pack_into
Reader = Callable[[bytes, int, int], Any]


class SparkRow(tuple[Any, ...]):
    """A struct value: a tuple of field values that knows its field names (names may repeat,
    as in Spark's aggregation buffers). Arrow converts it to a struct by position."""

    __slots__ = ()
    __fields__: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """Field name -> value (a repeated name keeps its last value)."""
        return dict(zip(self.__fields__, self))

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self.__fields__.index(name)]
        except ValueError:
            raise AttributeError(name) from None

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={v!r}" for n, v in zip(self.__fields__, self))
        return f"Row({inner})"

    def __reduce__(self) -> tuple[Any, ...]:  # picklable (spills) despite per-schema classes
        return (make_row, (self.__fields__, tuple(self)))


_ROW_CLASSES: dict[tuple[str, ...], type[SparkRow]] = {}


def row_class(names: Sequence[str]) -> type[SparkRow]:
    """The :class:`SparkRow` subclass for one struct's field names (one class per names)."""
    key = tuple(names)
    cls = _ROW_CLASSES.get(key)
    if cls is None:
        cls = _ROW_CLASSES[key] = type("Row", (SparkRow,), {"__slots__": (), "__fields__": key})
    return cls


def make_row(names: Sequence[str], values: Sequence[Any]) -> SparkRow:
    """A :class:`SparkRow` of ``values`` named ``names``."""
    return row_class(names)(values)


def bitset_words(num_fields: int) -> int:
    """8-byte words of a null bitset for ``num_fields`` bits."""
    return (num_fields + 63) // 64


def _element_width(data_type: SparkType) -> int:
    if isinstance(data_type, AtomicType) and data_type.name in ATOMIC_TYPES:
        return ATOMIC_TYPES[data_type.name][0]
    if isinstance(data_type, AtomicType) and data_type.name == "void":
        return 1
    return 8


# ------------------------------------------------------------------------------------ decoding
def _beyond_python(what: str, count: int, unit: str) -> StateSourceError:
    """Spark holds dates and timestamps of years past 9999 (``+10000-01-01``); Python's
    ``datetime`` cannot (a bare ``OverflowError`` stopped the read, naming nothing)."""
    return StateSourceError(
        f"a {what} {count} {unit} from 1970-01-01 is outside Python's years 1 to 9999: "
        "this state cannot be read into Python values",
        error_class="DATETIME_OVERFLOW",
    )


def _epoch_plus(epoch: Any, what: str, unit: str) -> Callable[[int], Any]:
    def add(count: int) -> Any:
        try:
            return epoch + dt.timedelta(**{unit: count})
        except OverflowError:
            raise _beyond_python(what, count, unit) from None

    return add


def _fixed_reader(name: str, raw: bool = False) -> Reader:
    unpack = struct.Struct("<" + ATOMIC_TYPES[name][1]).unpack_from
    if raw and name in ("date", "timestamp", "timestamp_ntz"):  # days / microseconds
        return lambda buf, base, pos: unpack(buf, pos)[0]
    if name == "date":
        day = _epoch_plus(EPOCH_DATE, "date", "days")
        return lambda buf, base, pos: day(unpack(buf, pos)[0])
    if name == "timestamp":
        instant = _epoch_plus(EPOCH_UTC, "timestamp", "microseconds")
        return lambda buf, base, pos: instant(unpack(buf, pos)[0])
    if name == "timestamp_ntz":
        wall = _epoch_plus(EPOCH_NAIVE, "timestamp", "microseconds")
        return lambda buf, base, pos: wall(unpack(buf, pos)[0])
    if name == "boolean":
        return lambda buf, base, pos: buf[pos] != 0
    return lambda buf, base, pos: unpack(buf, pos)[0]


def _decimal(unscaled: int, scale: int) -> decimal.Decimal:
    return decimal.Decimal(f"{unscaled}E-{scale}") if scale else decimal.Decimal(unscaled)


def _reader(data_type: SparkType, raw: bool = False) -> Reader:
    if isinstance(data_type, AtomicType):
        name = data_type.name
        if name in ATOMIC_TYPES:
            return _fixed_reader(name, raw)
        if name == "void":
            return lambda buf, base, pos: None

        def variable(buf: bytes, base: int, pos: int, text: bool = name == "string") -> Any:
            word = _unpack_long(buf, pos)[0]
            start = base + (word >> 32)
            data = bytes(buf[start : start + (word & 0xFFFFFFFF)])
            return data.decode("utf-8", "surrogateescape") if text else data

        return variable
    if isinstance(data_type, DecimalType):
        scale = data_type.scale
        if data_type.precision <= MAX_LONG_DIGITS:
            return lambda buf, base, pos: _decimal(_unpack_long(buf, pos)[0], scale)

        def big(buf: bytes, base: int, pos: int) -> Any:
            word = _unpack_long(buf, pos)[0]
            start = base + (word >> 32)
            raw = buf[start : start + (word & 0xFFFFFFFF)]
            return _decimal(int.from_bytes(raw, "big", signed=True), scale)

        return big
    if isinstance(data_type, StructType):
        decode = RowDecoder(data_type, raw_datetimes=raw).decode_at
        return lambda buf, base, pos: decode(buf, base + (_unpack_long(buf, pos)[0] >> 32))
    if isinstance(data_type, ArrayType):
        decode_array = _array_decoder(data_type.element_type, raw)
        return lambda buf, base, pos: decode_array(buf, base + (_unpack_long(buf, pos)[0] >> 32))
    if isinstance(data_type, MapType):
        keys = _array_decoder(data_type.key_type, raw)
        values = _array_decoder(data_type.value_type, raw)

        def decode_map(buf: bytes, base: int, pos: int) -> Any:
            start = base + (_unpack_long(buf, pos)[0] >> 32)
            key_bytes = _unpack_long(buf, start)[0]
            return list(zip(keys(buf, start + 8), values(buf, start + 8 + key_bytes)))

        return decode_map
    raise UnsupportedSparkTypeError(f"cannot decode Spark type {data_type!r}")


def _array_decoder(element_type: SparkType, raw: bool = False) -> Callable[[bytes, int], list[Any]]:
    read = _reader(element_type, raw)
    width = _element_width(element_type)

    def decode_array(buf: bytes, start: int) -> list[Any]:
        count = _unpack_long(buf, start)[0]
        words = bitset_words(count)
        nulls = int.from_bytes(buf[start + 8 : start + 8 + 8 * words], "little")
        first = start + 8 + 8 * words
        return [
            None if (nulls >> i) & 1 else read(buf, start, first + i * width) for i in range(count)
        ]

    return decode_array


class RowDecoder:
    """Decodes ``UnsafeRow`` bytes of one schema into :class:`SparkRow` (or tuple) rows.

    Like Spark's generated projections, the per-schema decoder is generated code: one
    function with every field's read inlined (fixed-width fields read straight from the slot).

    Parameters
    ----------
    schema
        The schema of the rows.
    raw_datetimes
        Dates and timestamps as Spark stores them (days / microseconds since the epoch), the
        form Arrow's ``date32`` / ``timestamp[us]`` take: Spark's range is wider than
        ``datetime``'s years 1 to 9999, Arrow's is not.
    """

    def __init__(self, schema: StructType, raw_datetimes: bool = False) -> None:
        self.schema = schema
        self.names = tuple(schema.names)
        self._readers = [_reader(f.data_type, raw_datetimes) for f in schema.fields]
        self._bitset_bytes = 8 * bitset_words(len(self.names))
        self.fixed_size = self._bitset_bytes + 8 * len(self.names)
        self.row_class = row_class(self.names)
        self.decode_tuple = self._generate()

    def _generate(self) -> Callable[..., tuple[Any, ...]]:
        bitset = self._bitset_bytes
        namespace: dict[str, Any] = {}
        items = []
        for i, (field, read) in enumerate(zip(self.schema.fields, self._readers)):
            data_type = field.data_type
            pos = f"s + {8 * i}"
            if isinstance(data_type, AtomicType) and data_type.name in (
                "byte",
                "short",
                "integer",
                "long",
                "float",
                "double",
            ):
                fmt = ATOMIC_TYPES[data_type.name][1]
                namespace[f"u{i}"] = struct.Struct("<" + fmt).unpack_from
                expr = f"u{i}(buf, {pos})[0]"
            elif isinstance(data_type, AtomicType) and data_type.name == "boolean":
                expr = f"buf[{pos}] != 0"
            else:
                namespace[f"r{i}"] = read
                expr = f"r{i}(buf, start, {pos})"
            test = f"nulls & {1 << i}" if i < 64 else f"(nulls >> {i}) & 1"
            items.append(f"None if {test} else {expr}")
        nulls = f"int.from_bytes(buf[start : start + {bitset}], 'little')" if bitset else "0"
        body = ",\n        ".join(items)
        returned = f"(\n        {body},\n    )" if items else "()"  # struct<>: no key at all
        source = (
            "def decode_tuple(buf, start=0):\n"
            f"    nulls = {nulls}\n"
            f"    s = start + {bitset}\n"
            f"    return {returned}\n"
        )
        exec(
            compile(source, f"<UnsafeRow decoder {self.schema.simple_string()[:60]}>", "exec"),
            namespace,
        )
        return namespace["decode_tuple"]  # type: ignore[no-any-return,unused-ignore]

    def decode_at(self, buf: bytes, start: int) -> SparkRow:
        """The row whose bytes start at offset ``start`` of ``buf`` (no copy of the slice)."""
        return self.row_class(self.decode_tuple(buf, start))

    def decode(self, data: bytes) -> SparkRow:
        """One row's bytes as a :class:`SparkRow` (values by position, names attached)."""
        return self.row_class(self.decode_tuple(data, 0))


# ------------------------------------------------------------------------------------ encoding
def _round8(size: int) -> int:
    return (size + 7) & ~7


def unscaled(value: Any, data_type: DecimalType) -> int:
    """The unscaled integer of ``value`` at the type's scale (HALF_UP; too many digits: error)."""
    if not isinstance(value, decimal.Decimal):
        value = decimal.Decimal(value) if isinstance(value, int) else decimal.Decimal(str(value))
    if not value.is_finite():
        raise ValueError(f"cannot store {value} as {data_type.simple_string()}")
    sign, digits, exponent = value.as_tuple()
    unscaled = int("".join(map(str, digits)) or "0")
    shift = int(exponent) + data_type.scale
    if shift >= 0:
        unscaled *= 10**shift
    else:  # Spark's changePrecision rounds HALF_UP
        quotient, remainder = divmod(unscaled, 10**-shift)
        unscaled = quotient + (1 if 2 * remainder >= 10**-shift else 0)
    if len(str(unscaled)) > data_type.precision:
        raise ValueError(f"{value} does not fit {data_type.simple_string()}")
    return -unscaled if sign else unscaled


def big_decimal_bytes(unscaled: int) -> bytes:
    """Java's ``BigInteger.toByteArray``: minimal big-endian two's complement."""
    bits = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
    return unscaled.to_bytes(bits // 8 + 1, "big", signed=True)


def micros(value: Any, naive: bool) -> int:
    """Microseconds since the epoch of a datetime (naive = wall clock, for timestamp_ntz)."""
    if isinstance(value, int):
        return value
    if not isinstance(value, dt.datetime):
        raise TypeError(f"expected a datetime, got {type(value).__name__}")
    if naive:
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return (value - EPOCH_NAIVE) // ONE_US
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return (value - EPOCH_UTC) // ONE_US


def _fixed_bytes(data_type: SparkType, value: Any) -> bytes:
    """The little-endian bytes of a fixed-width value (at its natural width)."""
    if isinstance(data_type, DecimalType):
        return _LONG.pack(unscaled(value, data_type))
    name = data_type.name  # type: ignore[attr-defined]
    fmt = ATOMIC_TYPES[name][1]
    if name == "date":
        value = value if isinstance(value, int) else (value - EPOCH_DATE).days
    elif name in ("timestamp", "timestamp_ntz"):
        value = micros(value, name == "timestamp_ntz")
    elif name == "boolean":
        return b"\x01" if value else b"\x00"
    return struct.pack("<" + fmt, value)


def _is_fixed(data_type: SparkType) -> bool:
    return (isinstance(data_type, AtomicType) and data_type.name in ATOMIC_TYPES) or (
        isinstance(data_type, DecimalType) and data_type.precision <= MAX_LONG_DIGITS
    )


def _variable_bytes(data_type: SparkType, value: Any) -> bytes:
    """Unpadded bytes of a variable-length value (its size goes in the slot)."""
    if isinstance(data_type, AtomicType):
        if data_type.name == "string":
            if not isinstance(value, str):
                raise TypeError(f"expected a str, got {type(value).__name__}")
            return value.encode("utf-8", "surrogateescape")
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"expected bytes, got {type(value).__name__}")
        return bytes(value)
    if isinstance(data_type, DecimalType):
        return big_decimal_bytes(unscaled(value, data_type))
    if isinstance(data_type, StructType):
        return RowEncoder(data_type).encode(value)
    if isinstance(data_type, ArrayType):
        return _encode_array(data_type.element_type, value)
    if isinstance(data_type, MapType):
        pairs = list(value.items()) if isinstance(value, Mapping) else list(value)
        keys = _encode_array(data_type.key_type, [k for k, _ in pairs])
        values = _encode_array(data_type.value_type, [v for _, v in pairs])
        return _LONG.pack(len(keys)) + keys + values
    raise UnsupportedSparkTypeError(f"cannot encode Spark type {data_type!r}")


def _encode_array(element_type: SparkType, values: Sequence[Any]) -> bytes:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"expected a list for an array, got {type(values).__name__}")
    count = len(values)
    width = _element_width(element_type)
    header = 8 + 8 * bitset_words(count)
    buf = bytearray(header + _round8(width * count))
    _pack_long(buf, 0, count)
    fixed = _is_fixed(element_type)
    for i, value in enumerate(values):
        pos = header + i * width
        if value is None:
            buf[8 + i // 8] |= 1 << (i % 8)
        elif fixed:
            buf[pos : pos + width] = _fixed_bytes(element_type, value)
        elif isinstance(element_type, AtomicType) and element_type.name == "void":
            raise TypeError("a void element must be None")
        else:
            data = _variable_bytes(element_type, value)
            _pack_long(buf, pos, len(buf) << 32 | len(data))
            buf += data + bytes(_round8(len(data)) - len(data))
    return bytes(buf)


class RowEncoder:
    """Encodes rows of one schema into ``UnsafeRow`` bytes exactly as Spark writes them.

    Parameters
    ----------
    schema
        The schema of the rows.
    """

    def __init__(self, schema: StructType) -> None:
        self.schema = schema
        self.names = tuple(schema.names)
        self._types = [f.data_type for f in schema.fields]
        self._fixed = [_is_fixed(t) for t in self._types]
        self._bitset_bytes = 8 * bitset_words(len(self.names))
        self.fixed_size = self._bitset_bytes + 8 * len(self.names)

    def _values(self, row: Any) -> Sequence[Any]:
        if isinstance(row, Mapping):
            missing = [name for name in self.names if name not in row]
            if missing:
                raise ValueError(f"row {row!r} has no field(s) {missing} of {self.names}")
            return [row[name] for name in self.names]
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence):
            if len(self.names) == 1:
                return [row]
            raise TypeError(f"expected a dict or a sequence of {len(self.names)} values: {row!r}")
        if len(row) != len(self.names):
            raise ValueError(f"row {row!r} has {len(row)} values, schema has {len(self.names)}")
        return row

    def encode(self, row: Any) -> bytes:
        """The ``UnsafeRow`` bytes of ``row`` (a dict by name, or values by position)."""
        values = self._values(row)
        buf = bytearray(self.fixed_size)
        slot0 = self._bitset_bytes
        for i, (data_type, fixed, value) in enumerate(zip(self._types, self._fixed, values)):
            pos = slot0 + 8 * i
            big_decimal = isinstance(data_type, DecimalType) and not fixed
            if value is None:
                buf[i // 8] |= 1 << (i % 8)
                if big_decimal:  # keeps its 16 reserved bytes and offset, size 0
                    _pack_long(buf, pos, len(buf) << 32)
                    buf += bytes(16)
                continue
            try:
                if fixed:
                    raw = _fixed_bytes(data_type, value)
                    buf[pos : pos + len(raw)] = raw
                elif isinstance(data_type, AtomicType) and data_type.name == "void":
                    raise TypeError("a void field must be None")
                else:
                    data = _variable_bytes(data_type, value)
                    _pack_long(buf, pos, len(buf) << 32 | len(data))
                    padded = 16 if big_decimal else _round8(len(data))
                    buf += data + bytes(padded - len(data))
            except (TypeError, ValueError, struct.error, OverflowError) as exc:
                raise type(exc)(
                    f"field {self.names[i]!r} ({data_type.simple_string()}): {exc}"
                ) from None
        return bytes(buf)


def row_decoder(schema: StructType) -> RowDecoder:
    return RowDecoder(schema)


def row_encoder(schema: StructType) -> RowEncoder:
    return RowEncoder(schema)
