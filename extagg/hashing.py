"""Deterministic 64-bit hashes that may leave the process.

Python's ``hash()`` of ``str`` and ``bytes`` changes with ``PYTHONHASHSEED``; anything that
outlives one map (spill order, partitioning across workers, state files) uses these instead.

The definition (shared bit for bit with the numba kernels in ``extagg._hash_kernels``):

* integers in ``[-2**63, 2**64)``: ``fmix64((x mod 2**64) ^ SEED64)`` (murmur3's 64-bit finaliser);
  ``bool`` hashes as ``int``; larger integers hash their two's-complement bytes with mmh3;
* floats: NaN is one value; an integral float hashes as the equal ``int`` (so ``1.0`` and ``1``
  and ``True`` agree, as Python equality says, and ``-0.0`` equals ``0.0``); any other float is
  ``fmix64(bits ^ SEED64 ^ FLOAT_TAG)``;
* ``str`` (UTF-8) and ``bytes``: the low 64 bits of MurmurHash3 x64-128 with seed ``SEED``, i.e.
  ``mmh3.hash64(data, SEED, signed=False)[0]``;
* ``None``: the constant ``NONE_HASH``;
* tuples: ``h = fmix64(len ^ TUPLE_TAG ^ SEED64)``, then for each element
  ``h = fmix64(((h * GOLDEN) mod 2**64) ^ hash(element))``. A multi-column key is the tuple of
  its column values, so a row ``(user, day)`` hashes the same in every engine.

Everything else raises ``TypeError`` naming the type.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import struct
from collections.abc import Hashable, Sequence
from numbers import Number
from typing import Any, cast

import mmh3
import numpy as np

__all__ = [
    "SEED",
    "stable_hash",
    "hash_array",
    "hash_objects",
    "order_hash",
    "order_hashes",
    "partition_of",
]

SEED = 0x2545F491
M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
SEED64 = GOLDEN ^ SEED
FLOAT_TAG = 0x0F10A7F10A7F10A7
TUPLE_TAG = 0x7E7E7E7E7E7E7E7E
BIGINT_TAG = 0x00B16B16
OBJECT_TAG = 0x0B1EC7000B1EC700
ENUM_TAG = 0x0E0E0E0E0E0E0E0E
FROZENSET_TAG = 0x5E75E75E75E75E75

_C1 = 0xFF51AFD7ED558CCD
_C2 = 0xC4CEB9FE1A85EC53
_INT64_MIN = -(1 << 63)
_UINT64_END = 1 << 64


def fmix64(k: int) -> int:
    """murmur3's 64-bit finaliser on a Python int in ``[0, 2**64)``."""
    k ^= k >> 33
    k = (k * _C1) & M64
    k ^= k >> 33
    k = (k * _C2) & M64
    k ^= k >> 33
    return k


NONE_HASH = fmix64(SEED64 ^ 0x4E4F4E45)
NAN_HASH = fmix64(SEED64 ^ FLOAT_TAG ^ 0x7FF8000000000000)

_pack_d = struct.Struct("<d").pack
_unpack_q = struct.Struct("<Q").unpack


def _hash_int(x: int) -> int:
    if _INT64_MIN <= x < _UINT64_END:
        return fmix64((x & M64) ^ SEED64)
    data = x.to_bytes((x.bit_length() + 8) // 8, "little", signed=True)
    return mmh3.hash64(data, SEED ^ BIGINT_TAG, signed=False)[0]


def _hash_float(f: float) -> int:
    if f != f:
        return NAN_HASH
    if f.is_integer():  # equal to an int (also -0.0 and huge floats): hash as that int
        return _hash_int(int(f))
    return fmix64(_unpack_q(_pack_d(f))[0] ^ SEED64 ^ FLOAT_TAG)


def _hash_bytes(b: bytes) -> int:
    return mmh3.hash64(b, SEED, signed=False)[0]


def _hash_tuple(t: tuple[Any, ...]) -> int:
    h = fmix64((len(t) ^ TUPLE_TAG ^ SEED64) & M64)
    for element in t:
        h = fmix64(((h * GOLDEN) & M64) ^ stable_hash(element))
    return h


def stable_hash(key: Any) -> int:
    """The deterministic unsigned 64-bit hash of ``key``, the same in every process and engine.

    Parameters
    ----------
    key
        None, bool, int, float, str, bytes, Decimal, date, datetime, timedelta, or a tuple
        of these (NumPy scalars as their value).

    Returns
    -------
    int
        In ``[0, 2**64)``. Equal keys hash equally across types (``1 == 1.0 == True``; every NaN,
        ``-0.0 == 0.0``).

    Raises
    ------
    TypeError
        For any other type, naming it.

    Notes
    -----
    O(size of the key); no memory is held.

    Examples
    --------
    >>> stable_hash(1) == stable_hash(1.0) == stable_hash(True)
    True
    >>> stable_hash(("user", 7)) == stable_hash(("user", 7))
    True
    """
    kind = type(key)
    if kind is int or kind is bool:
        return _hash_int(key)
    if kind is str:
        return _hash_bytes(key.encode("utf-8", "surrogatepass"))
    if key is None:
        return NONE_HASH
    if kind is float:
        return _hash_float(key)
    if kind is bytes:
        return _hash_bytes(key)
    if kind is tuple:
        return _hash_tuple(key)
    # subclasses (IntEnum, numpy scalars registered as numbers, str subclasses) go by value
    if isinstance(key, (bool, int)):
        return _hash_int(int(key))
    if isinstance(key, float):
        return _hash_float(float(key))
    if isinstance(key, str):
        # its value, not str(key): a (str, Enum) member prints as "Color.RED" but equals "red"
        return _hash_bytes(str.__str__(key).encode("utf-8", "surrogatepass"))
    if isinstance(key, (bytes, bytearray, memoryview)):
        return _hash_bytes(bytes(key))
    if isinstance(key, tuple):
        return _hash_tuple(tuple(key))
    if isinstance(key, np.generic):
        value = key.item()
        if type(value) is not kind:  # a long double's item() is itself: no Python equivalent
            return stable_hash(value)
    if isinstance(key, decimal.Decimal):
        return _hash_decimal(key)
    if isinstance(key, (dt.date, dt.timedelta)):
        return _hash_temporal(key)
    raise TypeError(
        f"extagg.hashing cannot hash a key of type {kind.__module__}.{kind.__qualname__}: "
        "deterministic hashes are defined for None, bool, int, float, str, bytes, Decimal, "
        "date, datetime, timedelta and tuples of these"
    )


#: what a date, a naive datetime, one with a zone and a timedelta mix into their count's hash
#: (none of them equals another type's value, nor an int)
_TEMPORAL_TAGS = {"date": 0xDA7E, "naive": 0xDA7E71, "aware": 0xDA7E72, "delta": 0xDE17A}


def _hash_temporal(key: dt.date | dt.timedelta) -> int:
    """A date by its day, a datetime by its microsecond (an aware one by its instant: equal
    instants in two zones are equal), a timedelta by its microseconds: not by Python's
    ``hash()``, which ``PYTHONHASHSEED`` changes for them."""
    if isinstance(key, dt.datetime):
        if key.tzinfo is None or key.utcoffset() is None:
            count, tag = (key - _EPOCH) // _MICRO, _TEMPORAL_TAGS["naive"]
        else:
            count, tag = (key - _EPOCH_UTC) // _MICRO, _TEMPORAL_TAGS["aware"]
    elif isinstance(key, dt.date):
        count, tag = key.toordinal(), _TEMPORAL_TAGS["date"]
    else:
        count, tag = key // _MICRO, _TEMPORAL_TAGS["delta"]
    return fmix64((_hash_int(count) ^ tag) & M64)


_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MICRO = dt.timedelta(microseconds=1)


def _hash_decimal(key: decimal.Decimal) -> int:
    """A decimal by value, equal where Python holds it equal: an integral one as that int
    (``Decimal('7.00') == 7``), one a float holds exactly as that float (``Decimal('1.5')``),
    others by Python's numeric ``hash()``, which no ``PYTHONHASHSEED`` changes."""
    if key.is_nan():
        return _hash_float(float("nan"))
    if key.is_finite() and key == key.to_integral_value():
        return _hash_int(int(key))
    as_float = float(key)
    if key == as_float:
        return _hash_float(as_float)
    return fmix64((hash(key) & M64) ^ OBJECT_TAG)


#: arrays of at most this many keys are hashed by :func:`stable_hash`, key by key
SCALAR_HASH_MAX = 4


def _fmix64_array(k: np.ndarray) -> np.ndarray:
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(_C1)
    k ^= k >> np.uint64(33)
    k *= np.uint64(_C2)
    k ^= k >> np.uint64(33)
    return k


def hash_array(values: np.ndarray) -> np.ndarray:
    """Vectorised :func:`stable_hash` of a NumPy array of ints, unsigned ints, bools or floats.

    Returns a ``uint64`` array; element ``i`` equals ``stable_hash(values[i].item())``.
    """
    arr = np.asarray(values)
    kind = arr.dtype.kind
    if arr.size <= SCALAR_HASH_MAX and kind in "iubf" and arr.ndim == 1:
        # a few keys (``ExternalAppendOnlyMap.insert``'s one): hashed one by one, ~1 us
        # each, where the vectorised form's NumPy calls and error states cost ~30 us
        return np.array([stable_hash(v) for v in arr.tolist()], dtype=np.uint64)
    if kind in "iub":
        if kind == "u":
            bits = arr.astype(np.uint64, copy=False)
        else:
            bits = arr.astype(np.int64, copy=False).view(np.uint64)
        with np.errstate(over="ignore"):
            return _fmix64_array(bits ^ np.uint64(SEED64))
    if kind == "f":
        f = arr.astype(np.float64, copy=False)
        out = np.empty(f.shape, dtype=np.uint64)
        with np.errstate(over="ignore", invalid="ignore"):
            integral = np.isfinite(f) & (f == np.floor(f))
            small = integral & (f >= -(2.0**63)) & (f < 2.0**63)
            big = integral & (f >= 2.0**63) & (f < 2.0**64)
            bits = f.view(np.uint64)
            out[:] = _fmix64_array(bits ^ np.uint64(SEED64 ^ FLOAT_TAG))
            as_int = f[small].astype(np.int64).view(np.uint64)
            out[small] = _fmix64_array(as_int ^ np.uint64(SEED64))
            out[big] = _fmix64_array(f[big].astype(np.uint64) ^ np.uint64(SEED64))
            out[np.isnan(f)] = np.uint64(NAN_HASH)
        rest = integral & ~(small | big)
        if rest.any():  # integral floats beyond 2**64 hash as big ints, like stable_hash
            for i in np.flatnonzero(rest):
                out[i] = _hash_float(float(f[i]))
        return out
    raise TypeError(f"hash_array supports integer, bool and float arrays, not {arr.dtype}")


def hash_objects(keys: Sequence[Any]) -> np.ndarray:
    """:func:`stable_hash` of every key in ``keys`` as a ``uint64`` array, fast for common types."""
    n = len(keys)
    if n == 0:
        return np.empty(0, dtype=np.uint64)
    kinds = set(map(type, keys))
    if kinds == {int}:
        try:
            return hash_array(np.fromiter(keys, dtype=np.int64, count=n))
        except OverflowError:
            pass
    elif kinds == {str}:
        h64 = mmh3.hash64
        return np.fromiter(
            (h64(k.encode("utf-8", "surrogatepass"), SEED, signed=False)[0] for k in keys),
            dtype=np.uint64,
            count=n,
        )
    elif kinds == {float}:
        return hash_array(np.fromiter(keys, dtype=np.float64, count=n))
    return np.fromiter((stable_hash(k) for k in keys), dtype=np.uint64, count=n)


def order_hash(key: Hashable) -> int:
    """The hash that orders a generic map's spills: :func:`stable_hash` where it is defined.

    Other hashable objects fall back so that keys Python holds equal still hash equal: numbers
    of other types (``Decimal``, ``Fraction``, NumPy scalars) hash by value as the equal int or
    float, tuples fold their elements' order hashes, frozensets sum them (free of the set's
    iteration order, which follows ``PYTHONHASHSEED``), subclasses of the built-in types that
    define their own ``__eq__`` or ``__hash__`` (a case-insensitive ``str``) and anything else
    (user classes) use their own ``__hash__`` mixed to 64 bits — consistent within a process,
    which is all a spill needs, and deterministic whenever that ``__hash__`` is; an ``Enum``
    member hashes its class's and its own name (``Enum.__hash__`` is its name's ``hash()``).
    """
    kind = type(key)
    if kind is tuple:
        items = cast("tuple[Any, ...]", key)
        if set(map(type, items)) <= _PLAIN_TYPES:
            return _hash_tuple(items)
        return _fallback_hash(items)
    if kind in _PLAIN_TYPES or _by_value(kind):
        try:
            return stable_hash(key)
        except TypeError:
            pass
    return _fallback_hash(key)


_PLAIN_TYPES = frozenset({int, bool, float, str, bytes, type(None)})
_BUILTIN_BASES = (bool, int, float, str, bytes, tuple)


def _by_value(kind: type) -> bool:
    """Whether keys of ``kind`` (a subclass) compare as their built-in base does (NumPy's
    scalars do, though they define their own ``__eq__``)."""
    if kind.__module__ == "numpy":
        return True
    for base in _BUILTIN_BASES:
        if issubclass(kind, base):
            return kind.__eq__ is base.__eq__ and kind.__hash__ is base.__hash__
    return True


def _same_as_frozenset(kind: type) -> bool:
    """Whether a ``frozenset`` subclass compares and hashes as ``frozenset`` does."""
    own_eq: object = kind.__eq__
    own_hash: object = kind.__hash__
    return own_eq is frozenset.__eq__ and own_hash is frozenset.__hash__


def _fallback_hash(key: Any) -> int:
    if isinstance(key, tuple) and (type(key) is tuple or _by_value(type(key))):
        h = fmix64((len(key) ^ TUPLE_TAG ^ SEED64) & M64)
        for element in key:
            h = fmix64(((h * GOLDEN) & M64) ^ order_hash(element))
        return h
    if isinstance(key, (complex, np.complexfloating)) and _by_value(type(key)):
        # equal to the real number when its imaginary part is 0 (``5+0j == 5``); otherwise
        # only to complex numbers, whose hash() is the same in every process
        if key.imag == 0:
            return _fallback_hash(key.real)
        return fmix64((hash(key) & M64) ^ OBJECT_TAG)
    if isinstance(key, Number) and _by_value(type(key)):
        try:
            as_int = int(key)  # type: ignore[call-overload]
            if key == as_int:
                return _hash_int(as_int)
        except (TypeError, ValueError, OverflowError):
            pass
        try:
            as_float = float(key)  # type: ignore[arg-type]
            same = key == as_float  # type: ignore[comparison-overlap]  # Number has no __eq__
            if same or (as_float != as_float and key != key):
                return _hash_float(as_float)
        except (TypeError, ValueError, OverflowError):
            pass
    if isinstance(key, frozenset) and _same_as_frozenset(type(key)):
        # a frozenset's own hash mixes its elements' hash(), which for strings changes with
        # PYTHONHASHSEED: summing its elements' order hashes is as free of their order and
        # the same in every process
        total = 0
        for element in key:
            total += fmix64(order_hash(element) ^ FROZENSET_TAG)
        return fmix64((total ^ len(key) ^ FROZENSET_TAG ^ SEED64) & M64)
    if isinstance(key, enum.Enum) and type(key).__hash__ is enum.Enum.__hash__:
        # a member is equal only to itself; Enum's own hash is its name's, which changes with
        # PYTHONHASHSEED: the name and the class's name make the order the same in every run
        kind = type(key)
        return stable_hash((kind.__module__, kind.__qualname__, key.name)) ^ ENUM_TAG
    return fmix64((hash(key) & M64) ^ OBJECT_TAG)


def order_hashes(keys: Sequence[Hashable]) -> np.ndarray:
    """:func:`order_hash` of every key, as a ``uint64`` array."""
    if set(map(type, keys)) <= _PLAIN_TYPES:
        return hash_objects(keys)
    return np.fromiter((order_hash(k) for k in keys), dtype=np.uint64, count=len(keys))


def partition_of(key: Any, num_partitions: int) -> int:
    """The partition of ``key`` among ``num_partitions``: ``stable_hash(key) % num_partitions``."""
    return stable_hash(key) % num_partitions
