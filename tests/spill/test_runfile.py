import errno
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extagg.errors import CorruptFileError, SpillError
from extagg.hashing import order_hashes
from extagg.spill.blocks import ColumnBlock, ObjectBlock
from extagg.spill.codecs import COLUMN_CODEC, OBJECT_CODEC
from extagg.spill.runfile import RunReader, RunWriter
from extagg.spill.tempdir import SpillDirs

from ..conftest import files_under


def object_block(keys, values=None):
    values = values if values is not None else [k for k in keys]
    hashes = order_hashes(keys)
    order = np.argsort(hashes, kind="stable")
    return ObjectBlock(hashes[order], [keys[i] for i in order], [values[i] for i in order])


def write_run(path, block, batch_size=3, compression="lz4", codec=OBJECT_CODEC):
    writer = RunWriter(str(path), codec, compression=compression)
    writer.write_sorted(block, batch_size)
    return writer.finish()


def read_all(path):
    with RunReader(str(path)) as reader:
        return [reader.read_block(i) for i in range(len(reader.batches))]


@pytest.mark.parametrize("compression", ["lz4", "none"])
@given(keys=st.lists(st.one_of(st.integers(), st.text(), st.none()), unique=True, max_size=40))
def test_object_round_trip(tmp_path_factory, compression, keys):
    path = tmp_path_factory.mktemp("run") / "a.run"
    block = object_block(keys, [(k, 1) for k in keys])
    info = write_run(path, block, compression=compression)
    assert info.num_records == len(keys)
    assert info.disk_bytes == os.path.getsize(path)
    blocks = read_all(path)
    assert sum(len(b) for b in blocks) == len(keys)
    got = ObjectBlock.concat(blocks) if blocks else ObjectBlock.empty()
    assert got.keys == block.keys and got.values == block.values
    assert got.hashes.tolist() == block.hashes.tolist()


def test_footer_has_counts_and_hash_ranges(tmp_path):
    block = object_block(list(range(10)))
    write_run(tmp_path / "r.run", block, batch_size=4)
    with RunReader(str(tmp_path / "r.run")) as reader:
        assert [b.count for b in reader.batches] == [4, 4, 2]
        for i, info in enumerate(reader.batches):
            part = block.slice(4 * i, 4 * i + 4)
            assert info.min_hash == int(part.hashes[0]) and info.max_hash == int(part.hashes[-1])


def test_column_block_round_trip_with_strings(tmp_path):
    n = 7
    words = [f"w{i}" * i for i in range(n)]
    data = np.frombuffer("".join(words).encode(), dtype=np.uint8)
    offsets = np.cumsum([0] + [len(w) for w in words]).astype(np.int64)
    block = ColumnBlock(
        np.arange(n, dtype=np.uint64),
        {"sum": np.arange(n, dtype=np.float64), "valid": np.ones(n, dtype=bool)},
        {"name": (offsets, data)},
    )
    write_run(tmp_path / "c.run", block, batch_size=3, codec=COLUMN_CODEC)
    got = ColumnBlock.concat(read_all(tmp_path / "c.run"))
    assert got.columns["sum"].tolist() == list(range(n))
    offs, raw = got.var_columns["name"]
    assert [bytes(raw[offs[i] : offs[i + 1]]).decode() for i in range(n)] == words


@pytest.mark.parametrize("compression", ["lz4", "none"])
def test_batches_encoded_into_a_reused_buffer_write_the_same_file(
    tmp_path, monkeypatch, compression
):
    """Large batches are encoded into a buffer reused from batch to batch (the writer's own,
    or one the caller shares among writers), which grows and is never shrunk: the files are
    byte-identical to those of batches joined into new ``bytes``."""
    import extagg.spill.runfile as runfile

    rng = np.random.default_rng(7)
    blocks = []
    for n in (5, 40_000, 3, 70_000, 0, 20_000):  # 40 000 rows: over SCRATCH_MIN_BYTES
        words = rng.integers(0, 2**63, (n, 2)).astype(np.int64)
        offsets = np.arange(n + 1, dtype=np.int64)
        blocks.append(
            ColumnBlock(
                np.sort(rng.integers(0, 2**63, n).astype(np.uint64)),
                {"v": rng.normal(size=n).astype(">f8"), "w": words, "m": rng.random(n) < 0.5},
                {"s": (offsets, rng.integers(0, 255, n).astype(np.uint8))},
            )
        )
    assert blocks[1].nbytes() >= runfile.SCRATCH_MIN_BYTES > blocks[0].nbytes()
    run_id = b"r" * 16

    def write(name: str, scratch: bytearray | None) -> bytes:
        writer = RunWriter(str(tmp_path / name), COLUMN_CODEC, compression=compression,
                           ordered=False, run_id=run_id)  # fmt: skip
        for block in blocks:
            writer.write_block(block, scratch)
        writer.finish()
        return (tmp_path / name).read_bytes()

    shared = bytearray()
    own = write("own.run", None)
    with_shared = write("shared.run", shared)
    assert len(shared) >= blocks[3].nbytes()  # grown to the largest batch, kept
    monkeypatch.setattr(runfile, "SCRATCH_MIN_BYTES", 1 << 40)  # every batch joined anew
    joined = write("joined.run", None)
    assert own == with_shared == joined
    for i, got in enumerate(read_all(tmp_path / "own.run")):
        want = [b for b in blocks if len(b)][i]
        assert np.array_equal(got.columns["v"], want.columns["v"])
        assert np.array_equal(got.columns["w"], want.columns["w"])
        assert np.array_equal(got.var_columns["s"][1], want.var_columns["s"][1])


def test_unordered_blocks_are_refused(tmp_path):
    writer = RunWriter(str(tmp_path / "x.run"), OBJECT_CODEC)
    writer.write_block(ObjectBlock(np.array([5], dtype=np.uint64), [1], [1]))
    with pytest.raises(ValueError, match="hash order"):
        writer.write_block(ObjectBlock(np.array([4], dtype=np.uint64), [2], [2]))
    assert not (tmp_path / "x.run").exists()


def test_an_unordered_run_keeps_any_order_and_says_so(tmp_path):
    # partitions of raw input rows: batches in any hash order, the footer has their min and max
    path = tmp_path / "u.run"
    writer = RunWriter(str(path), COLUMN_CODEC, ordered=False)
    blocks = [
        ColumnBlock(np.array([9, 2, 7], dtype=np.uint64), {"v": np.array([1.0, 2.0, 3.0])}),
        ColumnBlock(np.array([1, 8], dtype=np.uint64), {"v": np.array([4.0, 5.0])}),
    ]
    for block in blocks:
        writer.write_block(block)
    writer.finish()
    with RunReader(str(path)) as reader:
        assert not reader.ordered
        assert [(b.min_hash, b.max_hash) for b in reader.batches] == [(2, 9), (1, 8)]
        got = [reader.read_block(i) for i in range(2)]
    assert [g.hashes.tolist() for g in got] == [[9, 2, 7], [1, 8]]
    assert got[1].columns["v"].tolist() == [4.0, 5.0]
    ordered = tmp_path / "o.run"
    write_run(ordered, object_block(list(range(5))))
    with RunReader(str(ordered)) as reader:
        assert reader.ordered


def test_unknown_header_flags_are_rejected(tmp_path):
    path = tmp_path / "f.run"
    write_run(path, object_block(list(range(5))))
    data = bytearray(path.read_bytes())
    data[12] = 0x02  # u32 flags at offset 12: bit 1 means nothing yet
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="unknown header flags"):
        RunReader(str(path))


@pytest.fixture
def good_run(tmp_path):
    path = tmp_path / "good.run"
    write_run(path, object_block(list(range(50)), [str(i) * 20 for i in range(50)]), batch_size=10)
    return path


def test_truncated_file_is_detected(good_run):
    size = os.path.getsize(good_run)
    for cut in (0, 5, 20, size // 2, size - 1):
        with open(good_run, "r+b") as f:
            f.truncate(cut)
        with pytest.raises(CorruptFileError) as err:
            read_all(good_run)
        assert err.value.path == str(good_run)


def test_every_flipped_byte_is_detected(tmp_path):
    path = tmp_path / "r.run"
    write_run(path, object_block(list(range(30)), [i * 3 for i in range(30)]), batch_size=7)
    original = path.read_bytes()
    for pos in range(0, len(original)):
        damaged = bytearray(original)
        damaged[pos] ^= 0x40
        path.write_bytes(bytes(damaged))
        with pytest.raises(CorruptFileError):
            read_all(path)


def test_foreign_file_is_rejected(tmp_path):
    path = tmp_path / "foreign.run"
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 200)
    with pytest.raises(CorruptFileError, match="not an extagg run file"):
        RunReader(str(path))


def test_missing_file_names_it(tmp_path):
    with pytest.raises(CorruptFileError, match="does not exist") as err:
        RunReader(str(tmp_path / "nope.run"))
    assert "nope.run" in str(err.value)


def test_a_directory_in_the_spill_files_place_names_it(tmp_path):
    """A folder where the run file was (a user's or a cleaner's doing): a CorruptFileError
    naming the path, not a bare IsADirectoryError from the first read."""
    path = tmp_path / "map-1.run"
    path.mkdir()
    with pytest.raises(CorruptFileError, match="is a directory now") as err:
        RunReader(str(path))
    assert "map-1.run" in str(err.value)


class FullDisk:
    """A file that accepts ``room`` bytes and then fails like a full disk (I/O fault injection)."""

    def __init__(self, path, room):
        self._file = open(path, "wb")  # noqa: SIM115
        self.room = room

    def write(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self._file.write(data)

    def close(self):
        self._file.close()


def inject_full_disk(monkeypatch, room):
    import extagg.spill.runfile as runfile

    monkeypatch.setattr(runfile, "open_for_writing", lambda path: FullDisk(path, room))


@pytest.mark.parametrize("room", [0, 16, 100, 5000])
def test_disk_full_raises_spill_error_and_removes_partial_file(spill_dir, monkeypatch, room):
    inject_full_disk(monkeypatch, room)
    dirs = SpillDirs([spill_dir])
    with pytest.raises(SpillError) as err:
        writer = RunWriter(dirs.new_path(), OBJECT_CODEC, spill_dirs=dirs)
        writer.write_sorted(object_block(list(range(2000))), 100)
        writer.finish()
    assert str(spill_dir) in str(err.value)
    assert err.value.directory == str(spill_dir)
    assert err.value.bytes_needed and err.value.bytes_needed > 0
    assert isinstance(err.value, OSError) and err.value.errno == errno.ENOSPC
    assert files_under(spill_dir) == []


def test_spill_cap_fails_fast(spill_dir):
    dirs = SpillDirs([spill_dir], max_spill_bytes=200)
    writer = RunWriter(dirs.new_path(), OBJECT_CODEC, compression="none", spill_dirs=dirs)
    with pytest.raises(SpillError, match="max_spill_bytes"):
        writer.write_sorted(object_block(list(range(500))), 50)
    assert files_under(spill_dir) == []


def test_unpicklable_value_names_key_type(tmp_path):
    writer = RunWriter(str(tmp_path / "u.run"), OBJECT_CODEC)
    block = ObjectBlock(np.array([1, 2], dtype=np.uint64), ["a", 7], [1, lambda: 0])
    with pytest.raises(SpillError, match="key of type int"):
        writer.write_block(block)
    writer.abort()
    assert not (tmp_path / "u.run").exists()


def test_same_input_same_bytes(tmp_path):
    block = object_block([f"k{i}" for i in range(100)], list(range(100)))
    write_run(tmp_path / "a.run", block)
    write_run(tmp_path / "b.run", block)
    a, b = (tmp_path / "a.run").read_bytes(), (tmp_path / "b.run").read_bytes()
    assert a[16:32] != b[16:32]  # each run has its own random id ...
    assert a[:16] + a[32:] == b[:16] + b[32:]  # ... and nothing else differs
    for name in ("c.run", "d.run"):
        with RunWriter(str(tmp_path / name), OBJECT_CODEC, run_id=b"\x01" * 16) as writer:
            writer.write_sorted(block, 1000)
            writer.finish()
    assert (tmp_path / "c.run").read_bytes() == (tmp_path / "d.run").read_bytes()


@given(
    dtype=st.sampled_from(["<i2", "<i4", "<i8", ">i8", "<u4", "<u8", "<f4", "<f8", "<M8[D]"]),
    n=st.integers(0, 300),
    seed=st.integers(0, 2**32 - 1),
)
def test_numeric_columns_stored_byte_plane_by_byte_plane_round_trip(dtype, n, seed) -> None:
    """Integer and date columns of 4 or 8 bytes a value, 64 rows or more, whose values span
    less than their top two bytes count are stored shuffled (kind ``S``) by the column codec
    and come back equal; other columns (floats, full-range ints, masks, wide) as they are."""
    from extagg.spill.codecs import COLUMN_CODEC_PLAIN, from_byte_planes

    rng = np.random.default_rng(seed)
    values = rng.integers(0 if "u" in dtype else -500, 20_000, n).astype(dtype)
    block = ColumnBlock(
        np.sort(rng.integers(0, 2**63, n).astype(np.uint64)),
        {"v": values, "m": rng.random(n) < 0.5, "w": rng.integers(0, 9, (n, 2)),
         "r": rng.integers(-(2**63), 2**63 - 1, n)},  # full range: not worth shuffling
        {},
    )  # fmt: skip
    for codec in (COLUMN_CODEC, COLUMN_CODEC_PLAIN):
        payload = codec.encode(block)
        back = codec.decode(payload)
        np.testing.assert_array_equal(back.hashes, block.hashes)
        for name, arr in block.columns.items():
            np.testing.assert_array_equal(back.columns[name], arr)
            assert back.columns[name].dtype.newbyteorder("=") == arr.dtype.newbyteorder("=")
        shuffled = b"\x53\x01\x00\x00\x00v" in bytes(payload)  # kind S, name "v"
        narrow = dtype[1] in "iuM" and np.dtype(dtype).itemsize >= 4 and n >= 64
        assert shuffled == (codec is COLUMN_CODEC and narrow)
        assert b"\x53\x01\x00\x00\x00r" not in bytes(payload)
    planes = np.array([0, 1, 2, 0, 0, 1], np.uint8).view("<u2")  # low bytes, then high
    np.testing.assert_array_equal(from_byte_planes(planes), [0, 1, 258])


def test_shuffled_runs_are_smaller_and_read_by_any_writer_setting(tmp_path) -> None:
    """Keys with zero high bytes compress far better shuffled; a writer without compression
    stores columns plain; the reader reads both."""
    rng = np.random.default_rng(3)
    n = 50_000
    block = ColumnBlock(
        np.sort(rng.integers(0, 2**63, n).astype(np.uint64)),
        {f"k{i}": rng.integers(0, 200_000, n) for i in range(3)},
        {},
    )
    sizes = {}
    for compression in ("lz4", "none"):
        path = str(tmp_path / compression)
        writer = RunWriter(path, COLUMN_CODEC, compression=compression, run_id=b"r" * 16)
        writer.write_block(block)
        writer.finish()
        sizes[compression] = os.path.getsize(path)
        with RunReader(path) as reader:
            back = reader.read_block(0)
        for name, arr in block.columns.items():
            np.testing.assert_array_equal(back.columns[name], arr)
    raw = 8 * n * 4
    assert sizes["none"] > raw  # plain columns, no compression
    assert sizes["lz4"] < 0.55 * raw  # hashes stay 8 bytes a row; keys shrink to ~3
