"""Spark SQL data types as found in state schema files, and their Arrow counterparts.

Schema files hold Spark's JSON form of a ``StructType`` (``DataType.json``). Only the types an
``UnsafeRow`` of a state store can hold are modelled; anything else is refused with
:class:`UnsupportedSparkTypeError` naming the type, rather than being misread.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from extagg.errors import ExtaggError

__all__ = [
    "SparkType",
    "AtomicType",
    "DecimalType",
    "StructField",
    "StructType",
    "ArrayType",
    "MapType",
    "UnsupportedSparkTypeError",
    "parse_type",
    "parse_schema",
    "to_arrow_type",
    "unique_names",
    "MAX_LONG_DIGITS",
]

#: a decimal of at most this many digits is stored as its unscaled long (Spark's MAX_LONG_DIGITS)
MAX_LONG_DIGITS = 18

#: fixed-width atomic types: name -> (bytes in an array element, struct format char)
ATOMIC_TYPES: dict[str, tuple[int, str]] = {
    "boolean": (1, "?"),
    "byte": (1, "b"),
    "short": (2, "h"),
    "integer": (4, "i"),
    "long": (8, "q"),
    "float": (4, "f"),
    "double": (8, "d"),
    "date": (4, "i"),
    "timestamp": (8, "q"),
    "timestamp_ntz": (8, "q"),
}
VARIABLE_ATOMIC = ("string", "binary")
_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(-?\d+)\s*\)")
_ALIASES = {"null": "void"}


class UnsupportedSparkTypeError(ExtaggError, ValueError):
    """A schema holds a Spark type that extagg cannot read or write in an ``UnsafeRow``."""


class SparkType(ABC):
    """Base of the modelled Spark types."""

    @abstractmethod
    def json_value(self) -> Any:
        """The type as Spark\'s JSON schema value (``DataType.jsonValue``)."""

    @abstractmethod
    def simple_string(self) -> str:
        """The type as Spark\'s ``simpleString`` (``bigint``, ``struct<k:string>``)."""


@dataclass(frozen=True)
class AtomicType(SparkType):
    """boolean, byte, short, integer, long, float, double, date, timestamp, timestamp_ntz,
    string, binary, void.

    Parameters
    ----------
    name
        Spark's JSON name of the type (``"long"``, ``"string"``, ...).
    """

    name: str

    def json_value(self) -> Any:
        """The type as Spark\'s JSON schema value (``DataType.jsonValue``)."""
        return self.name

    def simple_string(self) -> str:
        """The type as Spark\'s ``simpleString`` (``bigint``, ``struct<k:string>``)."""
        return {"integer": "int", "long": "bigint", "byte": "tinyint", "short": "smallint"}.get(
            self.name, self.name
        )


@dataclass(frozen=True)
class DecimalType(SparkType):
    """``decimal(precision, scale)``.

    Parameters
    ----------
    precision
        Total number of digits (at most 38).
    scale
        Digits after the decimal point.
    """

    precision: int
    scale: int

    def json_value(self) -> Any:
        """The type as Spark\'s JSON schema value (``DataType.jsonValue``)."""
        return f"decimal({self.precision},{self.scale})"

    def simple_string(self) -> str:
        """The type as Spark\'s ``simpleString`` (``bigint``, ``struct<k:string>``)."""
        return self.json_value()


@dataclass(frozen=True)
class StructField:
    """One field of a :class:`StructType`.

    Parameters
    ----------
    name
        The field name.
    data_type
        Its type.
    nullable
        Whether it may be null.
    metadata
        Spark's field metadata (not compared).
    """

    name: str
    data_type: SparkType
    nullable: bool = True
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def json_value(self) -> Any:
        """The type as Spark\'s JSON schema value (``DataType.jsonValue``)."""
        return {
            "name": self.name,
            "type": self.data_type.json_value(),
            "nullable": self.nullable,
            "metadata": self.metadata,
        }


@dataclass(frozen=True)
class StructType(SparkType):
    """A struct (row) type: the schema of a state store's keys or values.

    Parameters
    ----------
    fields
        Its fields, in order.
    """

    fields: tuple[StructField, ...]

    def json_value(self) -> Any:
        """The type as Spark\'s JSON schema value (``DataType.jsonValue``)."""
        return {"type": "struct", "fields": [f.json_value() for f in self.fields]}

    def json(self) -> str:
        """Spark's compact JSON (``StructType.json``), as schema files hold it."""
        return json.dumps(self.json_value(), separators=(",", ":"), ensure_ascii=False)

    def simple_string(self) -> str:
        """The type as Spark\'s ``simpleString`` (``bigint``, ``struct<k:string>``)."""
        inner = ",".join(f"{f.name}:{f.data_type.simple_string()}" for f in self.fields)
        return f"struct<{inner}>"

    @property
    def names(self) -> list[str]:
        """The field names, in order."""
        return [f.name for f in self.fields]


@dataclass(frozen=True)
class ArrayType(SparkType):
    """``array<element_type>``.

    Parameters
    ----------
    element_type
        Type of the elements.
    contains_null
        Whether elements may be null.
    """

    element_type: SparkType
    contains_null: bool = True

    def json_value(self) -> Any:
        """The type as Spark\'s JSON schema value (``DataType.jsonValue``)."""
        return {
            "type": "array",
            "elementType": self.element_type.json_value(),
            "containsNull": self.contains_null,
        }

    def simple_string(self) -> str:
        """The type as Spark\'s ``simpleString`` (``bigint``, ``struct<k:string>``)."""
        return f"array<{self.element_type.simple_string()}>"


@dataclass(frozen=True)
class MapType(SparkType):
    """``map<key_type, value_type>``.

    Parameters
    ----------
    key_type
        Type of the keys.
    value_type
        Type of the values.
    value_contains_null
        Whether values may be null.
    """

    key_type: SparkType
    value_type: SparkType
    value_contains_null: bool = True

    def json_value(self) -> Any:
        """The type as Spark\'s JSON schema value (``DataType.jsonValue``)."""
        return {
            "type": "map",
            "keyType": self.key_type.json_value(),
            "valueType": self.value_type.json_value(),
            "valueContainsNull": self.value_contains_null,
        }

    def simple_string(self) -> str:
        """The type as Spark\'s ``simpleString`` (``bigint``, ``struct<k:string>``)."""
        return f"map<{self.key_type.simple_string()},{self.value_type.simple_string()}>"


def parse_type(value: Any) -> SparkType:
    """A Spark type from its JSON value (a name string or a dict)."""
    if isinstance(value, str):
        name = _ALIASES.get(value, value)
        if name in ATOMIC_TYPES or name in VARIABLE_ATOMIC or name == "void":
            return AtomicType(name)
        if name == "decimal":
            return DecimalType(10, 0)
        match = _DECIMAL.fullmatch(name)
        if match:
            precision, scale = int(match.group(1)), int(match.group(2))
            if not 1 <= precision <= 38 or not 0 <= scale <= precision:
                raise UnsupportedSparkTypeError(f"unsupported Spark type {value!r}")
            return DecimalType(precision, scale)
        raise UnsupportedSparkTypeError(
            f"unsupported Spark type {value!r} in a state schema (supported: "
            f"{', '.join([*ATOMIC_TYPES, *VARIABLE_ATOMIC])}, decimal(p,s), void, struct, "
            "array, map)"
        )
    if isinstance(value, dict):
        kind = value.get("type")
        if kind == "struct":
            return StructType(
                tuple(
                    StructField(
                        str(f["name"]),
                        parse_type(f["type"]),
                        bool(f.get("nullable", True)),
                        dict(f.get("metadata") or {}),
                    )
                    for f in value.get("fields", [])
                )
            )
        if kind == "array":
            return ArrayType(
                parse_type(value["elementType"]), bool(value.get("containsNull", True))
            )
        if kind == "map":
            return MapType(
                parse_type(value["keyType"]),
                parse_type(value["valueType"]),
                bool(value.get("valueContainsNull", True)),
            )
        if kind == "udt":
            return parse_type(value["sqlType"])
    raise UnsupportedSparkTypeError(f"unsupported Spark type {value!r} in a state schema")


def parse_schema(text: str | dict[str, Any]) -> StructType:
    """A ``StructType`` from Spark's JSON (text or parsed).

    Parameters
    ----------
    text
        The schema as Spark's JSON (``StructType.json()``), as a string or parsed into a dict.

    Returns
    -------
    StructType
        The schema.

    Raises
    ------
    UnsupportedSparkTypeError
        It is not a struct, or holds a type extagg does not model.
    """
    value = json.loads(text) if isinstance(text, str) else text
    parsed = parse_type(value)
    if not isinstance(parsed, StructType):
        raise UnsupportedSparkTypeError(f"a state schema must be a struct, got {text!r}")
    return parsed


def unique_names(names: Sequence[str]) -> list[str]:
    """``names`` with repeats numbered as pandas numbers repeated CSV headers (``sum``,
    ``sum.1``): an aggregation buffer has one ``sum`` per ``sum()``, and a JSON object built
    by name kept only the last of them.

    Parameters
    ----------
    names
        The field names, in order.

    Returns
    -------
    list of str
        The same names, the second and later of each repeated name numbered.
    """
    seen: dict[str, int] = {}
    unique = []
    taken = set(names)
    for name in names:
        if name not in seen:
            seen[name] = 0
            unique.append(name)
            continue
        number = seen[name]
        while True:
            number += 1
            candidate = f"{name}.{number}"
            if candidate not in taken:
                break
        seen[name] = number
        taken.add(candidate)
        unique.append(candidate)
    return unique


def to_arrow_type(data_type: SparkType) -> Any:
    """The PyArrow type extagg gives a column of ``data_type``.

    Parameters
    ----------
    data_type
        The Spark type.

    Returns
    -------
    pyarrow.DataType
        The matching Arrow type (structs, lists and maps recursively; a struct's repeated
        field names numbered: ``sum``, ``sum.1``).
    """
    import pyarrow as pa

    if isinstance(data_type, AtomicType):
        return {
            "boolean": pa.bool_(),
            "byte": pa.int8(),
            "short": pa.int16(),
            "integer": pa.int32(),
            "long": pa.int64(),
            "float": pa.float32(),
            "double": pa.float64(),
            "date": pa.date32(),
            "timestamp": pa.timestamp("us", tz="UTC"),
            "timestamp_ntz": pa.timestamp("us"),
            "string": pa.string(),
            "binary": pa.binary(),
            "void": pa.null(),
        }[data_type.name]
    if isinstance(data_type, DecimalType):
        return pa.decimal128(data_type.precision, data_type.scale)
    if isinstance(data_type, StructType):
        # repeated names numbered (an aggregation buffer's ``sum``, ``sum.1``): Spark could not
        # read a Parquet file of the struct back ([COLUMN_ALREADY_EXISTS]), nor pyarrow turn it
        # into Python dicts
        names = unique_names([f.name for f in data_type.fields])
        return pa.struct(
            [
                pa.field(name, to_arrow_type(f.data_type), f.nullable)
                for name, f in zip(names, data_type.fields)
            ]
        )
    if isinstance(data_type, ArrayType):
        return pa.list_(to_arrow_type(data_type.element_type))
    if isinstance(data_type, MapType):
        return pa.map_(to_arrow_type(data_type.key_type), to_arrow_type(data_type.value_type))
    raise UnsupportedSparkTypeError(f"no Arrow type for {data_type!r}")
