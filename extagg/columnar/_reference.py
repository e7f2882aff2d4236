"""Plain-Python references of :mod:`extagg.columnar._kernels` (same names, same results).

Written with Python integers and floats, for the tests: the 128-bit sums are plain Python
integers split into words at the end.
"""

from __future__ import annotations

import math

import numpy as np

_M64 = (1 << 64) - 1


def _rows(gids, valid):
    for i, g in enumerate(gids.tolist()):
        if len(valid) and not valid[i]:
            continue
        yield i, g


def count_rows(gids, n):
    for g in gids.tolist():
        n[g] += 1


def count_valid(gids, valid, n):
    for _i, g in _rows(gids, valid):
        n[g] += 1


def merge_add(out_gid, src, dst):
    for i, g in enumerate(out_gid.tolist()):
        dst[g] += src[i]


def merge_or(out_gid, src, dst):
    for i, g in enumerate(out_gid.tolist()):
        if src[i]:
            dst[g] = True


def _get128(lo, hi, g):
    return (int(hi[g]) << 64) + int(lo[g])


def _set128(lo, hi, g, value):
    lo[g] = value & _M64
    high = value >> 64
    hi[g] = ((high + (1 << 63)) & _M64) - (1 << 63)  # wraps like int64


def sum_int(gids, values, valid, lo, hi, has):
    for i, g in _rows(gids, valid):
        _set128(lo, hi, g, _get128(lo, hi, g) + int(values[i]))
        has[g] = True


sum_uint = sum_int


def merge_sum128(out_gid, slo, shi, dlo, dhi):
    for i, g in enumerate(out_gid.tolist()):
        _set128(dlo, dhi, g, _get128(dlo, dhi, g) + _get128(slo, shi, i))


def _neumaier(s, c, g, x):
    sv = float(s[g])
    t = sv + x
    if abs(sv) >= abs(x):
        c[g] = float(c[g]) + ((sv - t) + x)
    else:
        c[g] = float(c[g]) + ((x - t) + sv)
    s[g] = t


def sum_float(gids, values, valid, s, c, has):
    for i, g in _rows(gids, valid):
        _neumaier(s, c, g, float(values[i]))
        has[g] = True


def merge_fsum(out_gid, ss, sc, ds, dc):
    for i, g in enumerate(out_gid.tolist()):
        sv, x = float(ds[g]), float(ss[i])
        t = sv + x
        err = (sv - t) + x if abs(sv) >= abs(x) else (x - t) + sv
        dc[g] = float(dc[g]) + (err + float(sc[i]))
        ds[g] = t


def _greater(x, v):
    x_nan = isinstance(x, float) and math.isnan(x)
    v_nan = isinstance(v, float) and math.isnan(v)
    return (not x_nan and not v_nan and x > v) or (x_nan and not v_nan)


def _less(x, v):
    x_nan = isinstance(x, float) and math.isnan(x)
    v_nan = isinstance(v, float) and math.isnan(v)
    return (not x_nan and not v_nan and x < v) or (v_nan and not x_nan)


def _item(arr, i):
    return arr[i].item()


def min_update(gids, values, valid, v, has):
    for i, g in _rows(gids, valid):
        x = _item(values, i)
        if not has[g] or _less(x, _item(v, g)):
            v[g] = x
            has[g] = True


def max_update(gids, values, valid, v, has):
    for i, g in _rows(gids, valid):
        x = _item(values, i)
        if not has[g] or _greater(x, _item(v, g)):
            v[g] = x
            has[g] = True


def merge_min(out_gid, sv, shas, dv, dhas):
    for i, g in enumerate(out_gid.tolist()):
        if shas[i] and (not dhas[g] or _less(_item(sv, i), _item(dv, g))):
            dv[g] = sv[i]
            dhas[g] = True


def merge_max(out_gid, sv, shas, dv, dhas):
    for i, g in enumerate(out_gid.tolist()):
        if shas[i] and (not dhas[g] or _greater(_item(sv, i), _item(dv, g))):
            dv[g] = sv[i]
            dhas[g] = True


def first_update(gids, values, valid, seq_base, skip_nulls, v, seq, null):
    for i, g in enumerate(gids.tolist()):
        is_null = bool(len(valid)) and not valid[i]
        if (skip_nulls and is_null) or seq[g] >= 0:
            continue
        seq[g] = seq_base + i
        null[g] = is_null
        if not is_null:
            v[g] = values[i]


def last_update(gids, values, valid, seq_base, skip_nulls, v, seq, null):
    for i, g in enumerate(gids.tolist()):
        is_null = bool(len(valid)) and not valid[i]
        if skip_nulls and is_null:
            continue
        seq[g] = seq_base + i
        null[g] = is_null
        if not is_null:
            v[g] = values[i]


def merge_first(out_gid, sv, sseq, snull, dv, dseq, dnull):
    for i, g in enumerate(out_gid.tolist()):
        if sseq[i] >= 0 and (dseq[g] < 0 or sseq[i] < dseq[g]):
            dseq[g], dnull[g], dv[g] = sseq[i], snull[i], sv[i]


def merge_last(out_gid, sv, sseq, snull, dv, dseq, dnull):
    for i, g in enumerate(out_gid.tolist()):
        if sseq[i] > dseq[g]:
            dseq[g], dnull[g], dv[g] = sseq[i], snull[i], sv[i]


def var_update(gids, values, valid, n, mean, m2):
    for i, g in _rows(gids, valid):
        x = float(values[i])
        c = int(n[g]) + 1
        n[g] = c
        d = x - float(mean[g])
        mean[g] = float(mean[g]) + d / c
        m2[g] = float(m2[g]) + d * (x - float(mean[g]))


def merge_var(out_gid, sn, smean, sm2, dn, dmean, dm2):
    for i, g in enumerate(out_gid.tolist()):
        b = int(sn[i])
        if b == 0:
            continue
        a = int(dn[g])
        if a == 0:
            dn[g], dmean[g], dm2[g] = b, smean[i], sm2[i]
            continue
        c = a + b
        d = float(smean[i]) - float(dmean[g])
        dmean[g] = float(dmean[g]) + d * b / c
        dm2[g] = float(dm2[g]) + (float(sm2[i]) + d * d * (float(a) * b / c))
        dn[g] = c


def _get192(lo, mid, hi, g):
    return (int(hi[g]) << 128) + (int(mid[g]) << 64) + int(lo[g])


def _set192(lo, mid, hi, g, value):
    lo[g] = value & _M64
    mid[g] = (value >> 64) & _M64
    high = value >> 128
    hi[g] = ((high + (1 << 63)) & _M64) - (1 << 63)  # wraps like int64


def sum_dec128(gids, values, valid, lo, mid, hi, has):
    for i, g in _rows(gids, valid):
        value = (int(values[i, 1]) << 64) + (int(values[i, 0]) & _M64)
        _set192(lo, mid, hi, g, _get192(lo, mid, hi, g) + value)
        has[g] = True


def merge_sum192(out_gid, slo, smid, shi, dlo, dmid, dhi):
    for i, g in enumerate(out_gid.tolist()):
        total = _get192(dlo, dmid, dhi, g) + _get192(slo, smid, shi, i)
        _set192(dlo, dmid, dhi, g, total)


def _dec(lo, hi, i):
    return (int(hi[i]) << 64) + (int(lo[i]) & _M64)


def minmax_dec128(gids, values, valid, is_max, vlo, vhi, has):
    for i, g in _rows(gids, valid):
        x = (int(values[i, 1]) << 64) + (int(values[i, 0]) & _M64)
        if not has[g] or (x > _dec(vlo, vhi, g) if is_max else x < _dec(vlo, vhi, g)):
            vlo[g], vhi[g], has[g] = values[i, 0], values[i, 1], True


def merge_minmax_dec128(out_gid, is_max, slo, shi, shas, dlo, dhi, dhas):
    for i, g in enumerate(out_gid.tolist()):
        if not shas[i]:
            continue
        x = _dec(slo, shi, i)
        if not dhas[g] or (x > _dec(dlo, dhi, g) if is_max else x < _dec(dlo, dhi, g)):
            dlo[g], dhi[g], dhas[g] = slo[i], shi[i], True


def seq_dec128(gids, values, valid, seq_base, skip_nulls, is_last, vlo, vhi, seq, null):
    for i, g in enumerate(gids.tolist()):
        is_null = bool(len(valid)) and not valid[i]
        if (skip_nulls and is_null) or (not is_last and seq[g] >= 0):
            continue
        seq[g] = seq_base + i
        null[g] = is_null
        if not is_null:
            vlo[g], vhi[g] = values[i, 0], values[i, 1]


def merge_seq_dec128(out_gid, is_last, slo, shi, sseq, snull, dlo, dhi, dseq, dnull):
    for i, g in enumerate(out_gid.tolist()):
        s = int(sseq[i])
        if s < 0:
            continue
        if (is_last and s > dseq[g]) or (not is_last and (dseq[g] < 0 or s < dseq[g])):
            dseq[g], dnull[g], dlo[g], dhi[g] = s, snull[i], slo[i], shi[i]


# -- variable-length states (see the kernels' comment) ----------------------------------------


def _put_var(arena, used, ref, ln, g, value):
    n = len(value)
    at = int(ref[g])
    if ln[g] < n:
        at = used
        used += n
    arena[at : at + n] = np.frombuffer(value, dtype=np.uint8)
    ref[g] = at
    ln[g] = n
    return used


def _stored(arena, ref, ln, g):
    return bytes(arena[int(ref[g]) : int(ref[g]) + int(ln[g])])


def minmax_var_update(gids, offsets, data, valid, is_max, arena, used, ref, ln, has):
    for i, g in enumerate(gids.tolist()):
        if len(valid) and not valid[i]:
            continue
        value = bytes(data[int(offsets[i]) : int(offsets[i + 1])])
        if has[g]:
            old = _stored(arena, ref, ln, g)
            if not (value > old if is_max else value < old):
                continue
        used = _put_var(arena, used, ref, ln, g, value)
        has[g] = True
    return used


def seq_var_update(
    gids, offsets, data, valid, seq_base, skip_nulls, last, arena, used, ref, ln, seq, null
):
    order = range(len(gids) - 1, -1, -1) if last else range(len(gids))
    for i in order:
        g = int(gids[i])
        is_null = bool(len(valid)) and not valid[i]
        if (skip_nulls and is_null) or (seq[g] >= seq_base + i if last else seq[g] >= 0):
            continue
        seq[g] = seq_base + i
        null[g] = is_null
        if is_null:
            ln[g] = min(int(ln[g]), 0)
        else:
            used = _put_var(arena, used, ref, ln, g, bytes(data[offsets[i] : offsets[i + 1]]))
    return used


def _pack(values):
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(v) for v in values]) if values else []
    return offsets, np.frombuffer(b"".join(values), dtype=np.uint8).copy()


def gather_arena(arena, ref, ln, groups):
    return _pack([_stored(arena, ref, ln, g) if ln[g] > 0 else b"" for g in groups.tolist()])


def merge_minmax_var(out_gid, is_max, soff, sdata, shas, win):
    def value(r):
        return bytes(sdata[soff[r] : soff[r + 1]])

    for i, g in enumerate(out_gid.tolist()):
        if not shas[i]:
            continue
        w = int(win[g])
        if w < 0 or (value(i) > value(w) if is_max else value(i) < value(w)):
            win[g] = i


def merge_seq_var(out_gid, last, sseq, snull, win, dseq, dnull):
    for i, g in enumerate(out_gid.tolist()):
        s = int(sseq[i])
        if s < 0:
            continue
        if (s > dseq[g]) if last else (dseq[g] < 0 or s < dseq[g]):
            dseq[g], dnull[g], win[g] = s, snull[i], i


def gather_var_rows(offsets, data, rows):
    return _pack(
        [b"" if r < 0 else bytes(data[offsets[r] : offsets[r + 1]]) for r in rows.tolist()]
    )


FUSED_COUNT, FUSED_SUM_FLOAT, FUSED_SUM_INT = 0, 1, 2
FUSED_MIN_FLOAT, FUSED_MAX_FLOAT, FUSED_MIN_INT, FUSED_MAX_INT = 3, 4, 5, 6


def fused_update(gids, fcols, icols, ops, rows, width):
    """Reference of ``fused_update``: each operation on its own, through the one-aggregate
    references on NumPy views of its fields in the rows (operations touch disjoint fields, so
    doing them one after the other gives what doing them row by row gives)."""
    none = np.zeros(0, dtype=np.bool_)
    groups = len(rows) // width if width else 0

    def field(offset, dtype):
        return np.ndarray(groups, dtype=dtype, buffer=rows, offset=offset, strides=(width,))

    for code, col, a, b, flag in ops.tolist():
        has = field(flag, np.bool_) if flag >= 0 else None  # every code but FUSED_COUNT has one
        if code == FUSED_COUNT:
            count_rows(gids, field(a, np.int64))
        elif code == FUSED_SUM_FLOAT:
            sum_float(gids, fcols[col], none, field(a, np.float64), field(b, np.float64), has)
        elif code == FUSED_SUM_INT:
            sum_int(gids, icols[col], none, field(a, np.uint64), field(b, np.int64), has)
        elif code in (FUSED_MIN_FLOAT, FUSED_MAX_FLOAT):
            update = min_update if code == FUSED_MIN_FLOAT else max_update
            update(gids, fcols[col], none, field(a, np.float64), has)
        else:
            update = min_update if code == FUSED_MIN_INT else max_update
            update(gids, icols[col], none, field(a, np.int64), has)


def fused_update_few(gids, groups, fcols, icols, ops, rows, width):
    """Reference of ``fused_update_few``: ``fused_update``'s (its integer operations do not
    depend on the order rows are folded in); ``groups`` bounds the group ids."""
    assert len(gids) == 0 or int(np.max(gids)) < groups
    assert all(int(code) in (FUSED_COUNT, FUSED_SUM_INT, FUSED_MIN_INT, FUSED_MAX_INT)
               for code in ops[:, 0])  # fmt: skip
    fused_update(gids, fcols, icols, ops, rows, width)
