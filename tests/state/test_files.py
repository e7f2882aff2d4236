"""Delta/snapshot file format: round trips, corruption detection, streaming, atomic writes."""

from __future__ import annotations

import logging
import os
import random
import struct
import subprocess
import sys
import time
import tracemalloc
import zlib

import pytest

from extagg.errors import CorruptFileError
from extagg.state import Checkpoint, StateStoreConf, read_state
from extagg.state import atomic as state_files
from extagg.state.codec import encode_key, encode_value
from extagg.state.files import (
    DELTA,
    SNAPSHOT,
    AtomicFile,
    StateFileReader,
    StateFileWriter,
    list_state_files,
    remove_stale_temp_files,
)

from .conftest import temp_files


def records(n: int, deletes_every: int = 0) -> list[tuple[bytes, bytes | None]]:
    out = []
    for i in range(n):
        value = None if deletes_every and i % deletes_every == 0 else encode_value(("v", i))
        out.append((encode_key(i), value))
    return sorted(out)


def write(path, recs, kind=DELTA, compression="lz4"):
    writer = StateFileWriter(path, kind, compression)
    for key, value in recs:
        writer.write(key, value)
    return writer.commit()


@pytest.mark.parametrize("compression", ["lz4", "none"])
@pytest.mark.parametrize("n", [0, 1, 5000])
def test_round_trip(tmp_path, compression, n):
    recs = records(n, deletes_every=7)
    stats = write(tmp_path / "3.delta", recs, compression=compression)
    assert stats.records == n
    assert stats.file_bytes == os.path.getsize(tmp_path / "3.delta")
    reader = StateFileReader(tmp_path / "3.delta", DELTA)
    assert (reader.kind, reader.compression) == (DELTA, compression)
    assert list(reader) == recs
    assert os.listdir(tmp_path) == ["3.delta"]


def test_same_records_give_identical_bytes(tmp_path):
    recs = records(300, deletes_every=5)
    write(tmp_path / "1.delta", recs)
    write(tmp_path / "2.delta", recs)
    assert (tmp_path / "1.delta").read_bytes() == (tmp_path / "2.delta").read_bytes()


@pytest.mark.parametrize("compression", ["lz4", "none"])
def test_the_header_names_the_store_and_a_reader_checks_it(tmp_path, compression):
    """Format 2's header carries the writer's store id (checked by a reader given one; not
    by one given none); a flipped byte of it fails the header checksum; a format-1 file (no
    store id) is read by every reader."""
    recs = records(50, deletes_every=5)
    path = tmp_path / "3.delta"
    writer = StateFileWriter(path, DELTA, compression, store="op=0,part=1,store=default")
    for key, value in recs:
        writer.write(key, value)
    writer.commit()
    raw = path.read_bytes()
    assert raw[8] == 2 and b"op=0,part=1,store=default" in raw[:64]
    for store in (None, "op=0,part=1,store=default"):
        with StateFileReader(path, DELTA, store=store) as reader:
            assert reader.store == "op=0,part=1,store=default"
            assert list(reader) == recs
    with pytest.raises(CorruptFileError, match=r"store \(op=0,part=1,store=default\), not") as info:
        StateFileReader(path, DELTA, label="p0", store="op=0,part=0,store=default")
    assert info.value.path == str(path) and "copied from another partition" in info.value.reason
    flipped = bytearray(raw)
    flipped[20] ^= 0x01  # inside the store id
    path.write_bytes(bytes(flipped))
    with pytest.raises(CorruptFileError, match="header checksum mismatch"):
        StateFileReader(path)
    path.write_bytes(raw[:30])
    with pytest.raises(CorruptFileError, match="too short for a header"):
        StateFileReader(path)
    raw_file(path, record(encode_key(1), b"\x01"), count=1)  # format 1
    with StateFileReader(path, DELTA, store="op=0,part=0,store=default") as reader:
        assert reader.store == "" and list(reader) == [(encode_key(1), b"\x01")]


def test_writer_rejects_unsorted_and_repeated_keys_and_snapshot_deletes(tmp_path):
    writer = StateFileWriter(tmp_path / "1.delta", DELTA)
    writer.write(encode_key(1), b"\x00")
    with pytest.raises(ValueError, match="strictly ascending"):
        writer.write(encode_key(1), b"\x00")
    writer.cancel()
    snapshot = StateFileWriter(tmp_path / "1.snapshot", SNAPSHOT)
    with pytest.raises(ValueError, match="cannot hold a delete"):
        snapshot.write(encode_key(1), None)
    snapshot.cancel()
    with pytest.raises(ValueError, match="unknown state file compression 'zstd'"):
        StateFileWriter(tmp_path / "1.delta", DELTA, "zstd")
    assert os.listdir(tmp_path) == []


def damaged_copies(data: bytes, target):
    """Write every one-bit flip of ``data`` to ``target``, then every truncation; yield
    whether the copy is a flip (the error names the file) after each."""
    for i in range(len(data)):
        corrupted = bytearray(data)
        corrupted[i] ^= 1 << (i % 8)
        target.write_bytes(bytes(corrupted))
        yield True
    for size in range(len(data)):
        target.write_bytes(data[:size])
        yield False


@pytest.mark.parametrize("compression", ["lz4", "none"])
def test_every_flipped_bit_and_every_truncation_is_detected(tmp_path, compression):
    write(tmp_path / "1.delta", records(16, deletes_every=3), compression=compression)
    target = tmp_path / "x.delta"
    for flipped in damaged_copies((tmp_path / "1.delta").read_bytes(), target):
        with pytest.raises(CorruptFileError) as info:
            list(StateFileReader(target))
        assert not flipped or info.value.path == str(target)


def test_an_uncompressed_file_is_checked_before_its_first_record(tmp_path):
    # no LZ4 block checksums: a reader that stops early (show --limit 2) would get flipped
    # values with no error if the body checksum were only checked at the end of the file
    write(tmp_path / "1.delta", records(16, deletes_every=3), compression="none")
    data = (tmp_path / "1.delta").read_bytes()
    target = tmp_path / "x.delta"
    for flipped in damaged_copies(data, target):
        with pytest.raises(CorruptFileError) as info:
            next(iter(StateFileReader(target)))
        assert not flipped or info.value.path == str(target)
    target.write_bytes(data + b"\x00")
    with pytest.raises(CorruptFileError, match="unexpected data after"):
        next(iter(StateFileReader(target)))


def test_the_first_rows_of_a_flipped_uncompressed_state_are_an_error(tmp_path):
    checkpoint = Checkpoint(tmp_path / "cp")
    provider = checkpoint.operator(0, num_partitions=1).provider(
        0, conf=StateStoreConf(compression="none")
    )
    store = provider.get_store(0)
    for i in range(1000):
        store.put(f"key{i}", 1_000_000 + i)
    store.commit()
    checkpoint.commit(0)
    _key, first_value, _partition = next(iter(read_state(checkpoint.path)))
    delta = os.path.join(provider.directory, "1.delta")
    with open(delta, "r+b") as handle:
        data = handle.read()
        at = data.index(first_value.to_bytes(8, "big")) + 7
        handle.seek(at)
        handle.write(bytes([data[at] ^ 0x40]))
    with pytest.raises(CorruptFileError, match="body checksum mismatch") as info:
        next(iter(read_state(checkpoint.path)))
    assert info.value.path == delta
    with pytest.raises(CorruptFileError):
        next(iter(provider.iter_version(1)))
    provider.close()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty"),
        (b"EXAGSTAT", "too short for a header"),
        (b"hello, this is a text file, not state\n", "not an extagg state file"),
        (random.Random(64).randbytes(64), "not an extagg state file"),
    ],
    ids=["empty", "short", "text", "random-bytes"],
)
def test_empty_and_foreign_files(tmp_path, content, reason):
    path = tmp_path / "1.delta"
    path.write_bytes(content)
    with pytest.raises(CorruptFileError, match=reason) as info:
        list(StateFileReader(path))
    assert info.value.offset == 0


def test_trailing_bytes_are_detected(tmp_path):
    write(tmp_path / "1.delta", records(10))
    with open(tmp_path / "1.delta", "ab") as handle:
        handle.write(b"\x00")
    with pytest.raises(CorruptFileError, match="unexpected data after"):
        list(StateFileReader(tmp_path / "1.delta"))


def test_kind_is_checked(tmp_path):
    write(tmp_path / "1.delta", records(3))
    with pytest.raises(CorruptFileError, match="holds a delta where a snapshot was expected"):
        StateFileReader(tmp_path / "1.delta", SNAPSHOT)


def raw_file(path, body: bytes, kind: int = 1, count: int | None = None, flags: int = 1):
    """A file with a valid header and checksums around ``body`` (records without the end)."""
    head = struct.pack(">8sBBBB", b"EXAGSTAT", 1, kind, 0, flags)
    head += struct.pack(">I", zlib.crc32(head))
    body += struct.pack(">i", -1) + struct.pack(">Q", 0 if count is None else count)
    body += struct.pack(">I", zlib.crc32(body))
    path.write_bytes(head + body)


def record(key: bytes, value: bytes | None) -> bytes:
    out = struct.pack(">i", len(key)) + key
    return out + (struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value)


def test_record_level_errors_name_the_problem(tmp_path):
    path = tmp_path / "1.snapshot"
    raw_file(path, struct.pack(">i", -5), kind=2)
    with pytest.raises(CorruptFileError, match="key size cannot be -5"):
        list(StateFileReader(path))
    raw_file(path, record(encode_key(1), None), kind=2, count=1)
    with pytest.raises(CorruptFileError, match="value size cannot be -1"):
        list(StateFileReader(path))
    raw_file(path, record(encode_key(1), b"\x00")[:8] + struct.pack(">i", -3), kind=1)
    with pytest.raises(CorruptFileError):
        list(StateFileReader(path))
    two = sorted([encode_key(1), encode_key(2)])
    raw_file(path, record(two[1], b"\x00") + record(two[0], b"\x00"), count=2)
    with pytest.raises(CorruptFileError, match="out of key order"):
        list(StateFileReader(path))
    raw_file(path, record(two[0], b"\x00"), count=3)
    with pytest.raises(CorruptFileError, match="counts 3 records but 1 were read"):
        list(StateFileReader(path))
    raw_file(path, b"", flags=3)
    with pytest.raises(CorruptFileError, match="unknown flags"):
        StateFileReader(path)


def test_records_larger_than_the_read_chunks(tmp_path):
    big = os.urandom(3 * 1024 * 1024)
    recs = sorted([(encode_key("big"), encode_value(big)), (encode_key(1), b"\x00")])
    write(tmp_path / "1.snapshot", recs, kind=SNAPSHOT)
    assert list(StateFileReader(tmp_path / "1.snapshot")) == recs


def test_reading_streams_in_bounded_memory(tmp_path):
    padding = "x" * 400
    recs = sorted((encode_key(i), encode_value((i, padding))) for i in range(20_000))
    write(tmp_path / "1.delta", recs)  # about 8.5 MB of records before compression
    del recs
    tracemalloc.start()
    try:
        count = 0
        for _key, _value in StateFileReader(tmp_path / "1.delta"):
            count += 1
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 20_000
    assert peak < 3 * 1024 * 1024


def test_atomic_file_creates_its_temp_file_lazily_and_cancels_cleanly(tmp_path):
    target = AtomicFile(tmp_path / "1.delta")
    assert os.listdir(tmp_path) == []
    target.write(b"abc")
    assert len(temp_files(tmp_path)) == 1
    target.cancel()
    assert os.listdir(tmp_path) == []
    target.cancel()  # idempotent


def test_atomic_file_replaces_an_existing_file(tmp_path):
    (tmp_path / "1.delta").write_bytes(b"old")
    target = AtomicFile(tmp_path / "1.delta")
    target.write(b"new")
    target.commit()
    assert (tmp_path / "1.delta").read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["1.delta"]


def test_atomic_file_failure_leaves_no_temp_file(tmp_path):
    (tmp_path / "1.delta").mkdir()  # the rename onto a directory fails
    target = AtomicFile(tmp_path / "1.delta")
    target.write(b"data")
    with pytest.raises(OSError):
        target.commit()
    assert temp_files(tmp_path) == []
    assert os.listdir(tmp_path) == ["1.delta"]


def test_writer_failure_leaves_no_temp_file(tmp_path):
    writer = StateFileWriter(tmp_path / "1.delta", DELTA)
    for key, value in records(60_000):  # several buffers: the temp file exists
        writer.write(key, value)
    assert len(temp_files(tmp_path)) == 1
    (tmp_path / "1.delta").mkdir()
    with pytest.raises(OSError):
        writer.commit()
    assert temp_files(tmp_path) == []


def test_listing_skips_temp_files_and_directories_and_warns_about_foreign_files(tmp_path, caplog):
    for name in (
        "1.delta",
        "2.delta",
        "2.snapshot",
        ".3.delta.h-1-x.tmp",
        "notes.txt",
        "01.delta",
        "x.delta",
    ):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "left").mkdir()
    with caplog.at_level(logging.WARNING, logger="extagg.state.files"):
        listing = list_state_files(tmp_path)
    assert sorted(listing.deltas) == [1, 2]
    assert sorted(listing.snapshots) == [2]
    assert listing.latest_version == 2
    warned = " ".join(record.getMessage() for record in caplog.records)
    for name in ("notes.txt", "01.delta", "x.delta"):
        assert f"Could not identify file {tmp_path / name}" in warned
    assert list_state_files(tmp_path / "missing").latest_version == 0


def test_stale_temp_files_of_dead_writers_are_removed(tmp_path):
    host = state_files._HOST
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        alive = tmp_path / f".1.delta.{host}-{child.pid}-abc.tmp"
        other_host_young = tmp_path / ".2.delta.otherhost-1-abc.tmp"
        other_host_old = tmp_path / ".3.delta.otherhost-1-abc.tmp"
        mine = tmp_path / f".4.delta.{host}-{os.getpid()}-abc.tmp"
        for path in (alive, other_host_young, other_host_old, mine):
            path.write_bytes(b"x")
        old = time.time() - state_files.STALE_TEMP_SECONDS - 10
        os.utime(other_host_old, (old, old))
        removed = remove_stale_temp_files(tmp_path)
        assert sorted(removed) == sorted([str(other_host_old), str(mine)])
    finally:
        child.kill()
        child.wait()
    assert remove_stale_temp_files(tmp_path) == [str(alive)]
    assert temp_files(tmp_path) == [str(other_host_young)]
