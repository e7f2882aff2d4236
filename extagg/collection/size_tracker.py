"""Spark's SizeTracker: an O(1) size estimate from occasional exact(ish) samples.

Measuring a collection walks its contents, so it is done only at a geometric schedule of update
counts; in between, the size is extrapolated from the bytes-per-update slope of the last two
samples. The arithmetic follows Spark's ``SizeTracker`` exactly (see
``spark-semantics.md`` section 2): growth rate 1.1, two samples kept, slope clamped at 0,
samples after a reset at updates 1, 2, 3, ..., 11, 13, 15, 17, ...

:class:`SizeTrackingAppendOnlyMap` is the AppendOnlyMap that counts its updates this way.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

from extagg.collection.append_only_map import DEFAULT_CAPACITY, AppendOnlyMap
from extagg.collection.size_estimator import estimate_entries

__all__ = ["SAMPLE_GROWTH_RATE", "Sample", "SizeTracker", "SizeTrackingAppendOnlyMap"]

#: each sample is taken when the update count has grown by this factor since the previous one
SAMPLE_GROWTH_RATE = 1.1


class Sample(NamedTuple):
    """A measured size and the update count at which it was measured."""

    size: int
    num_updates: int


class SizeTracker:
    """Tracks the estimated size of a collection measured by ``measure()``.

    Call :meth:`after_update` after every update (or once per batch of ``n`` updates) and
    :meth:`reset_samples` when the collection's layout changes (a hash table grew);
    :meth:`estimate_size` is O(1).
    """

    __slots__ = ("_bytes_per_update", "_measure", "_next_sample_num", "_num_updates", "_samples")

    def __init__(self, measure: Callable[[], int]) -> None:
        self._measure = measure
        self._samples: list[Sample] = []
        self._bytes_per_update = 0.0
        self._num_updates = 1
        self._next_sample_num = 1
        self.reset_samples()

    @property
    def num_updates(self) -> int:
        """Updates counted since the last reset (starts at 1, as in Spark)."""
        return self._num_updates

    @property
    def next_sample_num(self) -> int:
        """The update count at (or after) which the next sample is taken."""
        return self._next_sample_num

    @property
    def bytes_per_update(self) -> float:
        """The extrapolation slope: growth per update between the last two samples, >= 0."""
        return self._bytes_per_update

    @property
    def samples(self) -> tuple[Sample, ...]:
        """The (at most two) most recent samples, oldest first."""
        return tuple(self._samples)

    def reset_samples(self) -> None:
        """Forget the samples and measure again (Spark calls this after a table grows)."""
        self._num_updates = 1
        self._next_sample_num = 1
        self._samples.clear()
        self._take_sample()

    def after_update(self, n: int = 1) -> None:
        """Count ``n`` updates; measure once the count reaches the next sample number."""
        if n < 0:
            raise ValueError(f"after_update needs a non-negative number of updates, got {n}")
        self._num_updates += n
        if self._num_updates >= self._next_sample_num:
            self._take_sample()

    def _take_sample(self) -> None:
        size = int(self._measure())
        samples = self._samples
        samples.append(Sample(size, self._num_updates))
        if len(samples) > 2:
            del samples[0]
        if len(samples) == 2:
            previous, latest = samples
            updates = latest.num_updates - previous.num_updates
            delta = (latest.size - previous.size) / updates if updates > 0 else 0.0
        else:
            delta = 0.0
        self._bytes_per_update = max(0.0, delta)
        self._next_sample_num = math.ceil(self._num_updates * SAMPLE_GROWTH_RATE)

    def estimate_size(self) -> int:
        """The last sample plus the slope times the updates since it (truncated to int)."""
        last = self._samples[-1]
        return int(last.size + self._bytes_per_update * (self._num_updates - last.num_updates))


class SizeTrackingAppendOnlyMap(AppendOnlyMap):
    """An :class:`AppendOnlyMap` with Spark's sampled size estimate (:class:`SizeTracker`).

    Every update, change and folded record counts as one update; growth resets the samples.
    :meth:`estimate_size` is O(1); a sample measures the table and entry arrays exactly plus
    a sampled deep size of the keys and combiners (O(100 entries), see
    :func:`~extagg.collection.size_estimator.estimate_entries_size`).
    """

    __slots__ = ("_largest", "_tracker")

    def __init__(self, initial_capacity: int = DEFAULT_CAPACITY) -> None:
        super().__init__(initial_capacity)
        self._largest: tuple[int, Any] = (0, None)
        self._tracker = SizeTracker(self._measure_size)

    def _measure_size(self) -> int:
        getsizeof = sys.getsizeof
        table = (
            getsizeof(self)
            + getsizeof(self._table)
            + getsizeof(self._hashes)
            + getsizeof(self._int_keys)
            + getsizeof(self._is_int)
            + getsizeof(self._keys)
            + getsizeof(self._values)
        )
        entries = estimate_entries(self._keys, self._values)
        if entries.largest_index >= 0:
            self._largest = (entries.largest, self._keys[entries.largest_index])
        return table + entries.total

    @property
    def largest_entry(self) -> tuple[int, Any]:
        """``(bytes, key)`` of the largest entry (key and value) the last sample measured."""
        return self._largest

    def update(self, key: Hashable, value: Any) -> None:
        super().update(key, value)
        self._tracker.after_update()

    def change_value(self, key: Hashable, update_fn: Callable[[bool, Any], Any]) -> Any:
        new_value = super().change_value(key, update_fn)
        self._tracker.after_update()
        return new_value

    def _grow_table(self) -> None:
        super()._grow_table()
        self._tracker.reset_samples()

    def _after_updates(self, n: int) -> None:
        self._tracker.after_update(n)

    @property
    def tracker(self) -> SizeTracker:
        """The size tracker (samples, slope, update count) for metrics and tests."""
        return self._tracker

    def estimate_size(self) -> int:
        """Estimated bytes held by the map (table arrays, keys and combiners), O(1)."""
        self._check_valid()
        return self._tracker.estimate_size()
