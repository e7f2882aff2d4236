"""Run files carry the identity their writer gave them: a run replaced by another valid run (of
another map, or another run of the same map) is a CorruptFileError naming the file, never
merged silently. The engines need no change for it: the writer registers the id for the path."""

from __future__ import annotations

import operator
import os
import shutil
import struct

import numpy as np
import pyarrow as pa
import pytest

from extagg import Aggregator, ExternalAppendOnlyMap, HashAggregator
from extagg.errors import CorruptFileError
from extagg.spill.codecs import OBJECT_CODEC
from extagg.spill.runfile import FORMAT_VERSION, RunReader, RunWriter
from extagg.spill.tempdir import SpillDirs

from ..conftest import files_under
from .test_runfile import object_block

SUM = Aggregator(lambda v: v, operator.add, operator.add)


def _run(dirs: SpillDirs, keys: list[int]) -> tuple[str, bytes]:
    path = dirs.new_path()
    writer = RunWriter(path, OBJECT_CODEC, spill_dirs=dirs)
    writer.write_sorted(object_block(keys), 10)
    info = writer.finish()
    assert info.run_id == writer.run_id and len(info.run_id) == 16
    return path, info.run_id


def _replace(target: str, source: str) -> None:
    """Put a copy of ``source`` at ``target`` atomically (as a rogue process would)."""
    shutil.copyfile(source, target + ".tmp")
    os.replace(target + ".tmp", target)


def test_a_replaced_run_is_corrupt_naming_the_file(spill_dir) -> None:
    dirs = SpillDirs([spill_dir])
    a, a_id = _run(dirs, list(range(50)))
    b, b_id = _run(dirs, list(range(100, 170)))
    assert a_id != b_id
    _replace(a, b)
    with pytest.raises(CorruptFileError, match="replaced by another run") as info:
        RunReader(a)
    assert info.value.path == a and info.value.offset == 16
    with pytest.raises(CorruptFileError, match="replaced"):
        RunReader(a, run_id=a_id)
    with RunReader(a, run_id=b_id) as reader:  # the id it really has: readable
        assert reader.num_records == 70
    dirs.cleanup()
    assert files_under(spill_dir) == []


def test_a_run_of_another_process_or_map_reads_when_no_id_is_expected(tmp_path) -> None:
    path = str(tmp_path / "x.run")
    with RunWriter(path, OBJECT_CODEC) as writer:
        writer.write_sorted(object_block(list(range(20))), 5)
        writer.finish()
    with RunReader(path) as reader:  # its own writer's id is expected and found
        assert reader.run_id == writer.run_id


def test_version_1_files_are_rejected(tmp_path) -> None:
    path = tmp_path / "old.run"
    with RunWriter(str(path), OBJECT_CODEC) as writer:
        writer.write_sorted(object_block(list(range(20))), 5)
        writer.finish()
    data = bytearray(path.read_bytes())
    struct.pack_into("<H", data, 8, 1)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=f"version 1 .*reads {FORMAT_VERSION}"):
        RunReader(str(path))


def test_generic_map_refuses_a_run_replaced_before_its_merge(spill_dir) -> None:
    emap = ExternalAppendOnlyMap(SUM, memory="8m", spill_dirs=[spill_dir], force_spill_every=500)
    emap.insert_all((i % 700, 1) for i in range(3000))
    runs = files_under(spill_dir)
    assert len(runs) >= 4
    _replace(runs[0], runs[1])
    with pytest.raises(CorruptFileError, match="replaced by another run") as info:
        dict(emap.iterator())
    assert info.value.path == runs[0]
    emap.close()
    assert files_under(spill_dir) == []


def test_columnar_partitions_replaced_mid_iteration_are_refused(spill_dir) -> None:
    """Partition files are opened one by one while results are read: replacing those not read
    yet by copies of each other after the first result batch must not go unnoticed."""
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 400_000, 600_000)
    table = pa.table({"k": keys, "v": np.ones(len(keys))})
    agg = HashAggregator("k", {"n": ("v", "sum")}, memory="2m", spill_dirs=[spill_dir])
    for batch in table.to_batches(max_chunksize=50_000):
        agg.update(batch)
    results = agg.results()
    next(results)
    parts = [p for p in files_under(spill_dir) if os.path.basename(p).startswith("part-")]
    assert len(parts) >= 2, "the budget should make the aggregator partition its input"
    for target, source in zip(parts, parts[1:] + parts[:1]):
        shutil.copyfile(source, target + ".tmp")
    for target in parts:
        os.replace(target + ".tmp", target)
    with pytest.raises(CorruptFileError, match="replaced by another run") as info:
        for _ in results:
            pass
    assert info.value.path in parts
    agg.close()
    assert files_under(spill_dir) == []
