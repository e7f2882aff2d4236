"""extagg.memory: one memory manager decides who may hold memory.

* :class:`UnifiedMemoryManager` - execution and storage pools that borrow from each other,
  fair sharing of execution memory among tasks (1/2N .. 1/N);
* :class:`TaskMemoryManager` - one task's (thread's) memory; makes its consumers spill;
* :class:`MemoryConsumer` - base class of everything that holds execution memory;
* :class:`MemoryStore` - cached blocks in storage memory with LRU eviction;
* :func:`default_memory_manager` / :func:`task_memory_manager` - the process-wide manager and
  the current thread's task manager, used by every consumer not given its own;
* :func:`report` / :func:`format_report` - snapshots for logs and the CLI;
  :func:`describe_holders` - who holds the memory, for a refused grant's message.

This layer knows nothing of maps or files.
"""

from extagg.memory.consumer import MemoryConsumer
from extagg.memory.pools import ExecutionMemoryPool, HelperTaskId, MemoryPool, StorageMemoryPool
from extagg.memory.report import describe_holders, format_report, report
from extagg.memory.resolve import (
    ENGINE_MIN_BUDGET,
    check_engine_budget,
    resolve_task_memory_manager,
)
from extagg.memory.sizing import (
    DEFAULT_MEMORY_FRACTION,
    MEMORY_ENV,
    RESERVED_SYSTEM_MEMORY,
    available_memory,
    cap_to_machine,
    cgroup_memory_available,
    default_memory_budget,
    machine_memory_limit,
    resolve_memory_budget,
)
from extagg.memory.store import MemoryStore
from extagg.memory.task import Consumer, TaskMemoryManager, task_managers, task_memory_manager
from extagg.memory.unified import (
    DEFAULT_WAIT_TIMEOUT,
    WAIT_TIMEOUT_ENV,
    UnifiedMemoryManager,
    default_memory_manager,
    set_default_memory_manager,
)

__all__ = [
    "DEFAULT_MEMORY_FRACTION",
    "ENGINE_MIN_BUDGET",
    "DEFAULT_WAIT_TIMEOUT",
    "MEMORY_ENV",
    "RESERVED_SYSTEM_MEMORY",
    "WAIT_TIMEOUT_ENV",
    "Consumer",
    "ExecutionMemoryPool",
    "HelperTaskId",
    "MemoryConsumer",
    "MemoryPool",
    "MemoryStore",
    "StorageMemoryPool",
    "TaskMemoryManager",
    "UnifiedMemoryManager",
    "available_memory",
    "cap_to_machine",
    "cgroup_memory_available",
    "check_engine_budget",
    "default_memory_budget",
    "default_memory_manager",
    "describe_holders",
    "format_report",
    "machine_memory_limit",
    "report",
    "resolve_memory_budget",
    "resolve_task_memory_manager",
    "set_default_memory_manager",
    "task_managers",
    "task_memory_manager",
]
