"""Default memory budget: how much ``UnifiedMemoryManager.auto()`` may manage.

The rule (explicit argument > environment variable > default):

1. An explicit ``max_memory`` (bytes or a size string such as ``"2g"``) wins.
2. Else ``EXTAGG_MEMORY`` (a size string; ``k``/``m``/``g``/``t`` are binary, ``"256m"`` =
   256 MiB) is the budget as given.
3. Else the budget is computed from the machine:

   * *available* = ``psutil.virtual_memory().available``;
   * if the process runs in a memory-limited cgroup, *available* is lowered to what the cgroup
     still allows: ``limit - (usage - inactive_file)``, where for cgroup v2 ``limit`` is
     ``memory.max`` and ``usage`` is ``memory.current``, and for cgroup v1 ``limit`` is
     ``memory.limit_in_bytes`` and ``usage`` is ``memory.usage_in_bytes``; ``inactive_file``
     (from ``memory.stat``, ``total_inactive_file`` on v1) is page cache the kernel reclaims
     before it kills anyone, as the kubelet's working-set figure does. Every cgroup from the
     process's own (read from ``/proc/self/cgroup``) up to the root is checked and the smallest
     headroom wins; a limit of ``max`` or >= 2**60 (v1's "unlimited" is 9223372036854771712)
     means no limit;
   * budget = (*available* - 300 MiB reserved for the interpreter and libraries) x 0.6,
     and at least 32 MiB (with a warning when that floor applies).

The budget is read once, when a manager is created; it does not follow later changes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import psutil

from extagg._config import MiB, env_size, format_size, parse_size

__all__ = [
    "MEMORY_ENV",
    "RESERVED_SYSTEM_MEMORY",
    "DEFAULT_MEMORY_FRACTION",
    "MIN_DEFAULT_BUDGET",
    "CGROUP_ROOT",
    "PROC_SELF_CGROUP",
    "cgroup_memory_available",
    "available_memory",
    "default_memory_budget",
    "resolve_memory_budget",
    "machine_memory_limit",
    "cap_to_machine",
]

logger = logging.getLogger(__name__)

MEMORY_ENV = "EXTAGG_MEMORY"
"""Environment variable whose size string replaces the default budget."""
#: kept out of the budget for the interpreter, numba, pyarrow... (Spark reserves 300 MiB too)
RESERVED_SYSTEM_MEMORY = 300 * MiB
"""Bytes kept out of the default budget for the interpreter and libraries (300 MiB, as Spark)."""
#: share of what remains that extagg manages (Spark's spark.memory.fraction)
DEFAULT_MEMORY_FRACTION = 0.6
"""Share of the remaining memory the default budget takes (Spark's ``spark.memory.fraction``)."""
#: the computed default never goes below this
MIN_DEFAULT_BUDGET = 32 * MiB
CGROUP_ROOT = "/sys/fs/cgroup"
PROC_SELF_CGROUP = "/proc/self/cgroup"
#: cgroup limits at or above this mean "no limit"
_UNLIMITED = 1 << 60

PathLike = str | os.PathLike[str]


def cgroup_memory_available(
    cgroup_root: PathLike = CGROUP_ROOT, proc_cgroup: PathLike = PROC_SELF_CGROUP
) -> int | None:
    """Bytes the process's cgroups still allow (limit − usage, smallest over the hierarchy).

    Parameters
    ----------
    cgroup_root
        Where the cgroup file systems are mounted (tests point it elsewhere).
    proc_cgroup
        The ``/proc/self/cgroup`` file naming this process's cgroups.

    Returns
    -------
    int or None
        ``None`` when no memory limit applies (cgroup v1 and v2 are read).
    """
    root = Path(cgroup_root)
    if (root / "cgroup.controllers").exists():  # a pure cgroup v2 mount
        base, relative = root, _own_cgroup_path(proc_cgroup, "")
        files = ("memory.max", "memory.current", "inactive_file")
    elif (root / "memory").is_dir():  # cgroup v1 memory controller
        base, relative = root / "memory", _own_cgroup_path(proc_cgroup, "memory")
        files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    else:
        return None
    headroom: int | None = None
    for directory in _ancestors(base, relative):
        free = _cgroup_headroom(directory, *files)
        if free is not None and (headroom is None or free < headroom):
            headroom = free
    return headroom


def available_memory(
    cgroup_root: PathLike = CGROUP_ROOT, proc_cgroup: PathLike = PROC_SELF_CGROUP
) -> int:
    """psutil's available memory, lowered to the cgroup's headroom when that is smaller.

    Parameters
    ----------
    cgroup_root
        Where the cgroup file systems are mounted (tests point it elsewhere).
    proc_cgroup
        The ``/proc/self/cgroup`` file naming this process's cgroups.
    """
    available = int(psutil.virtual_memory().available)
    cgroup = cgroup_memory_available(cgroup_root, proc_cgroup)
    if cgroup is not None and cgroup < available:
        logger.debug("cgroup allows %s, less than the %s available", format_size(cgroup), available)
        return cgroup
    return available


def default_memory_budget(
    *,
    cgroup_root: PathLike = CGROUP_ROOT,
    proc_cgroup: PathLike = PROC_SELF_CGROUP,
    fraction: float = DEFAULT_MEMORY_FRACTION,
    reserved: int = RESERVED_SYSTEM_MEMORY,
) -> int:
    """``(available memory − reserved) × fraction``, at least 32 MiB.

    Parameters
    ----------
    cgroup_root
        Where the cgroup file systems are mounted (tests point it elsewhere).
    proc_cgroup
        The ``/proc/self/cgroup`` file naming this process's cgroups.
    fraction
        Share of the memory left after the reserve.
    reserved
        Bytes kept for the interpreter and libraries.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"memory fraction must be in (0, 1], got {fraction!r}")
    available = available_memory(cgroup_root, proc_cgroup)
    budget = int((available - reserved) * fraction)
    if budget < MIN_DEFAULT_BUDGET:
        logger.warning(
            "only %s of memory available (%s reserved): using the minimum budget of %s; "
            "set %s to choose one",
            format_size(available),
            format_size(reserved),
            format_size(MIN_DEFAULT_BUDGET),
            MEMORY_ENV,
        )
        return MIN_DEFAULT_BUDGET
    return budget


def machine_memory_limit(
    cgroup_root: PathLike = CGROUP_ROOT, proc_cgroup: PathLike = PROC_SELF_CGROUP
) -> int:
    """The most memory this process could ever get: physical memory, lowered to the smallest
    cgroup limit on the way to the root (the limit itself, not what is still free under it).

    Parameters
    ----------
    cgroup_root
        Where the cgroup file system is mounted (tests point it elsewhere).
    proc_cgroup
        The file naming this process's cgroup (``/proc/self/cgroup``).

    Returns
    -------
    int
        The limit in bytes.
    """
    limit = int(psutil.virtual_memory().total)
    root = Path(cgroup_root)
    if (root / "cgroup.controllers").exists():
        base, relative, limit_file = root, _own_cgroup_path(proc_cgroup, ""), "memory.max"
    elif (root / "memory").is_dir():
        base = root / "memory"
        relative, limit_file = _own_cgroup_path(proc_cgroup, "memory"), "memory.limit_in_bytes"
    else:
        return limit
    for directory in _ancestors(base, relative):
        value = _read_number(directory / limit_file)
        if value is not None and value < _UNLIMITED:
            limit = min(limit, value)
    return limit


def cap_to_machine(
    budget: int,
    *,
    name: str = "max_memory",
    cgroup_root: PathLike = CGROUP_ROOT,
    proc_cgroup: PathLike = PROC_SELF_CGROUP,
) -> int:
    """``budget``, clamped (with a warning naming both figures) to :func:`machine_memory_limit`.

    A budget the machine cannot give only postpones the failure to the kernel's OOM killer, so
    it is lowered at construction, where the warning is next to the line that set it.

    Parameters
    ----------
    budget
        The budget in bytes.
    name
        What the budget is called in the warning.
    cgroup_root
        Where the cgroup file system is mounted (tests point it elsewhere).
    proc_cgroup
        The file naming this process's cgroup (``/proc/self/cgroup``).

    Returns
    -------
    int
        ``budget``, or the machine's limit when that is smaller.
    """
    limit = machine_memory_limit(cgroup_root, proc_cgroup)
    if budget <= limit:
        return budget
    logger.warning(
        "%s of %s (%d bytes) is more than this machine and its cgroup can give, %s (%d bytes): "
        "using %s",
        name,
        format_size(budget),
        budget,
        format_size(limit),
        limit,
        format_size(limit),
    )
    return limit


def resolve_memory_budget(
    max_memory: int | str | None = None,
    *,
    cgroup_root: PathLike = CGROUP_ROOT,
    proc_cgroup: PathLike = PROC_SELF_CGROUP,
) -> int:
    """The budget in bytes: ``max_memory`` > ``EXTAGG_MEMORY`` > :func:`default_memory_budget`.

    Parameters
    ----------
    max_memory
        Bytes or a size string (``"64m"``), or ``None`` for the environment or the default.
    cgroup_root
        Where the cgroup file systems are mounted (tests point it elsewhere).
    proc_cgroup
        The ``/proc/self/cgroup`` file naming this process's cgroups.

    Raises
    ------
    ValueError
        A malformed, zero or negative size, naming the string.
    """
    if max_memory is not None:
        return parse_size(max_memory, name="max_memory")
    from_env = env_size(MEMORY_ENV)
    if from_env is not None:
        return from_env
    return default_memory_budget(cgroup_root=cgroup_root, proc_cgroup=proc_cgroup)


# ---------------------------------------------------------------------- helpers
def _own_cgroup_path(proc_cgroup: PathLike, controller: str) -> str:
    """The process's cgroup path for ``controller`` (``""``: the v2 unified hierarchy)."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return "/"
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if (controller == "" and parts[0] == "0" and controllers == "") or (
            controller and controller in controllers.split(",")
        ):
            return path or "/"
    return "/"


def _ancestors(base: Path, relative: str) -> list[Path]:
    """``base/relative`` and each parent up to ``base``; just ``base`` if it is not there
    (a cgroup namespace may show the host's path while mounting the container's root)."""
    directory = base.joinpath(*[part for part in relative.split("/") if part])
    if not directory.is_dir():
        return [base]
    chain = [directory]
    while directory != base:
        directory = directory.parent
        chain.append(directory)
    return chain


def _cgroup_headroom(
    directory: Path, limit_file: str, usage_file: str, stat_key: str
) -> int | None:
    limit = _read_number(directory / limit_file)
    if limit is None or limit >= _UNLIMITED:
        return None
    usage = _read_number(directory / usage_file) or 0
    reclaimable = _read_stat(directory / "memory.stat", stat_key)
    working_set = max(0, usage - reclaimable)
    return max(0, limit - working_set)


def _read_number(path: Path) -> int | None:
    """An integer cgroup file; ``None`` when missing, unreadable, or ``max``."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        logger.debug("ignoring unexpected content %r of %s", text[:40], path)
        return None


def _read_stat(path: Path, key: str) -> int:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0
