"""Options of the state readers, checked as Spark's state data source checks them.

Shared by the extagg-format readers (:mod:`extagg.state.reader`) and Spark's
(:mod:`extagg.state.spark.reader`), so both raise the same errors for the same option.
"""

from __future__ import annotations

from typing import Any

from extagg.state.errors import StateSourceOptionError

__all__ = ["check_batch_option", "check_store_name_option", "first_pair", "merge_pair"]


def check_batch_option(name: str, value: Any, required: bool = False) -> int | None:
    """An id option: ``None`` (unless required), else a non-negative int."""
    if value is None:
        if required:
            raise StateSourceOptionError(
                name,
                f"[STDS_REQUIRED_OPTION_UNSPECIFIED] '{name}' must be specified.",
                error_class="STDS_REQUIRED_OPTION_UNSPECIFIED",
            )
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"source option '{name}' must be an int, not {type(value).__name__}")
    if value < 0:
        raise StateSourceOptionError(
            name,
            f"[STDS_INVALID_OPTION_VALUE.IS_NEGATIVE] Invalid value for source option '{name}': "
            "cannot be negative.",
            error_class="STDS_INVALID_OPTION_VALUE.IS_NEGATIVE",
        )
    return value


def check_store_name_option(value: Any, name: str = "store_name") -> str:
    """``store_name`` trimmed; empty is an error (Spark: IS_EMPTY)."""
    if not isinstance(value, str):
        raise TypeError(f"source option '{name}' must be a str, not {type(value).__name__}")
    trimmed = value.strip()
    if not trimmed:
        raise StateSourceOptionError(
            name,
            f"[STDS_INVALID_OPTION_VALUE.IS_EMPTY] Invalid value for source option '{name}': "
            "cannot be empty.",
            error_class="STDS_INVALID_OPTION_VALUE.IS_EMPTY",
        )
    return trimmed


def first_pair(value: tuple[Any, Any]) -> tuple[Any, Any]:
    """A diff's ``(old, new)`` pair as first seen (the external map's ``create_combiner``)."""
    return value


def merge_pair(c1: tuple[Any, Any], c2: tuple[Any, Any]) -> tuple[Any, Any]:
    """Two partial ``(old, new)`` pairs of one key: each side keeps the value it has."""
    return (c1[0] if c2[0] is None else c2[0], c1[1] if c2[1] is None else c2[1])
