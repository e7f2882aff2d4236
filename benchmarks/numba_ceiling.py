"""The ceiling of the columnar benchmark: a bare numba hash aggregation with no spilling.

One open-addressing table (linear probing, power-of-two capacity, at most 50 % full) of
one to three int64 key columns and up to two float64 value columns. Each slot is one row of an
int64 matrix ``[count, keys..., states...]`` (keys and states interleaved, states stored as
float64 bits, a row padded to 32 or 64 bytes) so a probe touches one cache line; ``count == 0``
marks an empty slot. Given the number of groups (``groups=``) the table is *presized*: allocated
once at its final size, never grown or rehashed. One compiled pass over the rows, one thread, no
memory accounting, no nulls, no spilling: what this machine can do when nothing but the hash
table stands in the way. ``bench_columnar.py`` runs it presized with one aggregate (``sum`` of
the first aggregated column; the row count comes free as the occupancy mark).
:func:`reference_aggregate` is its plain-Python twin (the smoke test compares them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np

__all__ = ["OPS", "capacity_for", "ceiling_aggregate", "reference_aggregate"]

#: value-column operations: code per name
OPS = {"sum": 0, "max": 1}
MAX_KEYS = 3
MAX_VALUES = 2
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@numba.njit(cache=True, nogil=True, inline="always")
def _mix(h, k):  # pragma: no cover - compiled
    x = h ^ (np.uint64(k) + _GOLDEN)
    x ^= x >> np.uint64(33)
    x *= _M1
    x ^= x >> np.uint64(33)
    x *= _M2
    x ^= x >> np.uint64(33)
    return x


@numba.njit(cache=True, nogil=True, inline="always")
def _slot_hash(tab, s, nk):  # pragma: no cover - compiled
    h = _mix(np.uint64(0), tab[s, 1])
    if nk > 1:
        h = _mix(h, tab[s, 2])
    if nk > 2:
        h = _mix(h, tab[s, 3])
    return h


@numba.njit(cache=True, nogil=True)
def _grow(tab, nk):  # pragma: no cover - compiled
    capacity = tab.shape[0] * 2
    new = np.zeros((capacity, tab.shape[1]), dtype=np.int64)
    mask = np.uint64(capacity - 1)
    for s in range(tab.shape[0]):
        if tab[s, 0] == 0:
            continue
        pos = _slot_hash(tab, s, nk) & mask
        while new[pos, 0] != 0:
            pos = (pos + np.uint64(1)) & mask
        new[pos, :] = tab[s, :]
    return new


@numba.njit(cache=True, nogil=True)
def _aggregate(k0, k1, k2, nk, v0, v1, nv, op0, op1, width, capacity):  # pragma: no cover
    n = k0.shape[0]
    sc = 1 + nk  # first state column
    tab = np.zeros((capacity, width), dtype=np.int64)
    ftab = tab.view(np.float64)
    mask = np.uint64(capacity - 1)
    groups = 0
    for i in range(n):
        a = k0[i]
        h = _mix(np.uint64(0), a)
        b = np.int64(0)
        c = np.int64(0)
        if nk > 1:
            b = k1[i]
            h = _mix(h, b)
        if nk > 2:
            c = k2[i]
            h = _mix(h, c)
        pos = h & mask
        while True:
            if tab[pos, 0] == 0:
                if 2 * (groups + 1) > tab.shape[0]:
                    tab = _grow(tab, nk)
                    ftab = tab.view(np.float64)
                    mask = np.uint64(tab.shape[0] - 1)
                    pos = h & mask
                    while tab[pos, 0] != 0:
                        pos = (pos + np.uint64(1)) & mask
                groups += 1
                tab[pos, 0] = 1
                tab[pos, 1] = a
                if nk > 1:
                    tab[pos, 2] = b
                if nk > 2:
                    tab[pos, 3] = c
                ftab[pos, sc] = v0[i]
                if nv > 1:
                    ftab[pos, sc + 1] = v1[i]
                break
            if tab[pos, 1] == a and (nk < 2 or tab[pos, 2] == b) and (nk < 3 or tab[pos, 3] == c):
                tab[pos, 0] += 1
                x = v0[i]
                if op0 == 0:
                    ftab[pos, sc] += x
                elif x > ftab[pos, sc]:
                    ftab[pos, sc] = x
                if nv > 1:
                    y = v1[i]
                    if op1 == 0:
                        ftab[pos, sc + 1] += y
                    elif y > ftab[pos, sc + 1]:
                        ftab[pos, sc + 1] = y
                break
            pos = (pos + np.uint64(1)) & mask
    used = np.flatnonzero(tab[:, 0])
    out_keys = np.empty((nk, groups), dtype=np.int64)
    out_counts = np.empty(groups, dtype=np.int64)
    out_states = np.empty((nv, groups), dtype=np.float64)
    for g in range(groups):
        s = used[g]
        out_counts[g] = tab[s, 0]
        for j in range(nk):
            out_keys[j, g] = tab[s, 1 + j]
        for j in range(nv):
            out_states[j, g] = ftab[s, sc + j]
    return out_keys, out_counts, out_states


def capacity_for(groups: int) -> int:
    """Slots of a table presized for ``groups`` groups (a power of two, at most half full)."""
    capacity = 1024
    while capacity < 2 * groups:
        capacity *= 2
    return capacity


def ceiling_aggregate(
    keys: Sequence[np.ndarray],
    values: Sequence[np.ndarray],
    ops: Sequence[str],
    groups: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group rows by the int64 ``keys`` columns; per group the row count and ``ops[j]`` of ``values[j]``.

    Returns ``(group_keys[len(keys), groups], counts[groups], states[len(values), groups])`` in
    slot order. Takes 1–3 key columns and 1–2 value columns of one length. ``groups``: the
    number of groups if known, to allocate the table once at its final size (presized; the
    table still grows should there be more).
    """
    if not 1 <= len(keys) <= MAX_KEYS:
        raise ValueError(
            f"the ceiling table takes 1 to {MAX_KEYS} int64 key columns, got {len(keys)}"
        )
    if not 1 <= len(values) <= MAX_VALUES or len(values) != len(ops):
        raise ValueError(
            f"need 1 to {MAX_VALUES} value columns with one op each, got {len(values)} and {list(ops)}"
        )
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise ValueError(f"unknown ops {unknown}; the ceiling knows {sorted(OPS)}")
    ks = [np.ascontiguousarray(k, dtype=np.int64) for k in keys]
    vs = [np.ascontiguousarray(v, dtype=np.float64) for v in values]
    n = len(ks[0])
    if any(len(c) != n for c in (*ks, *vs)):
        raise ValueError("all key and value columns must have the same length")
    codes = [OPS[op] for op in ops]
    width = 4 if 1 + len(ks) + len(vs) <= 4 else 8  # slot rows of 32 or 64 bytes
    return _aggregate(
        ks[0], ks[min(1, len(ks) - 1)], ks[len(ks) - 1], len(ks),
        vs[0], vs[len(vs) - 1], len(vs), codes[0], codes[-1], width, capacity_for(groups or 0),
    )  # fmt: skip


def reference_aggregate(
    keys: Sequence[np.ndarray], values: Sequence[np.ndarray], ops: Sequence[str]
) -> dict[tuple[int, ...], tuple[int, list[float]]]:
    """Plain-Python twin of :func:`ceiling_aggregate`: key tuple → (count, states)."""
    out: dict[tuple[int, ...], tuple[int, list[float]]] = {}
    for i in range(len(keys[0])):
        key = tuple(int(k[i]) for k in keys)
        row = [float(v[i]) for v in values]
        if key not in out:
            out[key] = (1, row)
            continue
        count, states = out[key]
        for j, op in enumerate(ops):
            states[j] = states[j] + row[j] if op == "sum" else max(states[j], row[j])
        out[key] = (count + 1, states)
    return out
