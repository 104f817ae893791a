"""The pieces NSA routing's kernels share (the math is in this folder's README.md, the kernels in
route_split_kernels.py, the launches in route.py).

Rows of a program are (query, head) pairs: CR queries of the step times the GQA group's heads
(padded to GP), so each compressed key tile is loaded once for all of them and a query's
probabilities are summed over its heads by a reshape. Lengths are read from device memory (a captured graph
replays at any context length); grids are sized for the cache's capacity and idle programs exit.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _cmp_tile(kc, kd, i_h, i0, o_i, m_i, o_d, s_kb, BC: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    # compressed blocks [i0, i0 + BC) of KV head i_h: [BC, D]. TMA: one bulk copy through the
    # descriptor over the cache's capacity (no per-element addresses; rows past it come back zero,
    # rows in [i_hi, capacity) are stale and the callers mask their scores); else masked loads
    # from kc, the head's base
    if TMA:
        b_k = kd.load([i_h, i0, 0]).reshape(BC, D)
    else:
        b_k = tl.load(kc + o_i.to(tl.int64)[:, None] * s_kb + o_d[None, :], mask=m_i[:, None], other=0.0)
    return b_k


@triton.jit
def _cmp_scores(b_q, kc, kd, i_h, i0, o_i, m_i, o_d, s_kb, BC: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    b_k = _cmp_tile(kc, kd, i_h, i0, o_i, m_i, o_d, s_kb, BC, D, TMA)
    return tl.dot(b_q, tl.trans(b_k), input_precision="ieee")                    # [BM, BC]


@triton.jit
def _cmp_values(vc, vd, i_h, i0, o_i, m_i, o_d, s_kb, BC: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    # the tile's values, rows past the range zeroed (a stale row may hold anything; p is 0 there)
    return tl.where(m_i[:, None], _cmp_tile(vc, vd, i_h, i0, o_i, m_i, o_d, s_kb, BC, D, TMA), 0.0)


@triton.jit
def _path_scores(b_q, k, w, S0, o_qi, m_r, o_d, S, L, b_lo, b_hi, s_kt, s_wn, s_wb, BM: tl.constexpr,
                 SB: tl.constexpr, NBPP: tl.constexpr):
    # scores of each row's path-specific compressed keys without forming them: a block's key is the
    # mean of its slots' keys (w[n, b, s] = 1/l on them, else 0), so q.key = sum_s w[n, b, s] (q.k_s).
    # One [BM, SB] dot a tile of the step's slots [S0, S0 + S) replaces a launch and an fp32 buffer
    # a layer; the weight gates the product (never 0 * a stale slot's value). [BM, NBPP] raw scores
    # of the blocks [b_lo, b_hi) (0 elsewhere)
    o_b = tl.arange(0, NBPP)
    b_sp = tl.zeros([BM, NBPP], tl.float32)
    for j0 in range(0, S, SB):
        o_s = j0 + tl.arange(0, SB)
        m_s = (o_s < S) & (S0 + o_s < L)
        b_k = tl.load(k + (S0 + o_s).to(tl.int64)[:, None] * s_kt + o_d[None, :], mask=m_s[:, None], other=0.0)
        b_st = tl.dot(b_q, tl.trans(b_k), input_precision="ieee")                    # [BM, SB]
        for b in range(b_lo, b_hi):
            b_w = tl.load(w + o_qi[:, None] * s_wn + b * s_wb + o_s[None, :], mask=m_r[:, None] & m_s[None, :],
                          other=0.0)                                                    # [BM, SB]
            b_c = tl.sum(tl.where(b_w != 0.0, b_w * b_st, 0.0), 1)                       # [BM]
            b_sp += tl.where(o_b[None, :] == b, b_c[:, None], 0.0)
    return b_sp


@triton.jit
def _path_mask(npath, o_qi, m_r, b_lo, b_hi, NBPP: tl.constexpr):
    # of the blocks [b_lo, b_hi), those each row's query completes: [BM, NBPP]
    b_np = tl.load(npath + o_qi, mask=m_r, other=0)
    o_b = tl.arange(0, NBPP)
    return m_r[:, None] & (o_b[None, :] < b_np[:, None]) & ((o_b >= b_lo) & (o_b < b_hi))[None, :]


@triton.jit
def _load_q_rows(q, i_g, i_h, N, scale, s_qn, s_qh, G: tl.constexpr, CR: tl.constexpr, BM: tl.constexpr,
                 D: tl.constexpr, GP: tl.constexpr):
    # row r = (query r // GP, head r % GP): a [CR, GP] grid (heads padded to a power of two) whose
    # head axis a reshape sums; log2(e) and the scale folded into q: the softmax runs in base 2
    o_r = tl.arange(0, BM)
    o_c = o_r // GP
    o_qi = (i_g * CR + o_c).to(tl.int64)
    m_r = (o_r % GP < G) & (o_qi < N)
    o_hq = i_h * G + o_r % GP
    o_d = tl.arange(0, D)
    b_q = tl.load(q + o_qi[:, None] * s_qn + o_hq[:, None] * s_qh + o_d[None, :], mask=m_r[:, None], other=0.0)
    return (b_q * (scale * 1.4426950408889634)).to(b_q.dtype), o_r, o_qi, m_r, o_hq, o_d


@triton.jit
def _num_own(NBPRE, NBS, R: tl.constexpr):
    # selection blocks j < NBS whose own compression blocks [j*R, (j+1)*R) hold a committed one
    return tl.minimum(tl.cdiv(NBPRE, R), NBS)


@triton.jit
def _lse_range(b_q, kc, vc, kd, vd, i_h, i_lo, i_hi, o_d, s_kb, b_m, b_l, b_a, BC: tl.constexpr, D: tl.constexpr,
               WANT_O: tl.constexpr, TMA: tl.constexpr):
    # online softmax (base 2) over committed compression blocks [i_lo, i_hi)
    for i0 in range(i_lo, i_hi, BC):
        o_i = i0 + tl.arange(0, BC)
        m_i = o_i < i_hi
        b_s = _cmp_scores(b_q, kc, kd, i_h, i0, o_i, m_i, o_d, s_kb, BC, D, TMA)
        b_s = tl.where(m_i[None, :], b_s, float("-inf"))
        b_mn = tl.maximum(b_m, tl.max(b_s, 1))
        b_ms = tl.where(b_mn == float("-inf"), 0.0, b_mn)
        b_p = tl.exp2(b_s - b_ms[:, None])
        b_al = tl.exp2(b_m - b_ms)
        b_l = b_l * b_al + tl.sum(b_p, 1)
        if WANT_O:
            b_v = _cmp_values(vc, vd, i_h, i0, o_i, m_i, o_d, s_kb, BC, D, TMA)
            b_a = b_a * b_al[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision="ieee")
        b_m = b_mn
    return b_m, b_l, b_a


@triton.jit
def _lse_path(b_sp, m_b, v, w, S0, o_qi, m_r, o_d, S, L, b_lo, b_hi, s_kt, s_wn, s_wb, b_m, b_l, b_a,
              BM: tl.constexpr, SB: tl.constexpr, NBPP: tl.constexpr, WANT_O: tl.constexpr):
    # each query's own path-specific blocks (m_b: the complete ones) into the softmax state; their
    # values (gated NSA) as sum_s (sum_b p_b w[n, b, s]) v_s, a [BM, SB] x [SB, D] product a tile
    b_s = tl.where(m_b, b_sp, float("-inf"))
    b_mn = tl.maximum(b_m, tl.max(b_s, 1))
    b_ms = tl.where(b_mn == float("-inf"), 0.0, b_mn)
    b_p = tl.exp2(b_s - b_ms[:, None])                                                # [BM, NBPP]
    b_al = tl.exp2(b_m - b_ms)
    b_l = b_l * b_al + tl.sum(b_p, 1)
    if WANT_O:
        b_a = b_a * b_al[:, None]
        o_b = tl.arange(0, NBPP)
        for j0 in range(0, S, SB):
            o_s = j0 + tl.arange(0, SB)
            m_s = (o_s < S) & (S0 + o_s < L)
            b_pw = tl.zeros([BM, SB], tl.float32)
            for b in range(b_lo, b_hi):
                b_w = tl.load(w + o_qi[:, None] * s_wn + b * s_wb + o_s[None, :], mask=m_r[:, None] & m_s[None, :],
                              other=0.0)
                b_pb = tl.sum(tl.where(o_b[None, :] == b, b_p, 0.0), 1)
                b_pw += b_w * b_pb[:, None]
            b_v = tl.load(v + (S0 + o_s).to(tl.int64)[:, None] * s_kt + o_d[None, :], mask=m_s[:, None], other=0.0)
            b_v = tl.where(tl.max(b_pw, 0)[:, None] > 0, b_v.to(tl.float32), 0.0)    # [SB, D], unused slots 0
            b_a += tl.dot(b_pw, b_v, input_precision="ieee")
    return b_mn, b_l, b_a


@triton.jit
def _finish_softmax(b_m, b_l, b_a, lse, o_cmp, o_qi, o_hq, m_r, o_d, HQ, store, D: tl.constexpr,
                    WANT_O: tl.constexpr):
    # the final base-2 log-sum-exp (b_l summed relative to the max b_m); lse_cmp in natural log and,
    # for gated NSA, o_cmp stored when `store`; returns the exponent offset of the probabilities
    b_ms = tl.where(b_m == float("-inf"), 0.0, b_m)
    b_lse2 = tl.where(b_l > 0, b_ms + tl.log2(tl.where(b_l > 0, b_l, 1.0)), float("-inf"))
    if store:
        tl.store(lse + o_qi * HQ + o_hq, b_lse2 * 0.6931471805599453, mask=m_r)
        if WANT_O:
            b_o = b_a / tl.where(b_l > 0, b_l, 1.0)[:, None]
            tl.store(o_cmp + (o_qi * HQ + o_hq)[:, None] * D + o_d[None, :], b_o, mask=m_r[:, None])
    return tl.where(b_l > 0, b_lse2, 0.0)


@triton.jit
def _query_cols(i_g, N, CR: tl.constexpr):
    o_qc = (i_g * CR + tl.arange(0, CR)).to(tl.int64)
    return o_qc, o_qc < N


@triton.jit
def _load_qt_cols(q, i_g, i_h, N, scale, s_qn, s_qh, G: tl.constexpr, CR: tl.constexpr, D: tl.constexpr,
                  GP: tl.constexpr):
    # `_load_q_rows`' rows as the columns of a [D, BM] tile in (head, query) order, loaded so from
    # memory: the same tile permuted in registers failed Triton 3.6's sm_90 pipeline at BM = 16 in
    # 16-bit types (an illegal shared layout for the MMA operand: the AR step at 64K, session 37)
    o_c = tl.arange(0, CR * GP)
    o_qi = (i_g * CR + o_c % CR).to(tl.int64)
    m_c = (o_c // CR < G) & (o_qi < N)
    o_hq = i_h * G + o_c // CR
    o_d = tl.arange(0, D)
    b_qt = tl.load(q + o_qi[None, :] * s_qn + o_hq[None, :] * s_qh + o_d[:, None], mask=m_c[None, :], other=0.0)
    return (b_qt * (scale * 1.4426950408889634)).to(b_qt.dtype)


@triton.jit
def _imp_range(q, i_g, N, scale, s_qn, s_qh, b_lsafe, kc, kd, i_h, own, tail, o_qc, m_c, m_r, o_d, j_lo, j_hi,
               NBPRE, s_kb, s_in, G: tl.constexpr, R: tl.constexpr, A: tl.constexpr, BC: tl.constexpr,
               CR: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    # selection blocks [j_lo, j_hi) from the committed compression blocks, in tiles of BC // R whole
    # selection blocks: a query's probabilities summed over its heads, then over each block's own R
    # compression blocks ("own") and over its last A - 1 ("tail", which block j + 1 also overlaps):
    # imp[j] = own[j] + tail[j - 1], added by the top-n; no block written twice.
    # The scores are computed transposed, keys on the MMA's M side and the rows on N in (head, query)
    # order: a thread's accumulator columns 8 apart then hold one query's heads, so the head sum is
    # register adds, not shuffles (505 -> 271 SASS instructions a tile for sm_90 at Llama 64K / 64; the
    # imp launch 18.7 -> 13.8 us there on an H100, 31.4 -> 21.8 at 128K: bench/NOTES.md, session 36)
    JB: tl.constexpr = BC // R
    BM: tl.constexpr = CR * GP
    b_qt = _load_qt_cols(q, i_g, i_h, N, scale, s_qn, s_qh, G, CR, D, GP)               # [D, (GP, CR)]
    b_ls = tl.reshape(tl.trans(tl.reshape(b_lsafe, [CR, GP])), [BM])
    m_rt = tl.reshape(tl.trans(tl.reshape(m_r.to(tl.int32), [CR, GP])), [BM]) != 0
    o_u = tl.arange(0, R)
    for j0 in range(j_lo, j_hi, JB):
        o_i = j0 * R + tl.arange(0, BC)
        m_i = o_i < NBPRE
        b_k = _cmp_tile(kc, kd, i_h, j0 * R, o_i, m_i, o_d, s_kb, BC, D, TMA)
        b_s = tl.dot(b_k, b_qt, input_precision="ieee")                                 # [BC, BM]
        b_p = tl.where(m_i[:, None] & m_rt[None, :], tl.exp2(b_s - b_ls[None, :]), 0.0)
        b_ps = tl.reshape(tl.sum(tl.reshape(b_p, [BC, GP, CR]), 1), [JB, R, CR])         # [JB, R, CR]
        o_j = j0 + tl.arange(0, JB)
        p_o = o_qc[None, :] * s_in + o_j[:, None]                                        # [JB, CR]
        m_o = m_c[None, :] & (o_j < j_hi)[:, None]
        tl.store(own + p_o, tl.sum(b_ps, 1), mask=m_o)
        if A > 1:
            tl.store(tail + p_o, tl.sum(tl.where((o_u >= R - A + 1)[None, :, None], b_ps, 0.0), 1), mask=m_o)


@triton.jit
def _imp_path(b_sp, m_b, b_lsafe, pp, o_qc, m_c, i_h, b_lo, b_hi, s_un, s_uh, CR: tl.constexpr, GP: tl.constexpr,
              NBPP: tl.constexpr):
    # each query's path-specific blocks [b_lo, b_hi)' probabilities summed over its heads: pp [N, Hkv, NBP]
    b_p = tl.where(m_b, tl.exp2(b_sp - b_lsafe[:, None]), 0.0)                        # [BM, NBPP]
    b_ps = tl.sum(tl.reshape(b_p, [CR, GP, NBPP]), 1)                                   # [CR, NBPP]
    o_b = tl.arange(0, NBPP)
    tl.store(pp + o_qc[:, None] * s_un + i_h * s_uh + o_b[None, :], b_ps,
             mask=m_c[:, None] & ((o_b >= b_lo) & (o_b < b_hi))[None, :])


@triton.jit
def _order_bits(x):
    # fp32 -> int32 with the same order (negatives flipped)
    b = x.to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def _row_keys(own, tail, p_row, o_j, m_q, t, NJO, JW, NBS, LS: tl.constexpr, A: tl.constexpr,
              FORCED_FIRST: tl.constexpr, FORCED_LOCAL: tl.constexpr):
    # the rows' selection blocks o_j (a chunk of the row): importance (the committed own + tail sums,
    # the window's path sums already added in memory below JW), -inf past the candidates (stored
    # back: the op's importance output), +inf on the forced blocks
    m_j = o_j < NBS
    m_qj = m_q[:, None] & m_j[None, :]
    b_imp = tl.load(own + p_row + o_j[None, :], mask=m_qj & (o_j < JW)[None, :], other=0.0)      # [QC, BJ]
    if A > 1:
        m_t = m_qj & ((o_j >= 1) & (o_j <= NJO))[None, :]
        b_imp += tl.load(tail + p_row + o_j[None, :] - 1, mask=m_t, other=0.0)
    cand = (o_j[None, :] * LS <= t[:, None]) & m_j[None, :]
    b_imp = tl.where(cand, b_imp, float("-inf"))
    tl.store(own + p_row + o_j[None, :], b_imp, mask=m_qj)
    cur = t[:, None] // LS
    forced = (o_j[None, :] > cur - FORCED_LOCAL) & (o_j[None, :] <= cur)
    if FORCED_FIRST:
        forced = forced | (o_j[None, :] == 0)
    return tl.where(cand & forced, float("inf"), b_imp)


@triton.jit
def _count_ge(b_ord, b_ot, th, BT: tl.constexpr):
    # keys >= th per row, over the row's main tile and its tail (BT > 0)
    c = tl.sum((b_ord >= th[:, None]).to(tl.int32), 1)
    if BT > 0:
        c += tl.sum((b_ot >= th[:, None]).to(tl.int32), 1)
    return c


@triton.jit
def _topk_rows(own, tail, pp, npath, pos, idx, NBPRE, NBS, o_q, m_q, i_h, s_in, s_ih, s_un, s_uh, s_xn, s_xh,
               LS: tl.constexpr, R: tl.constexpr, A: tl.constexpr, BJ: tl.constexpr, NSEL: tl.constexpr,
               NSELP: tl.constexpr, SORTED: tl.constexpr, FORCED_FIRST: tl.constexpr,
               FORCED_LOCAL: tl.constexpr, NBPP: tl.constexpr, NW: tl.constexpr, BT: tl.constexpr = 0):
    # queries o_q [QC]: importance (committed blocks from own/tail, path-specific ones from pp; the
    # result written to `own`, the op's importance output), candidates, forced blocks, then top-n
    # with ties to the lower index, ascending, -1 padded. A row is a power-of-two tile of BJ blocks
    # and, when BT > 0 (bisection only), a tail tile of BT from BJ: a row of 1,025 blocks (Llama 64K
    # with its tree) takes 1,024 + 16 columns where one power of two would take 2,048
    o_j = tl.arange(0, BJ)
    NJO = _num_own(NBPRE, NBS, R)
    p_row = o_q[:, None] * s_in + i_h * s_ih
    t = tl.load(pos + o_q, mask=m_q, other=0)
    b_np = tl.load(npath + o_q, mask=m_q, other=0)
    # the path-specific blocks c = NBPRE + b (b < npath) fall in the NW selection blocks from
    # j0 = NBPRE // R (block j holds the starts [jR - A + 1, (j + 1)R)): their sums, in the order
    # of b, added to those blocks' own sums in memory before the row is read (a gather over the
    # row per compression start cost ~1/3 of this kernel's instructions)
    j0 = NBPRE // R
    o_w = j0 + tl.arange(0, NW)
    m_w = m_q[:, None] & (o_w < NBS)[None, :]
    p_w = own + p_row + o_w[None, :]
    b_win = tl.load(p_w, mask=m_w & (o_w < NJO)[None, :], other=0.0)                  # [QC, NW]
    p_pq = pp + o_q * s_un + i_h * s_uh
    for b in tl.static_range(NBPP):
        c = NBPRE + b
        p_b = tl.load(p_pq + b, mask=m_q & (b < b_np), other=0.0)                            # [QC]
        b_win += tl.where(((o_w >= c // R) & (o_w <= (c + A - 1) // R))[None, :], p_b[:, None], 0.0)
    tl.store(p_w, b_win, mask=m_w)
    tl.debug_barrier()   # the window's stores, read back by other threads
    JW = tl.maximum(NJO, j0 + NW)
    b_key = _row_keys(own, tail, p_row, o_j, m_q, t, NJO, JW, NBS, LS, A, FORCED_FIRST, FORCED_LOCAL)
    p_x = idx + o_q[:, None] * s_xn + i_h * s_xh
    if SORTED:
        tl.static_assert(BT == 0)
        # short rows: a bitonic top-k over packed keys, the score's order bits above BJ - 1 - j so
        # that equal scores rank the lower block first; the n taken sorted back to ascending blocks
        b_pk = (_order_bits(b_key).to(tl.int64) << 32) | (BJ - 1 - o_j)[None, :].to(tl.int64)
        b_top = tl.topk(b_pk, NSELP)                                                # [QC, NSELP]
        o_k = tl.arange(0, NSELP)
        b_ninf = _order_bits(tl.full([1, NSELP], float("-inf"), tl.float32))
        taken = ((b_top >> 32).to(tl.int32) > b_ninf) & (o_k < NSEL)[None, :]
        b_j = tl.sort(tl.where(taken, BJ - 1 - (b_top & 0xFFFFFFFF).to(tl.int32), BJ))
        tl.store(p_x + o_k[None, :], tl.where(b_j < BJ, b_j, -1), mask=m_q[:, None] & (o_k < NSEL)[None, :])
    else:
        # long rows: bisection on the keys' order bits for a threshold t with exactly n keys >= t
        # (then those keys are the top n), else for the n-th largest key (ties at it), then the keys
        # above t and, of those equal to it, the lowest blocks (a stable sort's first n). The bracket
        # starts at [max / 64, largest finite key] where the row allows it (n keys reach max / 64),
        # else from the whole int32 range: the same selection, ~4 of ~17 rounds fewer on random
        # Llama-shape rows (two reductions spent; the launch 13.1 -> 12.0 us at Llama 64K / 64 on an
        # H100, 25.4 -> 22.8 at 128K: bench/NOTES.md, sessions 35-36). The top end needs the
        # forced blocks (+inf) to be at most n (NSAConfig's rule): with exactly n of them every count
        # reaches n and t ends at a finite key, above which they are the n taken
        b_ord = _order_bits(b_key)                                                 # [QC, BJ] int32
        b_fin = (b_key < float("inf")) & (b_key > float("-inf"))
        mx = tl.max(tl.where(b_fin, b_ord, -2147483648), 1)                        # [QC]
        b_ot = b_ord   # no tail: never read
        if BT > 0:
            o_t = BJ + tl.arange(0, BT)
            b_kt = _row_keys(own, tail, p_row, o_t, m_q, t, NJO, JW, NBS, LS, A, FORCED_FIRST, FORCED_LOCAL)
            b_ot = _order_bits(b_kt)                                               # [QC, BT] int32
            b_ft = (b_kt < float("inf")) & (b_kt > float("-inf"))
            mx = tl.maximum(mx, tl.max(tl.where(b_ft, b_ot, -2147483648), 1))
        mx = mx.to(tl.int64)
        lo_g = tl.maximum(mx - 6 * 8388608, 0)   # 6 binades below the max (order bits of x / 64)
        c_g = _count_ge(b_ord, b_ot, lo_g.to(tl.int32), BT)
        fits = mx > -2147483648
        lo = tl.where(fits & (c_g >= NSEL), lo_g, -2147483648)
        hi = tl.where(fits, mx + 1, 2147483648)
        go = 1
        while go > 0:
            mid = (lo + hi) >> 1
            cnt = _count_ge(b_ord, b_ot, mid.to(tl.int32), BT)
            ok = cnt >= NSEL
            lo = tl.where(ok, mid, lo)
            hi = tl.where(cnt == NSEL, mid + 1, tl.where(ok, hi, mid))
            go = tl.max((hi - lo > 1).to(tl.int32), 0)
        b_t = lo.to(tl.int32)[:, None]
        above = b_ord > b_t
        tie = b_ord == b_t
        n_tie = tl.sum(tie.to(tl.int32), 1)
        need = NSEL - tl.sum(above.to(tl.int32), 1)
        sel = above | tie
        if BT > 0:
            above_t = b_ot > b_t
            tie_t = b_ot == b_t
            need -= tl.sum(above_t.to(tl.int32), 1)
            sel_t = above_t | tie_t
            n_all = n_tie + tl.sum(tie_t.to(tl.int32), 1)
        else:
            n_all = n_tie
        if tl.max((n_all > need).to(tl.int32), 0) > 0:   # ties at t overflow n: rare
            sel = above | (tie & (tl.cumsum(tie.to(tl.int32), 1) <= need[:, None]))
            if BT > 0:
                sel_t = above_t | (tie_t & (tl.cumsum(tie_t.to(tl.int32), 1) + n_tie[:, None] <= need[:, None]))
        sel = sel & (b_key > float("-inf"))
        rank = tl.cumsum(sel.to(tl.int32), 1) - 1
        tl.store(p_x + rank, o_j[None, :] + tl.zeros_like(rank), mask=sel & m_q[:, None])
        cnt = tl.sum(sel.to(tl.int32), 1)
        if BT > 0:
            sel_t = sel_t & (b_kt > float("-inf"))
            rank_t = tl.cumsum(sel_t.to(tl.int32), 1) - 1 + cnt[:, None]
            tl.store(p_x + rank_t, o_t[None, :] + tl.zeros_like(rank_t), mask=sel_t & m_q[:, None])
            cnt += tl.sum(sel_t.to(tl.int32), 1)
        tl.store(p_x + o_j[None, :], tl.full([1, BJ], -1, tl.int32),
                 mask=m_q[:, None] & (o_j[None, :] >= cnt[:, None]) & (o_j < NSEL)[None, :])
