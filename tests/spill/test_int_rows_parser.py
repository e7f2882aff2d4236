"""The compiled reader of plain int-key batches against its reference and ``pickle.loads``.

Whatever bytes it is given, the parser either declines (the batch is unpickled as before, so
a malformed one raises what it always raised) or returns exactly what ``pickle.loads`` gives.
"""

from __future__ import annotations

import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from extagg.generic.typed_map import scalar_sorted_rows
from extagg.spill import _pickle_kernels as kernels
from extagg.spill import _pickle_reference as reference
from extagg.spill.blocks import IntKeyBlock, ObjectBlock
from extagg.spill.codecs import OBJECT_CODEC

int64s = st.integers(-(2**63), 2**63 - 1)


def _payload(keys, values):
    """The pickle bytes the engine writes from arrays for these rows."""
    n = len(keys)
    block = scalar_sorted_rows(
        np.arange(n, dtype=np.uint64),
        np.arange(n, dtype=np.int64),
        keys,
        values,
        np.array(keys, dtype=np.int64),
    )
    assert block is not None
    return block.pickled_rows()


def _parse(function, data: bytes, n: int):
    keys = np.zeros(n, dtype=np.uint64)
    values = np.zeros(n, dtype=np.uint64)
    kind = function(np.frombuffer(data, np.uint8), n, keys, values)
    if kind == reference.NOT_PARSED:
        return None
    numbers = values.view(np.float64 if kind == reference.FLOAT_VALUES else np.int64)
    return keys.view(np.int64).tolist(), numbers.tolist()


rows = st.integers(1, 40).flatmap(
    lambda n: st.tuples(
        st.lists(st.one_of(int64s, st.integers(-300, 300)), min_size=n, max_size=n),
        st.one_of(
            st.lists(st.floats(width=64, allow_nan=False), min_size=n, max_size=n),
            st.lists(st.one_of(int64s, st.integers(-300, 300)), min_size=n, max_size=n),
        ),
    )
)


@given(rows=rows)
def test_parses_what_the_engine_writes_exactly_as_pickle(rows):
    keys, values = rows
    data = _payload(keys, values)
    want = tuple(map(list, pickle.loads(data)))
    assert _parse(kernels.parse_int_rows, data, len(keys)) == want
    assert _parse(reference.parse_int_rows, data, len(keys)) == want


@given(rows=rows)
def test_declines_pythons_own_pickles(rows):
    keys, values = rows
    data = pickle.dumps((keys, values), protocol=pickle.HIGHEST_PROTOCOL)
    assert _parse(kernels.parse_int_rows, data, len(keys)) is None
    assert _parse(reference.parse_int_rows, data, len(keys)) is None


@settings(max_examples=300)
@given(rows=rows, data=st.data())
def test_mangled_bytes_are_declined_or_read_as_pickle_reads_them(rows, data):
    keys, values = rows
    raw = bytearray(_payload(keys, values))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip":
            raw[at] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del raw[at:]
            if not raw:
                raw = bytearray(b"\x80")
        else:
            raw.insert(at, data.draw(st.integers(0, 255)))
    n = data.draw(st.sampled_from([len(keys), len(keys) - 1, len(keys) + 1]))
    n = max(n, 0)
    got = _parse(kernels.parse_int_rows, bytes(raw), n)
    assert got == _parse(reference.parse_int_rows, bytes(raw), n)
    if got is not None:
        ks, vs = pickle.loads(bytes(raw))
        assert (list(ks), list(vs)) == got
        assert len(ks) == n


def test_codec_reads_int_batches_as_arrays_and_others_as_objects():
    hashes = np.array([1, 2, 3], dtype=np.uint64)
    rows = scalar_sorted_rows(
        hashes, np.arange(3), [7, -(2**63), 2**63 - 1], [0.5, -0.0, 1e300],
        np.array([7, -(2**63), 2**63 - 1], dtype=np.int64),
    )  # fmt: skip
    block = OBJECT_CODEC.decode(OBJECT_CODEC.encode(rows))
    assert type(block) is IntKeyBlock
    assert block.keys == [7, -(2**63), 2**63 - 1]
    assert [repr(v) for v in block.values] == ["0.5", "-0.0", "1e+300"]
    assert block.slice(1, 3).keys == [-(2**63), 2**63 - 1]
    other = OBJECT_CODEC.decode(OBJECT_CODEC.encode(ObjectBlock(hashes, ["a", 2, None], [1, 2, 3])))
    assert type(other) is ObjectBlock and other.keys == ["a", 2, None]


@given(rows=rows)
def test_writer_matches_reference_and_reads_back(rows):
    keys, values = rows
    is_float = isinstance(values[0], float)
    key_bits = np.array(keys, dtype=np.int64).view(np.uint64)
    value_bits = np.array(values, dtype=np.float64 if is_float else np.int64).view(np.uint64)
    size = reference.int_rows_size(len(keys))
    got, want = np.zeros(size, np.uint8), np.zeros(size, np.uint8)
    n = kernels.write_int_rows(key_bits, value_bits, is_float, got)
    assert n == reference.write_int_rows(key_bits, value_bits, is_float, want)
    assert got[:n].tobytes() == want[:n].tobytes()
    assert tuple(map(list, pickle.loads(got[:n].tobytes()))) == (keys, values)
    block = IntKeyBlock(np.arange(len(keys), dtype=np.uint64), *(
        np.array(c, dtype=np.float64 if c is values and is_float else np.int64)
        for c in (keys, values)
    ))  # fmt: skip
    again = OBJECT_CODEC.decode(OBJECT_CODEC.encode(block))
    assert type(again) is IntKeyBlock
    assert (again.keys, again.values) == (keys, values)
