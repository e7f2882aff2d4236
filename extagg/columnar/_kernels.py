"""numba kernels that update and merge aggregate states, one state array per field.

``update`` kernels fold input rows into per-group states: ``gids[i]`` is the group of row ``i``,
``values``/``valid`` its value and validity (an empty ``valid`` means no nulls). ``merge``
kernels fold rows of partial states (from spilled runs) into output groups: ``out_gid[i]`` is
the output group of partial row ``i``. Semantics follow Spark SQL: nulls are skipped (except by
``first``/``last``), NaN is a value greater than every other float, integer sums are exact in a
128-bit accumulator (``lo`` unsigned low word, ``hi`` signed high word) so overflow is detected
when results are produced, whatever the spill pattern; float sums are compensated (Neumaier);
``first``/``last`` carry the global row number of their value so merging in any order gives
the same answer.

Plain-Python references with the same names: :mod:`extagg.columnar._reference`.
"""

from __future__ import annotations

import numpy as np

from extagg._numba import (
    copy_bytes,
    jit,
    load_f64,
    load_i64,
    load_u64,
    prefetch,
    store_f64,
    store_i64,
    store_u64,
)

_jit = jit()


@_jit
def count_rows(gids, n):
    for i in range(gids.shape[0]):
        n[gids[i]] += 1


@_jit
def count_valid(gids, valid, n):
    if valid.shape[0] == 0:
        for i in range(gids.shape[0]):
            n[gids[i]] += 1
    else:
        for i in range(gids.shape[0]):
            if valid[i]:
                n[gids[i]] += 1


@_jit
def merge_add(out_gid, src, dst):
    for i in range(out_gid.shape[0]):
        dst[out_gid[i]] += src[i]


@_jit
def merge_or(out_gid, src, dst):
    for i in range(out_gid.shape[0]):
        if src[i]:
            dst[out_gid[i]] = True


# Helpers that take arrays are not used in the loops: such calls cost ~100 ns per row.


@_jit
def sum_int(gids, values, valid, lo, hi, has):
    """Signed (or small unsigned, or bool) values into 128-bit sums."""
    has_mask = valid.shape[0] > 0
    for i in range(gids.shape[0]):
        if has_mask and not valid[i]:
            continue
        g = gids[i]
        v = np.int64(values[i])
        old = lo[g]
        new = old + np.uint64(v)
        lo[g] = new
        hi[g] += (np.int64(-1) if v < 0 else np.int64(0)) + np.int64(new < old)
        has[g] = True


@_jit
def sum_uint(gids, values, valid, lo, hi, has):
    """uint64 values into 128-bit sums."""
    has_mask = valid.shape[0] > 0
    for i in range(gids.shape[0]):
        if has_mask and not valid[i]:
            continue
        g = gids[i]
        old = lo[g]
        new = old + np.uint64(values[i])
        lo[g] = new
        hi[g] += np.int64(new < old)
        has[g] = True


@_jit
def merge_sum128(out_gid, slo, shi, dlo, dhi):
    for i in range(out_gid.shape[0]):
        g = out_gid[i]
        old = dlo[g]
        new = old + slo[i]
        dlo[g] = new
        dhi[g] += shi[i] + np.int64(new < old)


@_jit
def sum_float(gids, values, valid, s, c, has):
    """Compensated (Neumaier) float sums: ``s + c`` is the sum, ``c`` the lost low bits."""
    has_mask = valid.shape[0] > 0
    for i in range(gids.shape[0]):
        if has_mask and not valid[i]:
            continue
        g = gids[i]
        x = np.float64(values[i])
        a = s[g]
        t = a + x
        if abs(a) >= abs(x):
            c[g] += (a - t) + x
        else:
            c[g] += (x - t) + a
        s[g] = t
        has[g] = True


@_jit
def merge_fsum(out_gid, ss, sc, ds, dc):
    for i in range(out_gid.shape[0]):
        g = out_gid[i]
        x = ss[i]
        a = ds[g]
        t = a + x
        if abs(a) >= abs(x):
            dc[g] += (a - t) + x + sc[i]
        else:
            dc[g] += (x - t) + a + sc[i]
        ds[g] = t


@_jit
def _greater(x, v):
    # NaN is greater than every other value (Spark); for integers x != x is False
    return x > v or (x != x and v == v)


@_jit
def _less(x, v):
    return x < v or (v != v and x == x)


@_jit
def min_update(gids, values, valid, v, has):
    has_mask = valid.shape[0] > 0
    for i in range(gids.shape[0]):
        if has_mask and not valid[i]:
            continue
        g = gids[i]
        x = values[i]
        if not has[g] or _less(x, v[g]):
            v[g] = x
            has[g] = True


@_jit
def max_update(gids, values, valid, v, has):
    has_mask = valid.shape[0] > 0
    for i in range(gids.shape[0]):
        if has_mask and not valid[i]:
            continue
        g = gids[i]
        x = values[i]
        if not has[g] or _greater(x, v[g]):
            v[g] = x
            has[g] = True


@_jit
def merge_min(out_gid, sv, shas, dv, dhas):
    for i in range(out_gid.shape[0]):
        if shas[i]:
            g = out_gid[i]
            if not dhas[g] or _less(sv[i], dv[g]):
                dv[g] = sv[i]
                dhas[g] = True


@_jit
def merge_max(out_gid, sv, shas, dv, dhas):
    for i in range(out_gid.shape[0]):
        if shas[i]:
            g = out_gid[i]
            if not dhas[g] or _greater(sv[i], dv[g]):
                dv[g] = sv[i]
                dhas[g] = True


@_jit
def first_update(gids, values, valid, seq_base, skip_nulls, v, seq, null):
    """Keep the value of the earliest row (row number ``seq_base + i``)."""
    has_mask = valid.shape[0] > 0
    for i in range(gids.shape[0]):
        is_null = has_mask and not valid[i]
        if skip_nulls and is_null:
            continue
        g = gids[i]
        if seq[g] < 0:
            seq[g] = seq_base + i
            null[g] = is_null
            if not is_null:
                v[g] = values[i]


@_jit
def last_update(gids, values, valid, seq_base, skip_nulls, v, seq, null):
    """Keep the value of the latest row (rows arrive in increasing row number)."""
    has_mask = valid.shape[0] > 0
    for i in range(gids.shape[0]):
        is_null = has_mask and not valid[i]
        if skip_nulls and is_null:
            continue
        g = gids[i]
        seq[g] = seq_base + i
        null[g] = is_null
        if not is_null:
            v[g] = values[i]


@_jit
def merge_first(out_gid, sv, sseq, snull, dv, dseq, dnull):
    for i in range(out_gid.shape[0]):
        s = sseq[i]
        if s < 0:
            continue
        g = out_gid[i]
        if dseq[g] < 0 or s < dseq[g]:
            dseq[g] = s
            dnull[g] = snull[i]
            dv[g] = sv[i]


@_jit
def merge_last(out_gid, sv, sseq, snull, dv, dseq, dnull):
    for i in range(out_gid.shape[0]):
        s = sseq[i]
        g = out_gid[i]
        if s > dseq[g]:
            dseq[g] = s
            dnull[g] = snull[i]
            dv[g] = sv[i]


@_jit
def var_update(gids, values, valid, n, mean, m2):
    """Welford's online update of count, mean and sum of squared deviations."""
    has_mask = valid.shape[0] > 0
    for i in range(gids.shape[0]):
        if has_mask and not valid[i]:
            continue
        g = gids[i]
        x = np.float64(values[i])
        c = n[g] + 1
        n[g] = c
        d = x - mean[g]
        mean[g] += d / c
        m2[g] += d * (x - mean[g])


@_jit
def merge_var(out_gid, sn, smean, sm2, dn, dmean, dm2):
    """Chan et al.'s pairwise combination of (count, mean, M2) states."""
    for i in range(out_gid.shape[0]):
        b = sn[i]
        if b == 0:
            continue
        g = out_gid[i]
        a = dn[g]
        if a == 0:
            dn[g] = b
            dmean[g] = smean[i]
            dm2[g] = sm2[i]
            continue
        c = a + b
        d = smean[i] - dmean[g]
        dmean[g] += d * b / c
        dm2[g] += sm2[i] + d * d * (np.float64(a) * b / c)
        dn[g] = c


# -- decimals of more than 18 digits: (n, 2) int64 words in, 192-bit sums ---------------------


@_jit
def sum_dec128(gids, values, valid, lo, mid, hi, has):
    """decimal128 values (``values[i, 0]`` low word, ``values[i, 1]`` signed high word) into
    192-bit sums (``lo``, ``mid`` unsigned, ``hi`` signed): exact for any number of rows."""
    has_mask = valid.shape[0] > 0
    for i in range(gids.shape[0]):
        if has_mask and not valid[i]:
            continue
        g = gids[i]
        vlo = np.uint64(values[i, 0])
        vhi = values[i, 1]
        old = lo[g]
        new = old + vlo
        lo[g] = new
        m_old = mid[g]
        t = m_old + np.uint64(vhi)
        t2 = t + np.uint64(new < old)
        mid[g] = t2
        hi[g] += (np.int64(-1) if vhi < 0 else np.int64(0)) + np.int64(t < m_old) + np.int64(t2 < t)
        has[g] = True


@_jit
def merge_sum192(out_gid, slo, smid, shi, dlo, dmid, dhi):
    for i in range(out_gid.shape[0]):
        g = out_gid[i]
        old = dlo[g]
        new = old + slo[i]
        dlo[g] = new
        m_old = dmid[g]
        t = m_old + smid[i]
        t2 = t + np.uint64(new < old)
        dmid[g] = t2
        dhi[g] += shi[i] + np.int64(t < m_old) + np.int64(t2 < t)


@_jit
def _less128(xhi, xlo, yhi, ylo):
    return xhi < yhi or (xhi == yhi and xlo < ylo)


@_jit
def minmax_dec128(gids, values, valid, is_max, vlo, vhi, has):
    """min (or max) of decimal128 words: ``vlo`` low word (as int64 bits), ``vhi`` high."""
    has_mask = valid.shape[0] > 0
    for i in range(gids.shape[0]):
        if has_mask and not valid[i]:
            continue
        g = gids[i]
        xhi = values[i, 1]
        xlo = np.uint64(values[i, 0])
        if not has[g]:
            better = True
        elif is_max:
            better = _less128(vhi[g], np.uint64(vlo[g]), xhi, xlo)
        else:
            better = _less128(xhi, xlo, vhi[g], np.uint64(vlo[g]))
        if better:
            vlo[g] = values[i, 0]
            vhi[g] = xhi
            has[g] = True


@_jit
def merge_minmax_dec128(out_gid, is_max, slo, shi, shas, dlo, dhi, dhas):
    for i in range(out_gid.shape[0]):
        if not shas[i]:
            continue
        g = out_gid[i]
        if not dhas[g]:
            better = True
        elif is_max:
            better = _less128(dhi[g], np.uint64(dlo[g]), shi[i], np.uint64(slo[i]))
        else:
            better = _less128(shi[i], np.uint64(slo[i]), dhi[g], np.uint64(dlo[g]))
        if better:
            dlo[g] = slo[i]
            dhi[g] = shi[i]
            dhas[g] = True


@_jit
def seq_dec128(gids, values, valid, seq_base, skip_nulls, is_last, vlo, vhi, seq, null):
    """first (or last) of decimal128 words, keeping the row number as ``first_update``."""
    has_mask = valid.shape[0] > 0
    for i in range(gids.shape[0]):
        is_null = has_mask and not valid[i]
        if skip_nulls and is_null:
            continue
        g = gids[i]
        if is_last or seq[g] < 0:
            seq[g] = seq_base + i
            null[g] = is_null
            if not is_null:
                vlo[g] = values[i, 0]
                vhi[g] = values[i, 1]


@_jit
def merge_seq_dec128(out_gid, is_last, slo, shi, sseq, snull, dlo, dhi, dseq, dnull):
    for i in range(out_gid.shape[0]):
        s = sseq[i]
        if s < 0:
            continue
        g = out_gid[i]
        if (is_last and s > dseq[g]) or (not is_last and (dseq[g] < 0 or s < dseq[g])):
            dseq[g] = s
            dnull[g] = snull[i]
            dlo[g] = slo[i]
            dhi[g] = shi[i]


# -- variable-length states: min/max/first/last of strings and binaries -------------------------
#
# A group's value lives in a byte arena: ``ref[g]`` is its offset, ``ln[g]`` its length (-1: no
# value). An update writes a new value over the old one when it is not longer, else appends it
# at ``used`` (the arena's fill) and returns the new fill; the caller reserved room for every
# byte of the chunk's values. Bytes compare lexicographically, unsigned (Spark's binary order,
# which is the code-point order of UTF-8 strings).


@_jit
def _bytes_less(a, a0, an, b, b0, bn):
    m = min(an, bn)
    for j in range(m):
        x = a[a0 + j]
        y = b[b0 + j]
        if x != y:
            return x < y
    return an < bn


@_jit
def _put_var(arena, used, ref, ln, g, data, start, n):
    """Store ``data[start:start+n]`` as group ``g``'s value; returns the arena's new fill."""
    at = ref[g]
    if ln[g] < n:
        at = used
        used += n
    copy_bytes(arena, at, data, start, n)
    ref[g] = at
    ln[g] = n
    return used


@_jit
def minmax_var_update(gids, offsets, data, valid, is_max, arena, used, ref, ln, has):
    check = valid.shape[0] > 0
    for i in range(gids.shape[0]):
        if check and not valid[i]:
            continue
        g = gids[i]
        s = offsets[i]
        n = offsets[i + 1] - s
        if has[g]:
            if is_max:
                better = _bytes_less(arena, ref[g], ln[g], data, s, n)
            else:
                better = _bytes_less(data, s, n, arena, ref[g], ln[g])
            if not better:
                continue
        used = _put_var(arena, used, ref, ln, g, data, s, n)
        has[g] = True
    return used


@_jit
def seq_var_update(
    gids, offsets, data, valid, seq_base, skip_nulls, last, arena, used, ref, ln, seq, null
):
    """first/last: rows in order (first) or backwards (last), so each group is set at most
    once per call and the appended bytes stay within the chunk's."""
    check = valid.shape[0] > 0
    m = gids.shape[0]
    for k in range(m):
        i = m - 1 - k if last else k
        is_null = check and not valid[i]
        if skip_nulls and is_null:
            continue
        g = gids[i]
        row = seq_base + i
        if last:
            if seq[g] >= row:
                continue
        elif seq[g] >= 0:
            continue
        seq[g] = row
        null[g] = is_null
        if is_null:
            ln[g] = 0 if ln[g] > 0 else ln[g]
        else:
            s = offsets[i]
            used = _put_var(arena, used, ref, ln, g, data, s, offsets[i + 1] - s)
    return used


@_jit
def gather_arena(arena, ref, ln, groups):
    """The values of ``groups`` (group ids) as ``(offsets from 0, bytes)``; none is empty."""
    m = groups.shape[0]
    out_off = np.empty(m + 1, dtype=np.int64)
    out_off[0] = 0
    total = 0
    for i in range(m):
        n = ln[groups[i]]
        if n > 0:
            total += n
        out_off[i + 1] = total
    out = np.empty(total, dtype=np.uint8)
    for i in range(m):
        g = groups[i]
        d = out_off[i]
        copy_bytes(out, d, arena, ref[g], out_off[i + 1] - d)
    return out_off, out


@_jit
def merge_minmax_var(out_gid, is_max, soff, sdata, shas, win):
    """``win[g]``: the partial row holding output group ``g``'s min (max), -1 if none."""
    for i in range(out_gid.shape[0]):
        if not shas[i]:
            continue
        g = out_gid[i]
        w = win[g]
        if w >= 0:
            a0 = soff[i]
            an = soff[i + 1] - a0
            b0 = soff[w]
            bn = soff[w + 1] - b0
            if is_max:
                better = _bytes_less(sdata, b0, bn, sdata, a0, an)
            else:
                better = _bytes_less(sdata, a0, an, sdata, b0, bn)
            if not better:
                continue
        win[g] = i


@_jit
def merge_seq_var(out_gid, last, sseq, snull, win, dseq, dnull):
    """``win[g]``: the partial row with output group ``g``'s first (last) row, -1 if none."""
    for i in range(out_gid.shape[0]):
        g = out_gid[i]
        s = sseq[i]
        if s < 0:
            continue
        if last:
            take = s > dseq[g]
        else:
            take = dseq[g] < 0 or s < dseq[g]
        if take:
            dseq[g] = s
            dnull[g] = snull[i]
            win[g] = i


@_jit
def gather_var_rows(offsets, data, rows):
    """The values of ``rows`` (-1: an empty value) as ``(offsets from 0, bytes)``."""
    m = rows.shape[0]
    out_off = np.empty(m + 1, dtype=np.int64)
    out_off[0] = 0
    total = 0
    for i in range(m):
        r = rows[i]
        if r >= 0:
            total += offsets[r + 1] - offsets[r]
        out_off[i + 1] = total
    out = np.empty(total, dtype=np.uint8)
    for i in range(m):
        r = rows[i]
        if r < 0:
            continue
        d = out_off[i]
        copy_bytes(out, d, data, offsets[r], out_off[i + 1] - d)
    return out_off, out


# -- several aggregates in one pass over interleaved state rows ---------------------------------

#: operation codes of :func:`fused_update` (one row of ``ops``: code, column, a, b, flag),
#: ``a``/``b``/``flag`` byte offsets of state fields in a group's row
FUSED_COUNT = 0  # int64 at a += 1 (count(*), count and mean's count of a column without nulls)
FUSED_SUM_FLOAT = 1  # Neumaier sum of a float column: float64 at a (sum), at b (compensation)
FUSED_SUM_INT = 2  # 128-bit sum of an int64 column: uint64 at a (low word), int64 at b (high)
FUSED_MIN_FLOAT = 3  # float64 at a
FUSED_MAX_FLOAT = 4
FUSED_MIN_INT = 5  # int64 at a
FUSED_MAX_INT = 6
#: rows ahead whose state row :func:`fused_update` prefetches
FUSED_PREFETCH_ROWS = 16


@_jit
def fused_update(gids, fcols, icols, ops, rows, width):
    """Fold rows into several aggregates at once, their states fields of one row per group.

    ``rows`` are the state rows' bytes (row ``g`` at ``g * width``; fields packed, so
    possibly unaligned). ``ops[o] = (code, column, a, b, flag)``: the operation (``FUSED_*``),
    its value column (an index into ``fcols`` for float codes, into ``icols`` for int codes;
    the columns have no nulls), the byte offsets in the row of the states it updates and of its
    ``has`` flag (set to 1; -1: none). Each operation does exactly what its one-aggregate
    kernel does (``count_rows``, ``sum_float``, ``sum_int``, ``min_update``, ``max_update``),
    but a group's row is fetched once for all of them, and prefetched
    :data:`FUSED_PREFETCH_ROWS` rows ahead.
    """
    n = gids.shape[0]
    m = ops.shape[0]
    last = width - 1
    for i in range(n):
        if i + FUSED_PREFETCH_ROWS < n:
            ahead = gids[i + FUSED_PREFETCH_ROWS] * width
            prefetch(rows, ahead)
            if ahead // 64 != (ahead + last) // 64:
                prefetch(rows, ahead + last)  # the row's end is on the next cache line
        base = gids[i] * width
        for o in range(m):
            code = ops[o, 0]
            a = base + ops[o, 2]
            if code == FUSED_COUNT:
                store_i64(rows, a, load_i64(rows, a) + 1)
                continue
            col = ops[o, 1]
            if code == FUSED_SUM_FLOAT:
                b = base + ops[o, 3]
                x = fcols[col][i]
                sv = load_f64(rows, a)
                t = sv + x
                if abs(sv) >= abs(x):
                    store_f64(rows, b, load_f64(rows, b) + ((sv - t) + x))
                else:
                    store_f64(rows, b, load_f64(rows, b) + ((x - t) + sv))
                store_f64(rows, a, t)
            elif code == FUSED_SUM_INT:
                b = base + ops[o, 3]
                v = icols[col][i]
                old = load_u64(rows, a)
                new = old + np.uint64(v)
                store_u64(rows, a, new)
                carry = (np.int64(-1) if v < 0 else np.int64(0)) + np.int64(new < old)
                store_i64(rows, b, load_i64(rows, b) + carry)
            else:
                flag = base + ops[o, 4]
                fresh = rows[flag] == 0
                if code == FUSED_MIN_FLOAT:
                    x = fcols[col][i]
                    if fresh or _less(x, load_f64(rows, a)):
                        store_f64(rows, a, x)
                elif code == FUSED_MAX_FLOAT:
                    x = fcols[col][i]
                    if fresh or _greater(x, load_f64(rows, a)):
                        store_f64(rows, a, x)
                elif code == FUSED_MIN_INT:
                    v = icols[col][i]
                    if fresh or v < load_i64(rows, a):
                        store_i64(rows, a, v)
                elif code == FUSED_MAX_INT:
                    v = icols[col][i]
                    if fresh or v > load_i64(rows, a):
                        store_i64(rows, a, v)
            if ops[o, 4] >= 0:
                rows[base + ops[o, 4]] = 1


#: :func:`fused_update_few` folds batches whose group ids are all below this
FEW_GROUPS = 64


@_jit
def fused_update_few(gids, groups, fcols, icols, ops, rows, width):
    """:func:`fused_update` of integer operations only (``FUSED_COUNT``, ``FUSED_SUM_INT``,
    ``FUSED_MIN_INT``, ``FUSED_MAX_INT``) when every group id is below ``groups`` (a few, as
    TPC-H Q1's four): each operation folds its column into per-group partials in a tight loop
    (the partials stay in registers and L1, no dispatch per row), then adds them to the state
    rows once per group. Integer sums (128-bit), counts, minima and maxima do not depend on
    the order they are folded in: the state bytes are those :func:`fused_update` leaves.
    ``fcols`` is unused (the signature is ``fused_update``'s)."""
    n = gids.shape[0]
    m = ops.shape[0]
    seen = np.zeros(groups, dtype=np.int64)
    for i in range(n):
        seen[gids[i]] += 1
    lo = np.zeros(groups, dtype=np.uint64)
    hi = np.zeros(groups, dtype=np.int64)
    best = np.zeros(groups, dtype=np.int64)
    for o in range(m):
        code = ops[o, 0]
        a_at = ops[o, 2]
        if code == FUSED_COUNT:
            for g in range(groups):
                if seen[g]:
                    a = g * width + a_at
                    store_i64(rows, a, load_i64(rows, a) + seen[g])
        elif code == FUSED_SUM_INT:
            col = icols[ops[o, 1]]
            lo[:] = 0
            hi[:] = 0
            for i in range(n):
                g = gids[i]
                v = col[i]
                old = lo[g]
                new = old + np.uint64(v)
                lo[g] = new
                hi[g] += (np.int64(-1) if v < 0 else np.int64(0)) + np.int64(new < old)
            b_at = ops[o, 3]
            for g in range(groups):
                if seen[g]:
                    a = g * width + a_at
                    b = g * width + b_at
                    old = load_u64(rows, a)
                    new = old + lo[g]
                    store_u64(rows, a, new)
                    store_i64(rows, b, load_i64(rows, b) + hi[g] + np.int64(new < old))
        else:  # FUSED_MIN_INT, FUSED_MAX_INT: columns without nulls, every seen group has one
            col = icols[ops[o, 1]]
            is_min = code == FUSED_MIN_INT
            first = np.zeros(groups, dtype=np.bool_)
            for i in range(n):
                g = gids[i]
                v = col[i]
                if not first[g]:
                    best[g] = v
                    first[g] = True
                elif v < best[g] if is_min else v > best[g]:
                    best[g] = v
            flag_at = ops[o, 4]
            for g in range(groups):
                if seen[g]:
                    a = g * width + a_at
                    cur = load_i64(rows, a)
                    fresh = rows[g * width + flag_at] == 0
                    if fresh or (best[g] < cur if is_min else best[g] > cur):
                        store_i64(rows, a, best[g])
        if ops[o, 4] >= 0:
            for g in range(groups):
                if seen[g]:
                    rows[g * width + ops[o, 4]] = 1
