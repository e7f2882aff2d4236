"""Give the C heap's free memory back to the kernel: glibc's ``malloc_trim(0)``.

Why: NumPy arrays are ``malloc``-ed. glibc keeps one heap (*arena*) per thread that allocates
and raises its mmap threshold dynamically (128 KiB up to 32 MiB) once a large block is freed,
so the per-chunk and per-spill temporaries of worker threads are then carved from the
threads' arenas and, when freed, stay resident there: the memory manager sees them given
back, the kernel does not. Measured (``benchmarks/bench_scaling.py``, 20 M rows, 10 M groups,
a 30 MiB limit, two threads): 1.84-1.91x the limit above the baseline, against 1.02-1.07x with
one thread. ``malloc_trim(0)`` walks every arena and returns its free pages (``madvise``), at
the points where a threaded aggregator has just freed much: after the last chunk, after a
thread partition spilled, after a partition's results were read, when a reading partition's
grant dropped.

Safe for a library: it changes no allocator setting (unlike ``mallopt``, which is process-wide
and permanent — a fixed ``M_MMAP_THRESHOLD`` also helped, but cost +1.1-1.3 s of system time
in page faults on an in-memory 20 M-row run, so it is left to users, via the environment
variable ``MALLOC_MMAP_THRESHOLD_``), frees only memory that no one holds, is thread-safe (it
takes each arena's lock in turn), and costs one pass over the free chunks (well under a
millisecond on the heaps measured). Elsewhere than glibc (musl, macOS, Windows) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import threading
from typing import Any

__all__ = ["keep_freed_heap_for_reuse", "release_free_memory", "trims"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_trim: Any = None  # the C function once looked up; False where there is none
_count = 0


def _lookup() -> Any:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # glibc only (musl has no malloc_trim)  # noqa: B018
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def release_free_memory() -> bool:
    """Return the free pages of every malloc arena to the kernel; ``True`` if any were
    (``False`` too where there is no glibc)."""
    global _trim, _count
    with _lock:
        if _trim is None:
            _trim = _lookup()
        if _trim is False:
            return False
        _count += 1
        fn = _trim
    return bool(fn(0))


def trims() -> int:
    """How many times :func:`release_free_memory` trimmed (tests and benchmarks)."""
    return _count


#: glibc's ``mallopt`` parameters (``malloc.h``)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: what :func:`keep_freed_heap_for_reuse` sets: blocks up to 32 MiB (glibc's own ceiling for
#: its dynamic threshold) from the heap, and up to 128 MiB of free heap kept for reuse
KEPT_MMAP_THRESHOLD = 32 << 20
KEPT_TRIM_THRESHOLD = 128 << 20


def keep_freed_heap_for_reuse() -> bool:
    """Let glibc keep freed heap memory for the next allocations instead of handing it back
    to the kernel at once — process-wide and permanent (``mallopt``), so only for a process
    extagg owns: the command line calls it, a library caller never gets it.

    Why: every scan batch makes and frees a few arrays of a few hundred KiB (columns copied out
    of Arrow, hashes, group ids). With glibc's defaults the free space at the top of the heap
    beyond twice the largest block freed so far is returned, so each batch's arrays came from
    fresh pages again: TPC-H Q1 on SF10 took 630 000 page faults and 1.7 s of system time,
    the main thread's conversion of the batches 1.0 s; with these settings 35 000 faults,
    0.3 s and 0.3 s, and the query 3.7-3.9 s -> 2.8-3.5 s wall. The peak RSS does not grow:
    what is kept is memory the process held a moment before, and the engine's
    :func:`release_free_memory` calls still return it where much was freed. Values the user set
    (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``) are obeyed. ``True`` if set."""
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # glibc only  # noqa: B018
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, KEPT_MMAP_THRESHOLD))
    done = bool(mallopt(_M_TRIM_THRESHOLD, KEPT_TRIM_THRESHOLD)) and done
    log.debug("malloc thresholds: mmap %d, trim %d (%s)", KEPT_MMAP_THRESHOLD,
              KEPT_TRIM_THRESHOLD, "set" if done else "refused")  # fmt: skip
    return done
