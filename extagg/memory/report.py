"""A JSON-serialisable snapshot of a memory manager, for logs and the CLI."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from extagg._config import format_size
from extagg.memory.task import task_managers
from extagg.memory.unified import UnifiedMemoryManager, default_memory_manager

__all__ = ["describe_holders", "report", "format_report"]


def report(mm: UnifiedMemoryManager | None = None) -> dict[str, Any]:
    """Pools (size, used, free), tasks (bytes each) and consumers (name, used) of ``mm``.

    ``mm`` defaults to the process-wide manager. Task ids that are not ``int``/``str`` are
    shown as their ``repr``. Pool figures are read atomically; consumer figures just after.
    """
    if mm is None:
        mm = default_memory_manager()
    snapshot = mm.pool_snapshot()
    tasks = snapshot.pop("tasks")
    consumers = [
        {"task_id": _json_id(tmm.task_id), "name": consumer.name, "used": consumer.used}
        for tmm in task_managers(mm)
        for consumer in tmm.consumers
    ]
    consumers.sort(key=lambda c: (-int(c["used"]), str(c["name"])))
    snapshot["tasks"] = [
        {"task_id": _json_id(task_id), "bytes": held}
        for task_id, held in sorted(tasks.items(), key=lambda item: -item[1])
    ]
    snapshot["consumers"] = consumers
    return snapshot


def describe_holders(mm: UnifiedMemoryManager, most: int = 3) -> str:
    """Who holds the execution memory of ``mm``: the ``most`` largest consumers, e.g.
    ``"held by DistinctAggregator/cs.1 (2.0 MiB)"``, for a refused grant's error message (a
    requester that holds nothing itself was starved by another consumer, which did not spill).

    Parameters
    ----------
    mm
        The memory manager.
    most
        How many consumers to name at most.
    """
    held = sorted(
        ((consumer.used, consumer.name) for tmm in task_managers(mm) for consumer in tmm.consumers),
        key=lambda item: -item[0],
    )
    named = [f"{name} ({_size(used)})" for used, name in held[:most] if used > 0]
    if not named:
        return "held by no consumer"
    more = sum(1 for used, _name in held[most:] if used > 0)
    return "held by " + ", ".join(named) + (f" and {more} more" if more else "")


def format_report(snapshot: dict[str, Any]) -> str:
    """Several human-readable lines for a :func:`report` dict (pools, tasks, consumers).

    Parameters
    ----------
    snapshot
        What :func:`report` returned.
    """
    execution, storage = snapshot["execution"], snapshot["storage"]
    lines = [
        f"memory: max {_size(snapshot['max_memory'])} "
        f"(storage region {_size(snapshot['storage_region_size'])})",
        f"  execution: {_size(execution['used'])} used of {_size(execution['pool_size'])} "
        f"({_size(execution['free'])} free)",
        f"  storage:   {_size(storage['used'])} used of {_size(storage['pool_size'])} "
        f"({_size(storage['free'])} free), {storage['blocks']} blocks in memory, "
        f"{storage['offloaded_blocks']} offloaded",
        f"  tasks: {len(snapshot['tasks'])}",
    ]
    by_task: dict[Any, list[dict[str, Any]]] = {}
    for consumer in snapshot["consumers"]:
        by_task.setdefault(consumer["task_id"], []).append(consumer)
    for task in snapshot["tasks"]:
        lines.append(f"    task {task['task_id']}: {_size(task['bytes'])}")
        lines.extend(
            f"      {c['name']}: {_size(c['used'])}" for c in by_task.pop(task["task_id"], [])
        )
    for task_id, idle in by_task.items():  # consumers of tasks holding nothing
        lines.append(f"    task {task_id}: 0 B")
        lines.extend(f"      {c['name']}: {_size(c['used'])}" for c in idle)
    return "\n".join(lines)


def _json_id(task_id: Hashable) -> int | str:
    if isinstance(task_id, (int, str)) and not isinstance(task_id, bool):
        return task_id
    return repr(task_id)


def _size(num_bytes: int) -> str:
    return f"{num_bytes} B" if num_bytes < 2048 else format_size(num_bytes)
