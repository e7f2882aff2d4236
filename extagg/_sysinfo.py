"""Process memory figures for metrics, tests and benchmarks (measured, never used for
decisions), and the PID namespace a process id means something in."""

from __future__ import annotations

import os
import sys

import psutil

__all__ = ["current_rss", "peak_rss", "pid_namespace", "reset_peak_rss"]


def pid_namespace() -> str:
    """The inode number of this process's PID namespace (``/proc/self/ns/pid``), or ``""``
    where there is none to read. Two containers sharing a host name (``--uts=host``,
    Kubernetes ``hostNetwork``) and a disk have different ones: a pid seen in a file name
    written from the other is not a process here, nor proof that its writer is gone."""
    try:
        link = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return "".join(ch for ch in link if ch.isdigit())


def current_rss() -> int:
    """Resident set size of this process now, in bytes."""
    return int(psutil.Process().memory_info().rss)


def peak_rss() -> int:
    """Peak resident set size of this process so far, in bytes.

    On Linux this is ``VmHWM`` of ``/proc/self/status``, which belongs to this process image
    only: ``ru_maxrss`` can carry the parent's peak over a fork+exec, overstating a child's.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return current_rss()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (``VmHWM``) to the current RSS, so that
    :func:`peak_rss` measures from now on (Linux >= 4.0); ``False`` where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return False
    return True
