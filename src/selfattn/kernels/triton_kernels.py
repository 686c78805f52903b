"""FlashAttention-2 in Triton: the torch kernel's tiles and steps, one program per block.

The same algorithm as ``flash_tiles`` (forward) and ``flash_backward``, written for a GPU:
where the torch kernel loops over row blocks and runs batched torch calls on a whole tile of
every head, here one Triton program holds one row block (or key block) of one head and
the tile lives in registers. The names are the torch kernel's:

    forward, program (row block i, batch x head):   for each key block j the mask lets through:
        S = scale Q_i K_j^T (softcap, ALiBi, mask)          tile_scores
        m' = max(m, rowmax S)   r = exp(m - m')   P = exp(S - m')
        l = r l + rowsum P      acc = r acc + P V_j             the online softmax
    O_i = acc / l,   lse_i = m + log l

    backward, D_i = rowsum(dO_i * O_i) (on the host), P = exp(S - lse_i) recomputed:
        dV_j += P^T dO_i    dP = dO_i V_j^T    dS = P * (dP - D_i)
        dK_j += scale dS^T Q_i          (program per key block j: dkdv_kernel)
        dQ_i += scale dS K_j            (program per row block i: dq_kernel)

The two backward kernels each recompute the tiles they visit (FlashAttention-2's loop over
key blocks for dK and dV, and a second loop over row blocks for dQ): dQ, dK and dV need no
atomic adds and do not depend on the order programs run in (a float mask's gradient is added
atomically, where the mask is shared by heads or rows).

Which tiles a program visits comes from the mask's block states, computed on the host
(``triton_flash``): per row block, the key blocks that are not EMPTY (``kv_index``,
``kv_count``), and per key block the row blocks (``q_index``, ``q_count``). A skipped tile
is never loaded. ``slot`` says per visited tile whether it is FULL (-1: no mask) or
PARTIAL (>= 0), and for a table mask where its bits are.

Mask kinds (``MASK``): NONE; BAND, a causal or sliding-window rule evaluated from the
indices (i + diag - left <= j <= i + diag + right); DOCS, packed documents (the document of
every query and key compared), with a band or not; TABLE, the bits of every PARTIAL tile
gathered on the host from any other structured mask; BIAS, a float mask added tile by tile.
Every kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``) on CPU tensors,
which is how the test suite checks it without a GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

NONE, BAND, TABLE, BIAS, DOCS = 0, 1, 2, 3, 4  # MASK: how a PARTIAL tile's hidden pairs are found


@triton.jit
def tanh(x):
    """tanh from exp alone (the interpreter has no libdevice). Near 0, 1 - 2 / (exp(2x) + 1)
    would lose the digits of a small result, so there the odd series to x^15 (error < 1e-7)."""
    a = tl.abs(x)
    far = 1.0 - 2.0 / (tl.exp(2.0 * a) + 1.0)
    x2 = x * x
    near = x * (1.0 + x2 * (-1.0 / 3 + x2 * (2.0 / 15 + x2 * (-17.0 / 315 + x2 * (62.0 / 2835 + x2 * (
        -1382.0 / 155925 + x2 * (21844.0 / 6081075 + x2 * (-929569.0 / 638512875))))))))
    return tl.where(a < 0.5, near, tl.where(x < 0, -far, far))


@triton.jit
def tile_scores(q, k, rows, cols, slot, zh, q_len, kv_len, scale, softcap,
                MaskLead, Table, table_leads, band_diag, band_left, band_right, Bias, BiasOff, bias_sr, bias_sc,
                Slopes, QPos, KPos, QDoc, KDoc,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, SOFTCAP: tl.constexpr,
                ALIBI: tl.constexpr, PRECISION: tl.constexpr):
    """S for one tile, -inf where hidden, and t = tanh(scale Q K^T / c) for the softcap's backward.   -> (BLOCK_M, BLOCK_N) x 2

    The order is the torch kernel's: the product, the softcap, ALiBi, then the mask."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # S = scale Q_i K_j^T
    t = s
    if SOFTCAP:  # S = c tanh(S / c)
        t = tanh(s / softcap)
        s = softcap * t
    row_in = rows < q_len
    col_in = cols < kv_len
    if ALIBI:  # S -= slope_i |pos_i - pos_j|, a slope per (batch, head) and row
        slope = tl.load(Slopes + zh * q_len + rows, mask=row_in, other=0.0)
        q_pos = tl.load(QPos + rows, mask=row_in, other=0)
        k_pos = tl.load(KPos + cols, mask=col_in, other=0)
        s = s - slope[:, None] * tl.abs(q_pos[:, None] - k_pos[None, :]).to(tl.float32)
    visible = row_in[:, None] & col_in[None, :]  # rows and keys past the ends are hidden
    if slot >= 0:  # a PARTIAL tile: its mask
        if MASK == 1:  # BAND: i + diag - left <= j <= i + diag + right
            offset = cols[None, :] - rows[:, None] - band_diag
            visible = visible & (offset >= -band_left) & (offset <= band_right)
        if MASK == 2:  # TABLE: the tile's bits, for this (batch, head)'s mask
            lead = tl.load(MaskLead + zh)
            local = (rows % BLOCK_M)[:, None] * BLOCK_N + (cols % BLOCK_N)[None, :]
            bits = tl.load(Table + (slot.to(tl.int64) * table_leads + lead) * (BLOCK_M * BLOCK_N) + local)
            visible = visible & (bits != 0)
        if MASK == 4:  # DOCS: the same document (packed sequences), and inside the band if one is given
            same = tl.load(QDoc + rows, mask=row_in, other=-1)[:, None] == tl.load(KDoc + cols, mask=col_in, other=-2)[None, :]
            offset = cols[None, :] - rows[:, None] - band_diag
            visible = visible & same & (offset >= -band_left) & (offset <= band_right)
        if MASK == 3:  # BIAS: S += the float mask's tile (-inf hides)
            where = tl.load(BiasOff + zh) + rows[:, None].to(tl.int64) * bias_sr + cols[None, :].to(tl.int64) * bias_sc
            s = s + tl.load(Bias + where, mask=row_in[:, None] & col_in[None, :], other=0.0).to(tl.float32)
    s = tl.where(visible, s, float("-inf"))
    return s, t


@triton.jit
def load_tile(ptr, rows, cols, stride_r, stride_c, n_rows, n_cols):
    """ptr[rows, cols]: a (len(rows), len(cols)) tile, 0 past n_rows and n_cols."""
    return tl.load(ptr + rows[:, None] * stride_r + cols[None, :] * stride_c,
                   mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)


@triton.jit
def store_tile(ptr, rows, cols, stride_r, n_rows, n_cols, value):
    """ptr[rows, cols] = value, in the pointer's dtype, within n_rows and n_cols (a row's columns contiguous)."""
    tl.store(ptr + rows[:, None] * stride_r + cols[None, :], value.to(ptr.dtype.element_ty),
             mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))


@triton.jit
def row_stats(LSE, DELTA, zh, rows, q_len):
    """lse_i and D_i of a row block, lse_i = +inf for a row that saw nothing (its P = exp(S - lse) is then 0)."""
    at = zh.to(tl.int64) * q_len + rows
    lse = tl.load(LSE + at, mask=rows < q_len, other=0.0)
    return tl.where(lse == float("-inf"), float("inf"), lse), tl.load(DELTA + at, mask=rows < q_len, other=0.0)


@triton.jit
def tile_ds(s, lse_i, do_i, v_j, delta_i, PRECISION: tl.constexpr):
    """The backward's tile: P = exp(S - lse_i), and dS = P * (dP - D_i) with dP = dO_i V_j^T.   -> P, dS"""
    p = tl.exp(s - lse_i[:, None])
    dp = tl.dot(do_i, tl.trans(v_j), input_precision=PRECISION)
    return p, p * (dp - delta_i[:, None])


@triton.jit
def forward_kernel(
    Q, K, V, O, LSE, QOff, KOff, VOff, OOff,  # tensors; *Off: where each (batch, head) starts, in elements
    sq_n, sq_d, sk_n, sk_d, sv_n, sv_d, so_n,  # strides of a row and of a column
    KVCount, KVIndex, KVSlot, Visits,  # per row block: how many key blocks, which, their slots; tiles seen (COUNT)
    MaskLead, Table, table_leads, band_diag, band_left, band_right, Bias, BiasOff, bias_sr, bias_sc,
    Slopes, QPos, KPos, QDoc, KDoc,
    q_len, kv_len, heads, kv_heads, group, n_cols, d, d_v, scale, softcap,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    MASK: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, PRECISION: tl.constexpr, COUNT: tl.constexpr,
):
    """One row block i of one (batch, head): O_i and lse_i by the online softmax over its key blocks."""
    i = tl.program_id(0)
    zh = tl.program_id(1)  # batch x query head
    zh_kv = (zh // heads) * kv_heads + (zh % heads) // group  # its key/value head: GQA without copying K and V
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    dims, dims_v = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    q_i = load_tile(Q + tl.load(QOff + zh), rows, dims, sq_n, sq_d, q_len, d)  # (BLOCK_M, BLOCK_D)
    k_ptr, v_ptr = K + tl.load(KOff + zh_kv), V + tl.load(VOff + zh_kv)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # the largest score so far
    l = tl.zeros([BLOCK_M], tl.float32)  # sum_j exp(s_j - m)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)  # sum_j exp(s_j - m) v_j
    for n in range(0, tl.load(KVCount + i)):  # only the key blocks the mask lets through
        j = tl.load(KVIndex + i * n_cols + n)
        slot = tl.load(KVSlot + i * n_cols + n)
        if COUNT:
            tl.store(Visits + i * n_cols + j, 1)
        cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
        k_j = load_tile(k_ptr, cols, dims, sk_n, sk_d, kv_len, d)  # (BLOCK_N, BLOCK_D)
        v_j = load_tile(v_ptr, cols, dims_v, sv_n, sv_d, kv_len, d_v)  # (BLOCK_N, BLOCK_DV)
        s, _ = tile_scores(q_i, k_j, rows, cols, slot, zh, q_len, kv_len, scale, softcap,
                           MaskLead, Table, table_leads, band_diag, band_left, band_right, Bias, BiasOff, bias_sr,
                           bias_sc, Slopes, QPos, KPos, QDoc, KDoc, BLOCK_M, BLOCK_N, MASK, SOFTCAP, ALIBI, PRECISION)
        m_new = tl.maximum(m, tl.max(s, 1))  # m' = max(m, max S)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet: shift by 0, no NaN
        r = tl.exp(m - shift)  # r = exp(m - m'): rescales the earlier terms
        p = tl.exp(s - shift[:, None])  # exp(S - m')
        l = r * l + tl.sum(p, 1)  # l' = r l + rowsum exp(S - m')
        acc = acc * r[:, None] + tl.dot(p.to(v_j.dtype), v_j, input_precision=PRECISION)  # acc' = r acc + exp(S - m') V_j
        m = m_new
    seen = l > 0
    out = tl.where(seen[:, None], acc / tl.where(seen, l, 1.0)[:, None], 0.0)  # O_i = acc / l; 0 for a row that saw nothing
    lse = tl.where(seen, m + tl.log(tl.where(seen, l, 1.0)), float("-inf"))  # lse_i = m + log l
    store_tile(O + tl.load(OOff + zh), rows, dims_v, so_n, q_len, d_v, out)
    tl.store(LSE + zh.to(tl.int64) * q_len + rows, lse, mask=rows < q_len)


@triton.jit
def dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, QOff, KOff, VOff, DOOff,
    sq_n, sq_d, sk_n, sk_d, sv_n, sv_d, sdo_n,
    QCount, QIndex, QSlot, Visits,  # per key block: how many row blocks see it, which, their slots
    MaskLead, Table, table_leads, band_diag, band_left, band_right, Bias, BiasOff, bias_sr, bias_sc,
    Slopes, QPos, KPos, QDoc, KDoc,
    q_len, kv_len, heads, kv_heads, group, n_rows, n_cols, d, d_v, scale, softcap,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    MASK: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, PRECISION: tl.constexpr, COUNT: tl.constexpr,
):
    """One key block j of one (batch, key/value head): dK_j and dV_j, summed over the row blocks
    that see it and over the G query heads that share it (GQA)."""
    j = tl.program_id(0)
    zh_kv = tl.program_id(1)  # batch x key/value head
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    dims, dims_v = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    k_j = load_tile(K + tl.load(KOff + zh_kv), cols, dims, sk_n, sk_d, kv_len, d)  # (BLOCK_N, BLOCK_D)
    v_j = load_tile(V + tl.load(VOff + zh_kv), cols, dims_v, sv_n, sv_d, kv_len, d_v)  # (BLOCK_N, BLOCK_DV)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    for g in range(0, group):  # the query heads of this key/value head
        zh = (zh_kv // kv_heads) * heads + (zh_kv % kv_heads) * group + g
        q_ptr, do_ptr = Q + tl.load(QOff + zh), DO + tl.load(DOOff + zh)
        for n in range(0, tl.load(QCount + j)):  # only the row blocks that see this key block
            i = tl.load(QIndex + j * n_rows + n)
            slot = tl.load(QSlot + j * n_rows + n)
            if COUNT:
                tl.store(Visits + i * n_cols + j, 1)
            rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
            q_i = load_tile(q_ptr, rows, dims, sq_n, sq_d, q_len, d)  # (BLOCK_M, BLOCK_D)
            do_i = load_tile(do_ptr, rows, dims_v, sdo_n, 1, q_len, d_v)  # (BLOCK_M, BLOCK_DV)
            lse_i, delta_i = row_stats(LSE, DELTA, zh, rows, q_len)
            s, t = tile_scores(q_i, k_j, rows, cols, slot, zh, q_len, kv_len, scale, softcap,
                               MaskLead, Table, table_leads, band_diag, band_left, band_right, Bias, BiasOff, bias_sr,
                               bias_sc, Slopes, QPos, KPos, QDoc, KDoc, BLOCK_M, BLOCK_N, MASK, SOFTCAP, ALIBI, PRECISION)
            p, ds = tile_ds(s, lse_i, do_i, v_j, delta_i, PRECISION)  # P = exp(S - lse), dS = P * (dP - D_i)
            dv += tl.dot(tl.trans(p.to(do_i.dtype)), do_i, input_precision=PRECISION)  # dV_j += P^T dO_i
            if SOFTCAP:  # through c tanh(x / c): dS_raw = dS (1 - t^2)
                ds = ds * (1.0 - t * t)
            dk += tl.dot(tl.trans(ds.to(q_i.dtype)), q_i, input_precision=PRECISION)  # dK_j += dS^T Q_i (scale below)
    store_tile(DK + zh_kv.to(tl.int64) * kv_len * d, cols, dims, d, kv_len, d, dk * scale)
    store_tile(DV + zh_kv.to(tl.int64) * kv_len * d_v, cols, dims_v, d_v, kv_len, d_v, dv)


@triton.jit
def dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, DBias, DBiasOff, dbias_sr, dbias_sc, QOff, KOff, VOff, DOOff,
    sq_n, sq_d, sk_n, sk_d, sv_n, sv_d, sdo_n,
    KVCount, KVIndex, KVSlot, Visits,
    MaskLead, Table, table_leads, band_diag, band_left, band_right, Bias, BiasOff, bias_sr, bias_sc,
    Slopes, QPos, KPos, QDoc, KDoc,
    q_len, kv_len, heads, kv_heads, group, n_cols, d, d_v, scale, softcap,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    MASK: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, PRECISION: tl.constexpr, COUNT: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
):
    """One row block i of one (batch, head): dQ_i over its key blocks; with BIAS_GRAD also dS,
    the float mask's gradient, added into DBias at the mask's own shape (a mask broadcast over
    heads or rows sums the dS of all of them: atomic adds)."""
    i = tl.program_id(0)
    zh = tl.program_id(1)
    zh_kv = (zh // heads) * kv_heads + (zh % heads) // group
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)
    dims, dims_v = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    q_i = load_tile(Q + tl.load(QOff + zh), rows, dims, sq_n, sq_d, q_len, d)
    do_i = load_tile(DO + tl.load(DOOff + zh), rows, dims_v, sdo_n, 1, q_len, d_v)
    lse_i, delta_i = row_stats(LSE, DELTA, zh, rows, q_len)
    k_ptr, v_ptr = K + tl.load(KOff + zh_kv), V + tl.load(VOff + zh_kv)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n in range(0, tl.load(KVCount + i)):
        j = tl.load(KVIndex + i * n_cols + n)
        slot = tl.load(KVSlot + i * n_cols + n)
        if COUNT:
            tl.store(Visits + i * n_cols + j, 1)
        cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
        k_j = load_tile(k_ptr, cols, dims, sk_n, sk_d, kv_len, d)
        v_j = load_tile(v_ptr, cols, dims_v, sv_n, sv_d, kv_len, d_v)
        s, t = tile_scores(q_i, k_j, rows, cols, slot, zh, q_len, kv_len, scale, softcap,
                           MaskLead, Table, table_leads, band_diag, band_left, band_right, Bias, BiasOff, bias_sr,
                           bias_sc, Slopes, QPos, KPos, QDoc, KDoc, BLOCK_M, BLOCK_N, MASK, SOFTCAP, ALIBI, PRECISION)
        _, ds = tile_ds(s, lse_i, do_i, v_j, delta_i, PRECISION)  # dS = P * (dP - D_i)
        if BIAS_GRAD:  # the mask is added last: its gradient is dS itself, summed where the mask broadcasts
            where = tl.load(DBiasOff + zh) + rows[:, None].to(tl.int64) * dbias_sr + cols[None, :].to(tl.int64) * dbias_sc
            tl.atomic_add(DBias + where, ds, mask=(rows[:, None] < q_len) & (cols[None, :] < kv_len))
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq += tl.dot(ds.to(k_j.dtype), k_j, input_precision=PRECISION)  # dQ_i += dS K_j (scale below)
    store_tile(DQ + zh.to(tl.int64) * q_len * d, rows, dims, d, q_len, d, dq * scale)


# Whether the decorators above made the kernels for Triton's interpreter (TRITON_INTERPRET=1 when
# triton was first imported): they then run on CPU tensors, and only on those.
INTERPRETED = type(forward_kernel).__name__ == "InterpretedFunction"
