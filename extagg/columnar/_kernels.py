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

from extagg._numba import jit

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
