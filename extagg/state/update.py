"""The streaming update: the previous version's records merged with new ``(key, combiner)`` pairs.

Both inputs are in ascending ``stable_hash`` order, so one pass over them produces the next
version without holding it: keys only in the old state pass through (to the snapshot, if one is
written), keys only in the new pairs are inserted, keys in both become
``merge_combiners(old, new)``. Every inserted or combined key goes to the delta. Memory is one
hash group of each input plus the writers' buffers.

Keys compare as Python compares them: a new key equal to a stored one (``1`` and ``1.0``) with
different bytes is matched by decoding the stored keys of that hash group; the delta records the
caller's key and the snapshot keeps the stored one, exactly as a dict replay of the files would.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from extagg.hashing import hash_objects
from extagg.state.codec import decode_key, decode_value, encode_value
from extagg.state.files import StateFileWriter

__all__ = ["UpdateStats", "stream_update", "hash_groups", "record_batch_pairs"]

_pack_hash = struct.Struct(">Q").pack


@dataclass
class UpdateStats:
    """What one streaming update produced."""

    num_keys: int = 0  # keys of the new version
    encoded_bytes: int = 0  # encoded key + value bytes of the new version
    changed_keys: int = 0  # records in the delta
    new_keys: int = 0  # keys that were not in the previous version


#: pairs hashed at once (vectorised for int, float and str keys)
HASH_CHUNK = 4096


def _bad_pair(chunk: list[Any], offset: int) -> TypeError:
    for index, pair in enumerate(chunk):
        try:
            _key, _combiner = pair
        except (TypeError, ValueError):
            return TypeError(
                f"merge_update expects (key, combiner) pairs; item {offset + index} is {pair!r}"
            )
    return TypeError("merge_update expects (key, combiner) pairs")


def hash_groups(
    pairs: Iterable[tuple[Any, Any]],
) -> Iterator[tuple[bytes, list[tuple[Any, bytes, Any]]]]:
    """Group ``(key, combiner)`` pairs by hash: ``(prefix, [(key, encoded key, combiner)])``.

    Checks that hashes never decrease and that no key repeats (``ValueError`` naming the key),
    and that keys can be hashed and encoded (``TypeError`` naming the type). Each group is
    sorted by encoded key. Hashes are computed a chunk at a time with ``hash_objects``.
    """
    iterator = iter(pairs)
    group: list[tuple[Any, bytes, Any]] = []
    group_hash = -1
    prefix = b""
    previous_key: Any = None
    offset = 0
    while True:
        chunk = list(islice(iterator, HASH_CHUNK))
        if not chunk:
            break
        try:
            keys = [key for key, _combiner in chunk]
        except (TypeError, ValueError):
            raise _bad_pair(chunk, offset) from None
        hashes = hash_objects(keys).tolist()
        for index, key_hash in enumerate(hashes):
            key = keys[index]
            if key_hash != group_hash:
                if key_hash < group_hash:
                    raise ValueError(
                        f"merge_update input is not in key-hash order: key {key!r} (hash "
                        f"{key_hash:#018x}) at position {offset + index} comes after key "
                        f"{previous_key!r} (hash {group_hash:#018x}); pass pairs in the order "
                        "ExternalAppendOnlyMap.iterator(ordered=True) yields them "
                        "(ascending stable_hash)"
                    )
                if group:
                    if len(group) > 1:
                        group.sort(key=_encoded_key)
                    yield prefix, group
                group_hash = key_hash
                prefix = _pack_hash(key_hash)
                group = [(key, prefix + encode_value(key), chunk[index][1])]
            else:
                encoded = prefix + encode_value(key)
                for other, other_encoded, _combiner in group:
                    # equal bytes too: two NaN objects (also inside tuples) are one stored key
                    # though not ==, as in the store, whose keys are made canonical
                    if other_encoded == encoded or other == key:
                        raise ValueError(
                            f"merge_update input repeats key {key!r} (at position "
                            f"{offset + index}); each key must appear once, combined"
                        )
                group.append((key, encoded, chunk[index][1]))
            previous_key = key
        offset += len(chunk)
    if group:
        group.sort(key=_encoded_key)
        yield prefix, group


def _encoded_key(item: tuple[Any, bytes, Any]) -> bytes:
    return item[1]


def _python_values(column: Any) -> list[Any]:
    """A column's values as Python objects; temporal columns as their integer storage, which is
    what the columnar engine hashes (so the pairs stay in its hash order)."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_date32(kind) or pa.types.is_time32(kind):
        column = column.cast(pa.int32())
    elif pa.types.is_temporal(kind):
        column = column.cast(pa.int64())
    return column.to_pylist()


def record_batch_pairs(
    batches: Iterable[Any],
    keys: str | Sequence[str],
    values: str | Sequence[str] | None = None,
) -> Iterator[tuple[Any, Any]]:
    """``(key, combiner)`` pairs from Arrow record batches such as ``HashAggregator.results()``,
    for :meth:`StateStoreProvider.merge_update`.

    Parameters
    ----------
    batches
        Arrow record batches (or tables), read lazily one at a time.
    keys
        The key column, or several (the key is then the tuple of their values, whose
        ``stable_hash`` is the engine's order).
    values
        The combiner column, or several (a tuple); default every other column in schema order.

    Returns
    -------
    Iterator[tuple[Any, Any]]
        Pairs in the batches' order; memory held is one batch's Python values.
    """
    key_names = [keys] if isinstance(keys, str) else list(keys)
    for batch in batches:
        names = batch.schema.names
        if values is None:
            value_names = [name for name in names if name not in key_names]
        else:
            value_names = [values] if isinstance(values, str) else list(values)
        missing = [name for name in (*key_names, *value_names) if name not in names]
        if missing:
            raise ValueError(f"record batch has no column(s) {missing}; its columns are {names}")
        key_columns = [_python_values(batch.column(name)) for name in key_names]
        value_columns = [batch.column(name).to_pylist() for name in value_names]
        batch_keys = key_columns[0] if len(key_columns) == 1 else zip(*key_columns)
        batch_values = value_columns[0] if len(value_columns) == 1 else zip(*value_columns)
        yield from zip(batch_keys, batch_values)


def _encoder(allow_pickle: bool, owner: str) -> Callable[[Any, Any], bytes]:
    def encode(key: Any, value: Any) -> bytes:
        if value is None:  # StateStore.put's rule (Spark's): the codec could, the store may not
            raise ValueError(f"Cannot put a null value (key {key!r}) into {owner}")
        try:
            return encode_value(value, allow_pickle)
        except TypeError as exc:
            raise TypeError(f"cannot store the combiner of key {key!r}: {exc}") from None

    return encode


def stream_update(
    old_records: Iterable[tuple[bytes, bytes]],
    pairs: Iterable[tuple[Any, Any]],
    merge_combiners: Callable[[Any, Any], Any],
    delta: StateFileWriter,
    snapshot: StateFileWriter | None,
    allow_pickle: bool = False,
    owner: str = "the state store",
    stored_error: Callable[[ValueError, bytes], Exception] | None = None,
) -> UpdateStats:
    """Merge sorted ``old_records`` with ``pairs``; write changes to ``delta`` and, when given,
    the whole new version to ``snapshot``. The caller commits or cancels the writers.

    A ``None`` combiner (or merged value) raises ``ValueError`` naming the key and ``owner``, as
    :meth:`StateStore.put` does: a stored None would read as an absent key. A stored record
    that cannot be decoded raises ``stored_error(error, encoded key)`` (the caller names the
    file), not the codec's bare ``ValueError``."""
    encode = _encoder(allow_pickle, owner)

    def decode_stored(key_bytes: bytes, value: bytes | None) -> Any:
        """The stored key (``value`` None) or value of the record of ``key_bytes``."""
        try:
            return decode_key(key_bytes) if value is None else decode_value(value, allow_pickle)
        except ValueError as exc:
            if stored_error is None:
                raise
            raise stored_error(exc, key_bytes) from None

    delta_write = delta.write
    snapshot_write = snapshot.write if snapshot is not None else None
    num_keys = encoded_bytes = changed = new = 0
    old_iter = iter(old_records)
    old = next(old_iter, None)
    for prefix, group in hash_groups(pairs):
        # pass through older hashes (an encoded key is < prefix iff its hash is smaller)
        while old is not None and old[0] < prefix:
            num_keys += 1
            encoded_bytes += len(old[0]) + len(old[1])
            if snapshot_write is not None:
                snapshot_write(*old)
            old = next(old_iter, None)
        same: list[tuple[bytes, bytes]] = []
        while old is not None and old[0].startswith(prefix):
            same.append(old)
            old = next(old_iter, None)
        if len(group) == 1 and (not same or (len(same) == 1 and same[0][0] == group[0][1])):
            key, key_bytes, combiner = group[0]  # the common case: one key, stored or not
            if same:
                combiner = merge_combiners(decode_stored(*same[0]), combiner)
            else:
                new += 1
            value = encode(key, combiner)
            delta_write(key_bytes, value)
            changed += 1
            num_keys += 1
            encoded_bytes += len(key_bytes) + len(value)
            if snapshot_write is not None:
                snapshot_write(key_bytes, value)
            continue
        delta_out, kept, group_new = _merge_group(
            group, same, merge_combiners, encode, decode_stored
        )
        new += group_new
        changed += len(delta_out)
        for key_bytes, value in delta_out:
            delta_write(key_bytes, value)
        for key_bytes, value in kept:
            num_keys += 1
            encoded_bytes += len(key_bytes) + len(value)
            if snapshot_write is not None:
                snapshot_write(key_bytes, value)
    while old is not None:
        num_keys += 1
        encoded_bytes += len(old[0]) + len(old[1])
        if snapshot_write is not None:
            snapshot_write(*old)
        old = next(old_iter, None)
    return UpdateStats(num_keys, encoded_bytes, changed, new)


def _merge_group(
    group: list[tuple[Any, bytes, Any]],
    same: list[tuple[bytes, bytes]],
    merge_combiners: Callable[[Any, Any], Any],
    encode: Callable[[Any, Any], bytes],
    decode_stored: Callable[[bytes, bytes | None], Any],
) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]], int]:
    """One hash group with several keys, or equal keys with different bytes.

    ``decode_stored(key bytes, None)`` decodes a stored key, ``(key bytes, value bytes)`` its
    value.

    Returns the sorted delta records, the sorted records of the new version, and the number of
    new keys.
    """
    stored_keys: list[Any] = [None] * len(same)
    matched = [False] * len(same)
    delta_out: list[tuple[bytes, bytes]] = []
    kept: list[tuple[bytes, bytes]] = []
    new = 0
    for key, key_bytes, combiner in group:
        match = -1
        for index, (old_key, _old_value) in enumerate(same):
            if matched[index]:
                continue
            if old_key == key_bytes:
                match = index
                break
            if stored_keys[index] is None:
                stored_keys[index] = (decode_stored(old_key, None),)
            if stored_keys[index][0] == key:
                match = index
                break
        if match < 0:
            value = encode(key, combiner)
            delta_out.append((key_bytes, value))
            kept.append((key_bytes, value))
            new += 1
        else:
            matched[match] = True
            old_key, old_value = same[match]
            value = encode(key, merge_combiners(decode_stored(old_key, old_value), combiner))
            delta_out.append((key_bytes, value))
            kept.append((old_key, value))
    kept.extend(record for index, record in enumerate(same) if not matched[index])
    return sorted(delta_out), sorted(kept), new
