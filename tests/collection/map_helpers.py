"""Key types for the collection tests: Spark's FixedHashObject and Java-hashed strings."""

from __future__ import annotations

from typing import Any


class FixedHashObject:
    """Spark's test key whose hash is fixed (0 or 1 there): equal hashes, unequal keys."""

    __slots__ = ("hash_value", "value")

    def __init__(self, value: Any, hash_value: int) -> None:
        self.value = value
        self.hash_value = hash_value

    def __hash__(self) -> int:
        return self.hash_value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FixedHashObject) and other.value == self.value

    def __repr__(self) -> str:
        return f"FixedHashObject({self.value!r}, {self.hash_value})"


def java_hash(s: str) -> int:
    """Java's ``String.hashCode`` (int32): ``"Aa"`` and ``"BB"`` both give 2112."""
    h = 0
    for ch in s:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


class JavaString(str):
    """A str hashed like Java, so the classic colliding pairs collide here too."""

    __slots__ = ()

    def __hash__(self) -> int:
        return java_hash(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and str.__eq__(self, other)


def sum_create(v: Any) -> Any:
    return v


def sum_merge(c: Any, v: Any) -> Any:
    return c + v


def dict_fold(reference: dict, keys: list, values: list) -> None:
    """The plain-dict combineByKey the map must agree with."""
    for k, v in zip(keys, values):
        reference[k] = reference[k] + v if k in reference else v
