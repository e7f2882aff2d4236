"""Key columns to the typed table's representation (hashes, words, null bits, bytes) and back.

Hashes follow :mod:`extagg.hashing` bit for bit: one key column hashes as
``stable_hash(value)``, several as ``stable_hash(tuple_of_values)``, where the value of a
temporal column is its integer storage (days, or units since the epoch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from extagg import _hash_kernels as H
from extagg.collection._typed_kernels import gather_var
from extagg.collection.typed_table import null_mask_dtype
from extagg.columnar import _key_kernels as KK
from extagg.columnar import _radix_kernels as RK
from extagg.columnar.columns import Column, ReusedArrays, concat_var, decimal_array, is_decimal64

__all__ = ["KeyLayout", "EncodedKeys", "WORD_PREFIX", "NULLS_COLUMN", "VAR_COLUMN"]

WORD_PREFIX = "k"
NULLS_COLUMN = "knull"
VAR_COLUMN = "kvar"

_BIJECTIVE_KINDS = ("int", "uint", "bool", "temporal", "decimal")
_EMPTY_BOOL = np.zeros(0, dtype=np.bool_)
_EMPTY_I64 = np.zeros(0, dtype=np.int64)
_EMPTY_U8 = np.zeros(0, dtype=np.uint8)


@dataclass
class EncodedKeys:
    """Keys of a run of rows as the table takes them (empty arrays mean "none")."""

    hashes: np.ndarray  # uint64 (n,)
    words: np.ndarray  # uint64 (n, num_words), C order
    nulls: np.ndarray  # null-mask dtype (n,) or (0,)
    var_offsets: np.ndarray  # int64 (n + 1,) or (0,)
    var_data: np.ndarray  # uint8

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.hashes, self.words, self.nulls, self.var_offsets))

    def slice(self, lo: int, hi: int) -> EncodedKeys:
        """Rows ``lo..hi`` as views (variable-length offsets keep pointing into the bytes)."""
        if lo == 0 and hi == len(self.hashes):
            return self
        nulls = self.nulls[lo:hi] if len(self.nulls) else self.nulls
        offsets = self.var_offsets[lo : hi + 1] if len(self.var_offsets) else self.var_offsets
        return EncodedKeys(self.hashes[lo:hi], self.words[lo:hi], nulls, offsets, self.var_data)

    def take(self, rows: np.ndarray, rotate: int = 0) -> EncodedKeys:
        """The keys of rows ``rows`` (int64 row numbers), copied, hashes rotated left by
        ``rotate`` bits (as a partition's aggregator sees them)."""
        return EncodedKeys.take_many([(self, rows)], rotate)

    @staticmethod
    def take_many(
        parts: Sequence[tuple[EncodedKeys, np.ndarray]],
        rotate: int = 0,
        reuse: ReusedArrays | None = None,
    ) -> EncodedKeys:
        """The keys of rows ``rows`` of each ``(keys, rows)`` part (encoded by one layout), one
        part after the other, gathered into one set of arrays (the fixed-width ones without an
        intermediate copy), hashes rotated left by ``rotate`` bits. ``reuse``: gathered into
        its arrays (valid until the next call with the same ``reuse``)."""
        first = parts[0][0]
        total = sum(len(rows) for _, rows in parts)
        has_nulls = any(len(enc.nulls) for enc, _ in parts)
        num_words = first.words.shape[1]
        if reuse is None:
            hashes = np.empty(total, dtype=np.uint64)
            words = np.empty((total, num_words), dtype=np.uint64)
            nulls = np.zeros(total if has_nulls else 0, dtype=first.nulls.dtype)
        else:
            hashes = reuse.get("key:hashes", total, np.uint64)
            words = reuse.get("key:words", total, np.uint64, num_words)
            nulls = reuse.get("key:nulls", total if has_nulls else 0, first.nulls.dtype)
            nulls.fill(0)
        var = []
        at = 0
        for enc, rows in parts:
            end = at + len(rows)
            RK.gather_hashes(enc.hashes, rows, rotate, hashes[at:end])
            if words.shape[1]:
                RK.gather_words(enc.words, rows, words[at:end])
            if len(enc.nulls):  # empty: no null key in the part (zeros above)
                np.take(enc.nulls, rows, out=nulls[at:end], mode="clip")  # rows in range
            if len(enc.var_offsets):
                var.append(gather_var(enc.var_offsets, enc.var_data, rows))
            at = end
        offsets, data = first.var_offsets, first.var_data
        if var:
            offsets, data = var[0] if len(var) == 1 else concat_var(var)
        return EncodedKeys(hashes, words, nulls, offsets, data)


def _valid(col: Column) -> np.ndarray:
    return _EMPTY_BOOL if col.valid is None else col.valid


class KeyLayout:
    """How the key columns (names, kinds, Arrow types) map to words and packed bytes."""

    def __init__(self, names: Sequence[str], kinds: Sequence[str], types: Sequence[pa.DataType]):
        self.names = list(names)
        self.kinds = list(kinds)
        self.types = list(types)
        self.fixed = [i for i, k in enumerate(self.kinds) if k not in ("string", "binary")]
        self.var = [i for i, k in enumerate(self.kinds) if k in ("string", "binary")]
        #: words per fixed-width key column: two for a decimal of more than 18 digits
        self.widths = [
            2 if self.kinds[i] == "decimal" and not is_decimal64(self.types[i]) else 1
            for i in self.fixed
        ]
        self.word_start = [int(x) for x in np.cumsum([0, *self.widths])[:-1]]
        self.num_words = sum(self.widths)
        self.has_var = bool(self.var)
        self.packed = len(self.var) > 1
        self.null_dtype = null_mask_dtype(len(self.names))
        #: one integer-like key column: its hash, fmix64(word ^ seed), is a bijection of its
        #: word, so the table may match keys by hash alone (see ``TypedHashTable.hash_is_key``)
        self.hash_is_key = (
            len(self.kinds) == 1 and self.kinds[0] in _BIJECTIVE_KINDS and self.num_words == 1
        )

    # -- encoding ----------------------------------------------------------------------------

    def scratch_bytes(self, rows: int, var_bytes: int) -> int:
        """Upper bound of the temporaries :meth:`encode` allocates for ``rows`` rows."""
        per_row = 8 + 8 + 16 * self.num_words + self.null_dtype.itemsize + 8
        if self.has_var:
            per_row += 16 + 4 * len(self.var)
        return rows * per_row + (var_bytes if self.has_var else 0)

    def encode(
        self, cols: Sequence[Column], n: int | None = None, reuse: ReusedArrays | None = None
    ) -> EncodedKeys:
        """Hashes, words, null bits and packed bytes of the key columns ``cols``.

        ``n`` is the number of rows, needed when there are no key columns (a global aggregate:
        every row has the key ``()``, hashed as ``stable_hash(())``). ``reuse``: one key
        column's hashes computed into its array (valid until the next call with it).
        """
        if cols:
            n = len(cols[0])
        elif n is None:
            raise ValueError("encode() needs the row count when there are no key columns")
        return EncodedKeys(
            self._hashes(cols, n, reuse),
            self._words(cols, n),
            self._nulls(cols, n),
            *self._var(cols, n),
        )

    def _hashes(self, cols: Sequence[Column], n: int, reuse: ReusedArrays | None) -> np.ndarray:
        if len(cols) == 1:
            out = np.empty(n, np.uint64) if reuse is None else reuse.get("hashes", n, np.uint64)
            _hash_column(cols[0], out)
            return out
        acc = H.tuple_hash_start(len(cols), n)
        tmp = np.empty(n, dtype=np.uint64)
        for col in cols:
            _hash_column(col, tmp)
            H.tuple_hash_mix(acc, tmp)
        return acc

    def _words(self, cols: Sequence[Column], n: int) -> np.ndarray:
        if self.num_words == 1:
            return _column_words(cols[self.fixed[0]]).reshape(n, 1)
        words = np.empty((n, self.num_words), dtype=np.uint64)
        for w, i, width in zip(self.word_start, self.fixed, self.widths):
            words[:, w : w + width] = _column_words(cols[i]).reshape(n, width)
        return words

    def _nulls(self, cols: Sequence[Column], n: int) -> np.ndarray:
        if all(c.valid is None for c in cols):
            return np.zeros(0, dtype=self.null_dtype)
        nulls = np.zeros(n, dtype=self.null_dtype)
        for j, col in enumerate(cols):
            if col.valid is not None:
                nulls |= (~col.valid).astype(self.null_dtype) << self.null_dtype.type(j)
        return nulls

    def _var(self, cols: Sequence[Column], n: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.has_var:
            return _EMPTY_I64, _EMPTY_U8
        var_cols = [cols[i] for i in self.var]
        if not self.packed:
            col = var_cols[0]
            assert col.offsets is not None and col.data is not None
            if col.valid is None or not np.any(np.diff(col.offsets)[~col.valid]):
                return col.offsets, col.data
        prefix = 4 if self.packed else 0
        lengths = np.zeros(n, dtype=np.int64)
        for col in var_cols:
            KK.add_var_lengths(col.offsets, _valid(col), prefix, lengths)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        blob = np.empty(int(offsets[-1]), dtype=np.uint8)
        cursor = offsets[:-1].copy()
        for col in var_cols:
            KK.write_var(cursor, col.offsets, col.data, _valid(col), prefix, blob)
        return offsets, blob

    # -- decoding ----------------------------------------------------------------------------

    def decode(
        self,
        words: np.ndarray,
        nulls: np.ndarray,
        var_offsets: np.ndarray | None,
        var_data: np.ndarray | None,
    ) -> list[pa.Array]:
        """The key columns as Arrow arrays of their input types."""
        m = len(nulls)
        out: list[pa.Array] = []
        for j, (kind, arrow_type) in enumerate(zip(self.kinds, self.types)):
            null_mask = ((nulls >> self.null_dtype.type(j)) & 1).astype(bool)
            mask = null_mask if null_mask.any() else None
            if kind in ("string", "binary"):
                assert var_offsets is not None and var_data is not None
                if self.packed:
                    off, data = KK.unpack_var(var_offsets, var_data, self.var.index(j))
                else:
                    off, data = var_offsets, var_data
                out.append(_var_array(kind, arrow_type, m, off, data, mask))
            else:
                at = self.fixed.index(j)
                start, width = self.word_start[at], self.widths[at]
                if width == 2:  # a wide decimal: low and high words
                    lo = np.ascontiguousarray(words[:, start])
                    hi = np.ascontiguousarray(words[:, start + 1]).view(np.int64)
                    out.append(decimal_array(arrow_type, lo, hi, mask))
                    continue
                col_words = np.ascontiguousarray(words[:, start])
                out.append(_fixed_array(kind, arrow_type, col_words, mask))
        return out


def _hash_column(col: Column, out: np.ndarray) -> None:
    valid = _valid(col)
    kind = col.kind
    if kind in ("string", "binary"):
        H.hash_var_column(col.offsets, col.data, valid, out)
    elif kind == "float":
        H.hash_float_column(col.values, valid, out)
    elif kind == "uint":
        H.hash_uint_column(col.values, valid, out)
    elif kind == "bool":
        assert col.values is not None
        H.hash_uint_column(col.values.view(np.uint8), valid, out)
    elif kind == "decimal" and col.values is not None and col.values.ndim == 2:
        # a wide decimal hashes as stable_hash((low word, high word)) (signed words)
        n = len(out)
        acc = H.tuple_hash_start(2, n)
        tmp = np.empty(n, dtype=np.uint64)
        for w in range(2):
            H.hash_int_column(np.ascontiguousarray(col.values[:, w]), _EMPTY_BOOL, tmp)
            H.tuple_hash_mix(acc, tmp)
        if col.valid is not None:
            H.hash_int_column(np.zeros(n, np.int64), col.valid, tmp)  # nulls hash as None
            acc = np.where(col.valid, acc, tmp)
        out[:] = acc
    else:  # int, temporal storage, decimal's unscaled int64
        H.hash_int_column(col.values, valid, out)


def _column_words(col: Column) -> np.ndarray:
    values = col.values
    assert values is not None
    if col.kind == "float":
        out = np.empty(len(values), dtype=np.uint64)
        KK.float_words(values, _valid(col), out)
        return out
    if values.ndim == 2:  # a wide decimal's two words
        words = values.view(np.uint64)
        if col.valid is not None:
            words = np.where(col.valid[:, None], words, np.uint64(0))
        return words
    if col.kind in ("int", "temporal", "decimal"):
        words = values.astype(np.int64, copy=False).view(np.uint64)
    else:  # uint, bool
        words = values.astype(np.uint64, copy=False)
    if col.valid is not None:
        words = np.where(col.valid, words, np.uint64(0))
    return words


def _fixed_array(
    kind: str, arrow_type: pa.DataType, words: np.ndarray, mask: np.ndarray | None
) -> pa.Array:
    if kind == "bool":
        return pa.array(words != 0, type=pa.bool_(), mask=mask)
    if kind == "float":
        values = words.view(np.float64).astype(arrow_type.to_pandas_dtype(), copy=False)
        return pa.array(values, type=arrow_type, mask=mask)
    if kind == "uint":
        return pa.array(words.astype(arrow_type.to_pandas_dtype()), type=arrow_type, mask=mask)
    signed = words.view(np.int64)
    if kind == "decimal":
        return decimal_array(arrow_type, signed, signed >> np.int64(63), mask)
    if kind == "int":
        return pa.array(signed.astype(arrow_type.to_pandas_dtype()), type=arrow_type, mask=mask)
    storage = pa.int32() if arrow_type.bit_width == 32 else pa.int64()
    values = signed.astype(storage.to_pandas_dtype())
    return pa.array(values, type=storage, mask=mask).view(arrow_type)


def _var_array(
    kind: str,
    arrow_type: pa.DataType,
    m: int,
    offsets: np.ndarray,
    data: np.ndarray,
    mask: np.ndarray | None,
) -> pa.Array:
    large = pa.large_string() if kind == "string" else pa.large_binary()
    validity = None
    if mask is not None:
        validity = pa.py_buffer(np.packbits(~mask, bitorder="little"))
    arr = pa.Array.from_buffers(
        large,
        m,
        [validity, pa.py_buffer(np.ascontiguousarray(offsets)), pa.py_buffer(data)],
        null_count=0 if mask is None else int(mask.sum()),
    )
    if arr.type != arrow_type:
        try:
            arr = arr.cast(arrow_type)
        except pa.ArrowInvalid:  # more than 2 GiB in one batch: keep the large type
            pass
    return arr
