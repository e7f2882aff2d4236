"""extagg.state: a versioned state store in the manner of Spark's HDFS-backed provider.

One delta file per version, snapshots written by maintenance (or by the streaming update),
old files cleaned, loaded versions cached in the unified memory manager's storage memory.
Every file is in key-hash order, so :meth:`StateStoreProvider.merge_update` computes the next
version by merging the previous version's files with an ``ExternalAppendOnlyMap``'s output as
streams: state larger than memory is updated in bounded memory.

Examples
--------
>>> import tempfile
>>> from extagg.memory import UnifiedMemoryManager
>>> cp = Checkpoint(tempfile.mkdtemp())
>>> op = cp.operator(0, name="running_totals", num_partitions=1)
>>> provider = op.provider(0, memory_manager=UnifiedMemoryManager("64m"))
>>> store = provider.get_store(0)
>>> store.put("apples", 3)
>>> store.commit()
1
>>> cp.commit(0)
>>> provider.merge_update(1, [("apples", 2)], lambda old, new: old + new)
2
>>> cp.commit(1)
>>> [tuple(row) for row in read_state(cp.path)]
[('apples', 5, 0)]
>>> provider.close()
"""

from extagg.state.checkpoint import Checkpoint, Operator, OperatorMetadata
from extagg.state.conf import StateStoreConf, StateStoreMetrics
from extagg.state.errors import (
    CommittedBatchUnavailableError,
    ConcurrentCommitError,
    StateFileNotFoundError,
    StateSourceConflictError,
    StateSourceError,
    StateSourceOptionError,
    StateStoreCommitError,
    StateStoreError,
    UnexpectedVersionError,
)
from extagg.state.provider import StateStoreProvider
from extagg.state.reader import read_change_feed, read_metadata, read_state
from extagg.state.rows import ChangeRow, MetadataRow, Rows, StateRow
from extagg.state.source import read_state_source
from extagg.state.store import ReadStateStore, StateStore
from extagg.state.update import record_batch_pairs

__all__ = [
    "ChangeRow",
    "Checkpoint",
    "CommittedBatchUnavailableError",
    "MetadataRow",
    "Operator",
    "OperatorMetadata",
    "ReadStateStore",
    "Rows",
    "StateFileNotFoundError",
    "StateRow",
    "StateSourceConflictError",
    "StateSourceError",
    "StateSourceOptionError",
    "StateStore",
    "ConcurrentCommitError",
    "StateStoreCommitError",
    "StateStoreConf",
    "StateStoreError",
    "StateStoreMetrics",
    "StateStoreProvider",
    "UnexpectedVersionError",
    "read_change_feed",
    "read_metadata",
    "read_state",
    "read_state_source",
    "record_batch_pairs",
]
