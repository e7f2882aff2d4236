"""Small helpers shared by the memory modules: argument checks and byte counts in messages."""

from __future__ import annotations

import threading
from collections.abc import Hashable

from extagg._config import format_size

__all__ = ["check_bytes", "describe_bytes", "resolve_task_id"]


def check_bytes(num_bytes: int, name: str) -> int:
    """``num_bytes`` if it is an int >= 0, else ``TypeError``/``ValueError`` naming ``name``."""
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, int):
        raise TypeError(f"{name} must be an int byte count, not {type(num_bytes).__name__}")
    if num_bytes < 0:
        raise ValueError(f"{name} must not be negative, got {num_bytes}")
    return num_bytes


def describe_bytes(num_bytes: int) -> str:
    """``"123 bytes"`` or ``"5242880 bytes (5.0 MiB)"``: exact, and readable when large."""
    if abs(num_bytes) < 2048:
        return f"{num_bytes} bytes"
    return f"{num_bytes} bytes ({format_size(num_bytes)})"


def resolve_task_id(task_id: Hashable | None) -> Hashable:
    """``task_id``, or the current thread's id when it is ``None``."""
    return threading.get_ident() if task_id is None else task_id
