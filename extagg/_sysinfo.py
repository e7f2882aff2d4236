"""Process memory figures for metrics, tests and benchmarks (measured, never used for decisions)."""

from __future__ import annotations

import sys

import psutil

__all__ = ["current_rss", "peak_rss"]


def current_rss() -> int:
    """Resident set size of this process now, in bytes."""
    return int(psutil.Process().memory_info().rss)


def peak_rss() -> int:
    """Peak resident set size of this process so far, in bytes (``ru_maxrss``)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return current_rss()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
