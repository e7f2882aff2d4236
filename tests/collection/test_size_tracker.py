"""SizeTracker arithmetic (Spark's SizeTrackerSuite) and SizeTrackingAppendOnlyMap."""

from __future__ import annotations

import math

import pytest

from extagg.collection import SizeTracker, SizeTrackingAppendOnlyMap
from extagg.collection.size_tracker import SAMPLE_GROWTH_RATE, Sample
from tests.collection.map_helpers import sum_create, sum_merge


class FakeCollection:
    """A collection whose measured size the test sets; it logs when it is measured."""

    def __init__(self, size: int = 100) -> None:
        self.size = size
        self.measured_at: list[int] = []
        self.tracker = SizeTracker(self.measure)

    def measure(self) -> int:
        tracker = getattr(self, "tracker", None)
        self.measured_at.append(tracker.num_updates if tracker else 1)
        return self.size


def _spark_schedule(limit: int) -> list[int]:
    nums, n = [1], 1
    while True:
        n = math.ceil(n * SAMPLE_GROWTH_RATE)
        if n > limit:
            return nums
        nums.append(n)


def test_sample_schedule_after_a_reset():
    fake = FakeCollection()
    for _ in range(99):
        fake.tracker.after_update()
    assert fake.measured_at[:16] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 21]
    assert fake.measured_at == _spark_schedule(100)


def test_extrapolation_from_the_last_two_samples():
    fake = FakeCollection(size=1000)
    tracker = fake.tracker
    assert (tracker.estimate_size(), tracker.bytes_per_update) == (1000, 0.0)
    for _ in range(12):  # update n measures 1000 + 10 * (n - 1)
        fake.size += 10
        tracker.after_update()
    assert tracker.num_updates == 13
    assert tracker.samples == (Sample(1100, 11), Sample(1120, 13))  # only the last two
    assert tracker.bytes_per_update == 10.0
    fake.size = 5000  # not measured until update 15
    tracker.after_update()
    assert tracker.estimate_size() == 1120 + 10 * (14 - 13)


def test_shrinking_sizes_clamp_the_slope_at_zero():
    fake = FakeCollection(size=10_000)
    for _ in range(5):
        fake.size -= 1000
        fake.tracker.after_update()
    assert fake.tracker.bytes_per_update == 0.0
    assert fake.tracker.estimate_size() == fake.size


def test_fractional_slope_extrapolates_and_truncates():
    fake = FakeCollection(size=0)
    tracker = fake.tracker
    sizes = {2: 0, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0, 9: 0, 10: 0, 11: 0, 13: 5, 15: 8}
    for n in range(2, 17):
        fake.size = sizes.get(n, fake.size)
        tracker.after_update()
    assert tracker.samples == (Sample(5, 13), Sample(8, 15))
    assert tracker.bytes_per_update == 1.5
    assert tracker.num_updates == 16
    assert tracker.estimate_size() == 9  # toLong(8 + 1.5 * 1) truncates


def test_batched_updates_sample_once_past_the_next_sample_number():
    fake = FakeCollection(size=100)
    tracker = fake.tracker
    tracker.after_update(1024)
    assert fake.measured_at == [1, 1025]
    assert tracker.next_sample_num == math.ceil(1025 * 1.1)
    tracker.after_update(100)  # 1125 < 1128: no sample
    assert fake.measured_at == [1, 1025]
    tracker.after_update(3)
    assert fake.measured_at == [1, 1025, 1128]
    tracker.after_update(0)
    assert fake.measured_at == [1, 1025, 1128]
    with pytest.raises(ValueError, match="non-negative"):
        tracker.after_update(-1)


def test_reset_samples():
    fake = FakeCollection(size=100)
    for _ in range(20):
        fake.tracker.after_update()
    fake.size = 7
    fake.tracker.reset_samples()
    assert fake.tracker.num_updates == 1
    assert fake.tracker.next_sample_num == 2
    assert fake.tracker.samples == (Sample(7, 1),)
    assert fake.tracker.estimate_size() == 7


# -- the size-tracking map -------------------------------------------------------------------


def test_growth_resets_the_samples_before_the_insert_is_counted():
    m = SizeTrackingAppendOnlyMap()
    for i in range(44):
        m.update(i, i)
    assert m.tracker.num_updates == 45
    m.update(44, 44)  # grows: reset (sample at 1), then this update (sample at 2)
    assert m.capacity == 128
    assert m.tracker.num_updates == 2
    assert [s.num_updates for s in m.tracker.samples] == [1, 2]


def test_every_update_kind_counts_once():
    m = SizeTrackingAppendOnlyMap(1024)
    m.update("a", 1)
    m.change_value("a", lambda had, old: old + 1)
    m.change_value("b", lambda had, old: 0)
    m.fold(["a", "b", "c"], [1, 2, 3], sum_create, sum_merge)
    assert m.tracker.num_updates == 1 + 6


def test_fold_counts_records_and_resets_on_growth_inside_the_batch():
    m = SizeTrackingAppendOnlyMap(64)
    m.fold(list(range(40)), [1] * 40, sum_create, sum_merge)
    assert m.tracker.num_updates == 41
    m.fold(list(range(40, 60)), [1] * 20, sum_create, sum_merge)  # grows at key 45
    assert m.capacity == 128
    assert m.tracker.num_updates == 1 + 16  # reset, then the 16 records from key 44 on


def test_estimate_grows_with_the_map_and_is_o1():
    m = SizeTrackingAppendOnlyMap()
    empty = m.estimate_size()
    m.fold([f"key-{i}" for i in range(5000)], list(range(5000)), sum_create, sum_merge)
    assert m.estimate_size() > empty + 5000 * 50  # a str key alone is ~50 bytes
    assert m.estimate_size() == m.estimate_size()


def test_estimate_after_destruction_fails():
    m = SizeTrackingAppendOnlyMap()
    m.update(1, 1)
    m.destructive_sorted_arrays()
    with pytest.raises(AssertionError, match="invalid from destructive sorting"):
        m.estimate_size()
