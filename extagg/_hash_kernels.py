"""numba versions of :mod:`extagg.hashing`, bit for bit, for typed key columns.

Every function here computes exactly what :func:`extagg.hashing.stable_hash` computes for the
Python value of a column element (``int`` for integer, bool and temporal storage, ``float`` for
float32/float64, ``bytes``/UTF-8 ``str`` for variable-length columns, ``None`` for nulls) and, for
a multi-column key, for the tuple of the column values. Columns are hashed one at a time into a
``uint64`` array; :func:`tuple_hash_start` and :func:`tuple_hash_mix` then fold the column hashes
into the tuple hash. The pure-Python reference is :mod:`extagg.hashing` itself.

Array arguments named ``valid`` are boolean validity masks; an empty array means "no nulls".
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from extagg import hashing as _h
from extagg._numba import jit, load_u64

__all__ = [
    "fmix64",
    "hash_u64",
    "hash_f64",
    "mmh3_low64",
    "hash_int_column",
    "hash_uint_column",
    "hash_float_column",
    "hash_var_column",
    "tuple_hash_start",
    "tuple_hash_mix",
    "hash_str_list",
]

_jit = jit()

_U = np.uint64
_LITTLE_ENDIAN = sys.byteorder == "little"
_SEED64 = _U(_h.SEED64)
_SEED32 = _U(_h.SEED)
_BIGINT_SEED = _U(_h.SEED ^ _h.BIGINT_TAG)
_FLOAT_SEED = _U(_h.SEED64 ^ _h.FLOAT_TAG)
_GOLDEN = _U(_h.GOLDEN)
_NONE_HASH = _U(_h.NONE_HASH)
_NAN_HASH = _U(_h.NAN_HASH)
_TUPLE_SEED = _U(_h.TUPLE_TAG ^ _h.SEED64)
_FM1 = _U(0xFF51AFD7ED558CCD)
_FM2 = _U(0xC4CEB9FE1A85EC53)
_MC1 = _U(0x87C37B91114253D5)
_MC2 = _U(0x4CF5AD432745937F)
_ADD1 = _U(0x52DCE729)
_ADD2 = _U(0x38495AB5)
_FIVE = _U(5)
_S33 = _U(33)
_MANTISSA = _U((1 << 52) - 1)
_HIDDEN = _U(1 << 52)
#: keys, and characters of keys, hashed per compiled call by :func:`hash_str_list` (bound its
#: temporary copies: by keys alone, 16384 keys of 2000 characters were 2 x 31 MiB)
STR_PIECE = 16384
STR_PIECE_CHARS = 1 << 18
_NO_NULLS = np.empty(0, dtype=np.bool_)


@_jit
def fmix64(k):
    """murmur3's 64-bit finaliser."""
    k ^= k >> _S33
    k = k * _FM1
    k ^= k >> _S33
    k = k * _FM2
    k ^= k >> _S33
    return k


@_jit
def hash_u64(bits):
    """Hash of an integer in ``[-2**63, 2**64)`` given as its value mod ``2**64``."""
    return fmix64(bits ^ _SEED64)


@jit(inline="always")
def _rotl(x, r):
    return (x << _U(r)) | (x >> _U(64 - r))


@jit(inline="always")
def _mmh3_block(h1, h2, k1, k2):
    """One 16-byte block (``k1``, ``k2``: its little-endian words) mixed into ``(h1, h2)``."""
    k1 = _rotl(k1 * _MC1, 31) * _MC2
    h1 ^= k1
    h1 = _rotl(h1, 27) + h2
    h1 = h1 * _FIVE + _ADD1
    k2 = _rotl(k2 * _MC2, 33) * _MC1
    h2 ^= k2
    h2 = _rotl(h2, 31) + h1
    h2 = h2 * _FIVE + _ADD2
    return h1, h2


@jit(inline="always")
def _mmh3_finish(h1, h2, k1, k2, length):
    """The tail's words (bytes past the last block, zero-filled; all zero mixes in nothing,
    so no test of the tail's length) and the length mixed in; the low 64 bits."""
    h2 ^= _rotl(k2 * _MC2, 33) * _MC1
    h1 ^= _rotl(k1 * _MC1, 31) * _MC2
    h1 ^= _U(length)
    h2 ^= _U(length)
    h1 = h1 + h2
    h2 = h2 + h1
    h1 = fmix64(h1)
    h2 = fmix64(h2)
    return h1 + h2


@_jit
def _mmh3_values(offsets, data, valid, seed, out):
    """Low 64 bits of MurmurHash3 x64-128 of every ``data[offsets[i]:offsets[i+1]]`` (an
    empty ``valid``: no nulls; a null hashes as ``None``).

    One loop with every load in it: a helper that takes the array, even one inlined, costs
    numba's reference counting of the array (atomic operations) at each call, which was most
    of the time when each value was hashed by such a call (5 M strings of 16 bytes: 0.15-0.18 s
    against 0.08-0.10 s now). A tail of up to 15 bytes is read as two 8-byte words, masked,
    wherever 16 bytes from its start are inside ``data`` (a byte loop's unpredictable trip
    count made 11-byte strings slower still: 0.28 s against 0.06 s); byte by byte only near
    the end of ``data`` and on big-endian machines."""
    has_mask = valid.shape[0] > 0
    size = data.shape[0]
    for i in range(offsets.shape[0] - 1):
        if has_mask and not valid[i]:
            out[i] = _NONE_HASH
            continue
        start = offsets[i]
        end = offsets[i + 1]
        h1 = seed
        h2 = seed
        p = start
        while p + 16 <= end:
            if _LITTLE_ENDIAN:
                h1, h2 = _mmh3_block(h1, h2, load_u64(data, p), load_u64(data, p + 8))
            else:
                k1 = _U(0)
                k2 = _U(0)
                for j in range(8):
                    k1 |= _U(data[p + j]) << _U(8 * j)
                    k2 |= _U(data[p + 8 + j]) << _U(8 * j)
                h1, h2 = _mmh3_block(h1, h2, k1, k2)
            p += 16
        rest = end - p
        k1 = _U(0)
        k2 = _U(0)
        if _LITTLE_ENDIAN and p + 16 <= size:
            if rest > 8:
                k1 = load_u64(data, p)
                k2 = load_u64(data, p + 8) & ((_U(1) << _U(8 * (rest - 8))) - _U(1))
            elif rest == 8:
                k1 = load_u64(data, p)
            elif rest > 0:
                k1 = load_u64(data, p) & ((_U(1) << _U(8 * rest)) - _U(1))
        else:
            for j in range(rest - 1, 7, -1):
                k2 ^= _U(data[p + j]) << _U(8 * (j - 8))
            for j in range(min(rest, 8) - 1, -1, -1):
                k1 ^= _U(data[p + j]) << _U(8 * j)
        out[i] = _mmh3_finish(h1, h2, k1, k2, end - start)


@_jit
def mmh3_low64(data, start, end, seed):
    """Low 64 bits of MurmurHash3 x64-128 of ``data[start:end]`` (== ``mmh3.hash64(...)[0]``)."""
    offsets = np.empty(2, dtype=np.int64)
    offsets[0] = start
    offsets[1] = end
    out = np.empty(1, dtype=np.uint64)
    _mmh3_values(offsets, data, np.empty(0, dtype=np.bool_), seed, out)
    return out[0]


@_jit
def _hash_big_integral(x):
    """Hash of an integral float outside ``[-2**63, 2**64)``: mmh3 of its two's-complement bytes."""
    bits = np.float64(x).view(np.uint64)
    exponent = np.int64((bits >> _U(52)) & _U(0x7FF)) - 1075  # >= 11 here
    mantissa = (bits & _MANTISSA) | _HIDDEN  # 53 significant bits
    bit_length = 53 + exponent
    nbytes = (bit_length + 8) // 8
    buf = np.zeros(nbytes + 8, dtype=np.uint8)
    byte0 = exponent // 8
    shifted = mantissa << _U(exponent % 8)  # at most 60 bits
    for j in range(8):
        buf[byte0 + j] = np.uint8((shifted >> _U(8 * j)) & _U(0xFF))
    if x < 0:  # two's complement over nbytes
        carry = 1
        for j in range(nbytes):
            v = (~np.int64(buf[j]) & 0xFF) + carry
            buf[j] = np.uint8(v & 0xFF)
            carry = v >> 8
    return mmh3_low64(buf, 0, nbytes, _BIGINT_SEED)


@jit(inline="always")  # into the column loop: a call per value took 2-3x the time
def hash_f64(x):
    """Hash of a float: NaN is one value, integral floats hash as the equal int."""
    if x != x:
        return _NAN_HASH
    if np.isfinite(x) and np.floor(x) == x:
        if -9.223372036854775808e18 <= x < 9.223372036854775808e18:
            return hash_u64(np.uint64(np.int64(x)))
        if 0.0 < x < 1.8446744073709551616e19:
            return hash_u64(np.uint64(x))
        return _hash_big_integral(x)
    return fmix64(np.float64(x).view(np.uint64) ^ _FLOAT_SEED)


@_jit
def hash_int_column(values, valid, out):
    """Hash signed integer (or bool / temporal storage) values; nulls hash as ``None``."""
    has_mask = valid.shape[0] > 0
    for i in range(values.shape[0]):
        if has_mask and not valid[i]:
            out[i] = _NONE_HASH
        else:
            out[i] = hash_u64(np.uint64(np.int64(values[i])))


@_jit
def hash_uint_column(values, valid, out):
    """Hash unsigned integer values; nulls hash as ``None``."""
    has_mask = valid.shape[0] > 0
    for i in range(values.shape[0]):
        if has_mask and not valid[i]:
            out[i] = _NONE_HASH
        else:
            out[i] = hash_u64(np.uint64(values[i]))


@_jit
def hash_float_column(values, valid, out):
    """Hash float32/float64 values (as the Python ``float`` they equal); nulls as ``None``."""
    has_mask = valid.shape[0] > 0
    for i in range(values.shape[0]):
        if has_mask and not valid[i]:
            out[i] = _NONE_HASH
        else:
            out[i] = hash_f64(np.float64(values[i]))


@_jit
def hash_var_column(offsets, data, valid, out):
    """Hash variable-length values ``data[offsets[i]:offsets[i+1]]`` (mmh3); nulls as ``None``."""
    _mmh3_values(offsets, data, valid, _SEED32, out)


def tuple_hash_start(num_columns: int, num_rows: int) -> np.ndarray:
    """The tuple-hash accumulator for ``num_rows`` keys of ``num_columns`` elements."""
    start = _h.fmix64((num_columns ^ _h.TUPLE_TAG ^ _h.SEED64) & _h.M64)
    return np.full(num_rows, start, dtype=np.uint64)


@_jit
def tuple_hash_mix(acc, column_hashes):
    """Fold one column's element hashes into the tuple-hash accumulator, in place."""
    for i in range(acc.shape[0]):
        acc[i] = fmix64((acc[i] * _GOLDEN) ^ column_hashes[i])


def hash_str_list(keys: Sequence[Any]) -> np.ndarray | None:
    """:func:`extagg.hashing.stable_hash` of every key, as ``uint64``, when all are exact
    ``str`` (else ``None``): a piece of keys is joined and encoded once and hashed by
    :func:`hash_var_column`, instead of one Python-level encode and hash call per key (~5x
    faster; a spill of a map of string keys hashes every key). Temporary copies are bounded
    by :data:`STR_PIECE` keys and :data:`STR_PIECE_CHARS` characters (or one key) at a time."""
    n = len(keys)
    if operator.countOf(map(type, keys), str) != n:
        return None
    out = np.empty(n, dtype=np.uint64)
    ends = np.cumsum(np.fromiter(map(len, keys), dtype=np.int64, count=n))
    start = 0
    while start < n:
        before = int(ends[start - 1]) if start else 0
        stop = int(np.searchsorted(ends, before + STR_PIECE_CHARS, side="right"))
        stop = min(max(stop, start + 1), start + STR_PIECE)
        piece = keys[start:stop]
        joined = "".join(piece)
        if joined.isascii():
            data = joined.encode("ascii")
            lengths = map(len, piece)
        else:  # byte lengths differ from str lengths: encode key by key
            encoded = [k.encode("utf-8", "surrogatepass") for k in piece]
            data = b"".join(encoded)
            lengths = map(len, encoded)
        offsets = np.zeros(len(piece) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(lengths, dtype=np.int64, count=len(piece)), out=offsets[1:])
        raw = np.frombuffer(data, dtype=np.uint8)
        hash_var_column(offsets, raw, _NO_NULLS, out[start:stop])
        start = stop
    return out
