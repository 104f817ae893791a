"""Triton kernels of NSA routing (the math is in this folder's README.md, the launches in route.py).

Rows of a program are (query, head) pairs: CR queries of the step times the GQA group's G heads, so
each compressed key tile is loaded once for all of them and the group's probabilities are summed by
one product with a row -> query selector. Lengths are read from device memory (a captured graph
replays at any context length); grids are sized for the cache's capacity and idle programs exit.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _cmp_scores(b_q, kc, o_i, m_i, o_d, s_kb):
    p_k = o_i.to(tl.int64)[:, None] * s_kb + o_d[None, :]
    b_k = tl.load(kc + p_k, mask=m_i[:, None], other=0.0)                       # [BC, D]
    return tl.dot(b_q, tl.trans(b_k), input_precision="ieee"), p_k               # [BM, BC]


@triton.jit
def _path_scores(b_q, kp, o_qi, i_h, b, m_r, b_np, o_d, s_pn, s_ph, s_pb):
    # scores of each row's own path-specific block b (a different key per query): [BM]
    m_b = m_r & (b < b_np)
    p_b = o_qi[:, None] * s_pn + i_h * s_ph + b * s_pb + o_d[None, :]
    b_k = tl.load(kp + p_b, mask=m_b[:, None], other=0.0)
    return tl.sum(b_q.to(tl.float32) * b_k.to(tl.float32), 1), m_b, p_b


@triton.jit
def _load_q_rows(q, i_g, i_h, N, scale, s_qn, s_qh, G: tl.constexpr, CR: tl.constexpr, BM: tl.constexpr,
                 D: tl.constexpr):
    # log2(e) and the scale folded into q: the softmax runs in base 2
    o_r = tl.arange(0, BM)
    o_qi = (i_g * CR + o_r // G).to(tl.int64)
    m_r = (o_r < CR * G) & (o_qi < N)
    o_hq = i_h * G + o_r % G
    o_d = tl.arange(0, D)
    b_q = tl.load(q + o_qi[:, None] * s_qn + o_hq[:, None] * s_qh + o_d[None, :], mask=m_r[:, None], other=0.0)
    return (b_q * (scale * 1.4426950408889634)).to(b_q.dtype), o_r, o_qi, m_r, o_hq, o_d


@triton.jit
def _num_sel_touched(NBPRE, NBS, R: tl.constexpr, A: tl.constexpr):
    # selection blocks j < NBS holding a committed compression block i (j*R - A < i < (j+1)*R, i < NBPRE)
    return tl.minimum(tl.where(NBPRE > 0, (NBPRE + A - 2) // R + 1, 0), NBS)


@triton.jit
def _lse_range(b_q, kc, vc, i_lo, i_hi, o_d, s_kb, b_m, b_l, b_a, BC: tl.constexpr, WANT_O: tl.constexpr):
    # online softmax (base 2) over committed compression blocks [i_lo, i_hi)
    for i0 in range(i_lo, i_hi, BC):
        o_i = i0 + tl.arange(0, BC)
        m_i = o_i < i_hi
        b_s, p_k = _cmp_scores(b_q, kc, o_i, m_i, o_d, s_kb)
        b_s = tl.where(m_i[None, :], b_s, float("-inf"))
        b_mn = tl.maximum(b_m, tl.max(b_s, 1))
        b_ms = tl.where(b_mn == float("-inf"), 0.0, b_mn)
        b_p = tl.exp2(b_s - b_ms[:, None])
        b_al = tl.exp2(b_m - b_ms)
        b_l = b_l * b_al + tl.sum(b_p, 1)
        if WANT_O:
            b_v = tl.load(vc + p_k, mask=m_i[:, None], other=0.0)
            b_a = b_a * b_al[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision="ieee")
        b_m = b_mn
    return b_m, b_l, b_a


@triton.jit
def _lse_path(b_q, kp, vp, npath, o_qi, i_h, m_r, o_d, NBP, s_pn, s_ph, s_pb, b_m, b_l, b_a,
              WANT_O: tl.constexpr):
    # each query's own path-specific blocks (at most NBP, npath[q] of them complete)
    b_np = tl.load(npath + o_qi, mask=m_r, other=0)
    for b in range(0, NBP):
        b_s, m_b, p_b = _path_scores(b_q, kp, o_qi, i_h, b, m_r, b_np, o_d, s_pn, s_ph, s_pb)
        b_s = tl.where(m_b, b_s, float("-inf"))
        b_mn = tl.maximum(b_m, b_s)
        b_ms = tl.where(b_mn == float("-inf"), 0.0, b_mn)
        b_p = tl.exp2(b_s - b_ms)
        b_al = tl.exp2(b_m - b_ms)
        b_l = b_l * b_al + b_p
        if WANT_O:
            b_v = tl.load(vp + p_b, mask=m_b[:, None], other=0.0)
            b_a = b_a * b_al[:, None] + b_p[:, None] * b_v.to(tl.float32)
        b_m = b_mn
    return b_m, b_l, b_a


@triton.jit
def _query_selector(i_g, o_r, m_r, N, G: tl.constexpr, CR: tl.constexpr, CRP: tl.constexpr):
    # [CRP, BM] 0/1: row r belongs to the program's query c (sums a query's G heads in one product)
    o_c = tl.arange(0, CRP)
    o_qc = (i_g * CR + o_c).to(tl.int64)
    m_c = (o_c < CR) & (o_qc < N)
    return ((o_r[None, :] // G == o_c[:, None]) & m_r[None, :]).to(tl.float32), o_qc, m_c


@triton.jit
def _imp_range(b_q, b_lsafe, b_sel, kc, imp, o_qc, m_c, m_r, o_d, j_lo, j_hi, NBPRE, s_kb, s_in,
               R: tl.constexpr, A: tl.constexpr, BC: tl.constexpr, JT: tl.constexpr, JTP: tl.constexpr):
    # importance of selection blocks [j_lo, j_hi) from the committed compression blocks: a tile of BC
    # compression blocks from j0*R - A + 1 holds all R + A - 1 blocks of JT whole selection blocks,
    # mapped by one 0/1 product, so every selection block is summed by one program (no halo, no race)
    o_l = tl.arange(0, BC)
    o_jl = tl.arange(0, JTP)
    u = o_l[:, None] - o_jl[None, :] * R
    b_map = ((u >= 0) & (u < R + A - 1) & (o_jl < JT)[None, :]).to(tl.float32)    # [BC, JTP]
    for j0 in range(j_lo, j_hi, JT):
        o_i = j0 * R - A + 1 + o_l
        m_i = (o_i >= 0) & (o_i < NBPRE)
        b_s, _ = _cmp_scores(b_q, kc, o_i, m_i, o_d, s_kb)
        b_p = tl.where(m_i[None, :] & m_r[:, None], tl.exp2(b_s - b_lsafe[:, None]), 0.0)  # [BM, BC]
        b_pj = tl.dot(b_p, b_map, input_precision="ieee")                                   # [BM, JTP]
        b_imp = tl.dot(b_sel, b_pj, input_precision="ieee")                                 # [CRP, JTP]
        o_j = j0 + o_jl
        m_j = (o_jl < JT) & (o_j < j_hi)
        tl.store(imp + o_qc[:, None] * s_in + o_j[None, :], b_imp, mask=m_c[:, None] & m_j[None, :])


@triton.jit
def _imp_path(b_q, b_lsafe, b_sel, kp, pp, npath, o_qi, i_h, m_r, o_qc, m_c, o_d, NBP, s_pn, s_ph, s_pb,
              s_un, s_uh):
    # each query's path-specific blocks' probabilities summed over its G heads: pp [N, Hkv, NBP]
    b_np = tl.load(npath + o_qi, mask=m_r, other=0)
    for b in range(0, NBP):
        b_s, m_b, _ = _path_scores(b_q, kp, o_qi, i_h, b, m_r, b_np, o_d, s_pn, s_ph, s_pb)
        b_p = tl.where(m_b, tl.exp2(b_s - b_lsafe), 0.0)
        b_ps = tl.sum(b_sel * b_p[None, :], 1)
        tl.store(pp + o_qc * s_un + i_h * s_uh + b, b_ps, mask=m_c)


@triton.jit
def _order_bits(x):
    # fp32 -> int32 with the same order (negatives flipped)
    b = x.to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def _topk_rows(imp, pp, npath, pos, idx, NBPRE, NBS, o_q, m_q, i_h, s_in, s_ih, s_un, s_uh, s_xn, s_xh,
               LS: tl.constexpr, R: tl.constexpr, A: tl.constexpr, BJ: tl.constexpr, NSEL: tl.constexpr,
               NSELP: tl.constexpr, FORCED_FIRST: tl.constexpr, FORCED_LOCAL: tl.constexpr):
    # queries o_q [QC]: importance (committed part from `imp`, path-specific blocks from `pp`),
    # candidates, forced blocks, top-n with ties to the lower index, ascending, -1 padded
    o_j = tl.arange(0, BJ)
    m_j = o_j < NBS
    m_qj = m_q[:, None] & m_j[None, :]
    p_imp = imp + o_q[:, None] * s_in + i_h * s_ih + o_j[None, :]
    b_imp = tl.load(p_imp, mask=m_qj & (o_j < _num_sel_touched(NBPRE, NBS, R, A))[None, :], other=0.0)  # [QC, BJ]
    t = tl.load(pos + o_q, mask=m_q, other=0)
    b_np = tl.load(npath + o_q, mask=m_q, other=0)
    for u in tl.static_range(R + A - 1):
        o_b = o_j * R - A + 1 + u - NBPRE                  # the path-specific block, if any
        m_b = m_qj & (o_b >= 0)[None, :] & (o_b[None, :] < b_np[:, None])
        b_imp += tl.load(pp + o_q[:, None] * s_un + i_h * s_uh + o_b[None, :], mask=m_b, other=0.0)
    cand = (o_j[None, :] * LS <= t[:, None]) & m_j[None, :]
    b_imp = tl.where(cand, b_imp, float("-inf"))
    tl.store(p_imp, b_imp, mask=m_qj)
    cur = t[:, None] // LS
    forced = (o_j[None, :] > cur - FORCED_LOCAL) & (o_j[None, :] <= cur)
    if FORCED_FIRST:
        forced = forced | (o_j[None, :] == 0)
    b_key = tl.where(cand & forced, float("inf"), b_imp)
    # one top-k over packed keys: the score's order bits above BJ - 1 - j, so that equal scores
    # rank the lower block first
    b_pk = (_order_bits(b_key).to(tl.int64) << 32) | (BJ - 1 - o_j)[None, :].to(tl.int64)
    b_top = tl.topk(b_pk, NSELP)                                                    # [QC, NSELP]
    o_k = tl.arange(0, NSELP)
    b_ninf = _order_bits(tl.full([1, NSELP], float("-inf"), tl.float32))
    taken = ((b_top >> 32).to(tl.int32) > b_ninf) & (o_k < NSEL)[None, :]
    b_j = tl.where(taken, BJ - 1 - (b_top & 0xFFFFFFFF).to(tl.int32), BJ)
    b_j = tl.sort(b_j)                                                               # ascending, pads last
    tl.store(idx + o_q[:, None] * s_xn + i_h * s_xh + o_k[None, :], tl.where(b_j < BJ, b_j, -1),
             mask=m_q[:, None] & (o_k < NSEL)[None, :])


@triton.jit
def nsa_route_lse_fwd_kernel(
    q, kc, vc, kp, vp, npath, nbpre, m_out, l_out, a_out,
    N, NBP, scale,
    s_qn, s_qh, s_kh, s_kb, s_pn, s_ph, s_pb, HQ,
    G: tl.constexpr, CR: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, BC: tl.constexpr,
    WANT_O: tl.constexpr,
):
    # split launch 1, grid (query groups, Hkv, splits): partial softmax state of a range of the
    # committed compression blocks in whole BC tiles (split 0 also the path-specific blocks)
    i_g, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NBPRE = tl.load(nbpre)
    BPS = tl.cdiv(tl.cdiv(tl.maximum(NBPRE, 1), tl.num_programs(2)), BC) * BC
    b_q, o_r, o_qi, m_r, o_hq, o_d = _load_q_rows(q, i_g, i_h, N, scale, s_qn, s_qh, G, CR, BM, D)
    b_m = tl.full([BM], float("-inf"), tl.float32)
    b_l = tl.zeros([BM], tl.float32)
    b_a = tl.zeros([BM, D], tl.float32)
    i_lo = i_s * BPS
    b_m, b_l, b_a = _lse_range(b_q, kc + i_h * s_kh, vc + i_h * s_kh, i_lo, tl.minimum(i_lo + BPS, NBPRE), o_d,
                               s_kb, b_m, b_l, b_a, BC, WANT_O)
    if i_s == 0:
        b_m, b_l, b_a = _lse_path(b_q, kp, vp, npath, o_qi, i_h, m_r, o_d, NBP, s_pn, s_ph, s_pb, b_m, b_l, b_a,
                                  WANT_O)
    p_part = (i_s * N + o_qi) * HQ + o_hq
    tl.store(m_out + p_part, b_m, mask=m_r)
    tl.store(l_out + p_part, b_l, mask=m_r)
    if WANT_O:
        tl.store(a_out + p_part[:, None] * D + o_d[None, :], b_a, mask=m_r[:, None])


@triton.jit
def nsa_route_imp_fwd_kernel(
    q, kc, kp, npath, nbpre, m_in, l_in, a_in, imp, pp, o_cmp, lse,
    N, NBP, NBS, scale,
    s_qn, s_qh, s_kh, s_kb, s_pn, s_ph, s_pb, HQ, s_in, s_ih, s_un, s_uh,
    G: tl.constexpr, CR: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, BC: tl.constexpr,
    WANT_O: tl.constexpr, CRP: tl.constexpr, R: tl.constexpr, A: tl.constexpr, JT: tl.constexpr,
    JTP: tl.constexpr,
):
    # split launch 2, same grid: the final log-sum-exp from the splits' states, then the importance
    # of a range of whole selection blocks (split 0 also the path-specific blocks' sums)
    i_g, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NSPLIT = tl.num_programs(2)
    NBPRE = tl.load(nbpre)
    b_q, o_r, o_qi, m_r, o_hq, o_d = _load_q_rows(q, i_g, i_h, N, scale, s_qn, s_qh, G, CR, BM, D)
    b_m = tl.full([BM], float("-inf"), tl.float32)
    for s in range(0, NSPLIT):
        b_m = tl.maximum(b_m, tl.load(m_in + (s * N + o_qi) * HQ + o_hq, mask=m_r, other=float("-inf")))
    b_ms = tl.where(b_m == float("-inf"), 0.0, b_m)
    b_l = tl.zeros([BM], tl.float32)
    b_a = tl.zeros([BM, D], tl.float32)
    for s in range(0, NSPLIT):
        p_part = (s * N + o_qi) * HQ + o_hq
        b_w = tl.exp2(tl.load(m_in + p_part, mask=m_r, other=float("-inf")) - b_ms)
        b_l += b_w * tl.load(l_in + p_part, mask=m_r, other=0.0)
        if WANT_O:
            if i_s == 0:
                b_a += b_w[:, None] * tl.load(a_in + p_part[:, None] * D + o_d[None, :], mask=m_r[:, None], other=0.0)
    b_lse2 = tl.where(b_l > 0, b_ms + tl.log2(tl.where(b_l > 0, b_l, 1.0)), float("-inf"))
    b_lsafe = tl.where(b_l > 0, b_lse2, 0.0)
    if i_s == 0:
        tl.store(lse + o_qi * HQ + o_hq, b_lse2 * 0.6931471805599453, mask=m_r)
        if WANT_O:
            b_o = b_a / tl.where(b_l > 0, b_l, 1.0)[:, None]
            tl.store(o_cmp + (o_qi * HQ + o_hq)[:, None] * D + o_d[None, :], b_o, mask=m_r[:, None])
    b_sel, o_qc, m_c = _query_selector(i_g, o_r, m_r, N, G, CR, CRP)
    NJ = _num_sel_touched(NBPRE, NBS, R, A)
    JPS = tl.cdiv(tl.cdiv(tl.maximum(NJ, 1), NSPLIT), JT) * JT
    j_lo = i_s * JPS
    _imp_range(b_q, b_lsafe, b_sel, kc + i_h * s_kh, imp + i_h * s_ih, o_qc, m_c, m_r, o_d, j_lo,
               tl.minimum(j_lo + JPS, NJ), NBPRE, s_kb, s_in, R, A, BC, JT, JTP)
    if i_s == 0:
        _imp_path(b_q, b_lsafe, b_sel, kp, pp, npath, o_qi, i_h, m_r, o_qc, m_c, o_d, NBP, s_pn, s_ph, s_pb,
                  s_un, s_uh)


@triton.jit
def nsa_route_topk_fwd_kernel(
    imp, pp, npath, nbpre, pos, idx,
    N, NBS, s_in, s_ih, s_un, s_uh, s_xn, s_xh,
    QC: tl.constexpr, LS: tl.constexpr, R: tl.constexpr, A: tl.constexpr, BJ: tl.constexpr, NSEL: tl.constexpr,
    NSELP: tl.constexpr, FORCED_FIRST: tl.constexpr, FORCED_LOCAL: tl.constexpr,
):
    # split launch 3, grid (query chunks of QC, Hkv)
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    o_q = (i_n * QC + tl.arange(0, QC)).to(tl.int64)
    _topk_rows(imp, pp, npath, pos, idx, tl.load(nbpre), NBS, o_q, o_q < N, i_h, s_in, s_ih, s_un, s_uh, s_xn,
               s_xh, LS, R, A, BJ, NSEL, NSELP, FORCED_FIRST, FORCED_LOCAL)


@triton.jit
def nsa_route_fused_fwd_kernel(
    q, kc, vc, kp, vp, npath, nbpre, pos, imp, pp, idx, o_cmp, lse,
    N, NBP, NBS, scale,
    s_qn, s_qh, s_kh, s_kb, s_pn, s_ph, s_pb, HQ, s_in, s_ih, s_un, s_uh, s_xn, s_xh,
    G: tl.constexpr, CR: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, BC: tl.constexpr,
    WANT_O: tl.constexpr, CRP: tl.constexpr, R: tl.constexpr, A: tl.constexpr, JT: tl.constexpr,
    JTP: tl.constexpr, QC: tl.constexpr, LS: tl.constexpr, BJ: tl.constexpr, NSEL: tl.constexpr,
    NSELP: tl.constexpr, FORCED_FIRST: tl.constexpr, FORCED_LOCAL: tl.constexpr,
):
    # one launch, grid (query groups, Hkv), for contexts one program can sweep: the softmax pass,
    # the importance pass (its tiles come back from L2) and the top-n of the program's queries
    i_g, i_h = tl.program_id(0), tl.program_id(1)
    NBPRE = tl.load(nbpre)
    b_q, o_r, o_qi, m_r, o_hq, o_d = _load_q_rows(q, i_g, i_h, N, scale, s_qn, s_qh, G, CR, BM, D)
    b_m = tl.full([BM], float("-inf"), tl.float32)
    b_l = tl.zeros([BM], tl.float32)
    b_a = tl.zeros([BM, D], tl.float32)
    b_m, b_l, b_a = _lse_range(b_q, kc + i_h * s_kh, vc + i_h * s_kh, 0, NBPRE, o_d, s_kb, b_m, b_l, b_a, BC,
                               WANT_O)
    b_m, b_l, b_a = _lse_path(b_q, kp, vp, npath, o_qi, i_h, m_r, o_d, NBP, s_pn, s_ph, s_pb, b_m, b_l, b_a,
                              WANT_O)
    b_ms = tl.where(b_m == float("-inf"), 0.0, b_m)
    b_lse2 = tl.where(b_l > 0, b_ms + tl.log2(tl.where(b_l > 0, b_l, 1.0)), float("-inf"))
    b_lsafe = tl.where(b_l > 0, b_lse2, 0.0)
    tl.store(lse + o_qi * HQ + o_hq, b_lse2 * 0.6931471805599453, mask=m_r)
    if WANT_O:
        b_o = b_a / tl.where(b_l > 0, b_l, 1.0)[:, None]
        tl.store(o_cmp + (o_qi * HQ + o_hq)[:, None] * D + o_d[None, :], b_o, mask=m_r[:, None])
    b_sel, o_qc, m_c = _query_selector(i_g, o_r, m_r, N, G, CR, CRP)
    _imp_range(b_q, b_lsafe, b_sel, kc + i_h * s_kh, imp + i_h * s_ih, o_qc, m_c, m_r, o_d, 0,
               _num_sel_touched(NBPRE, NBS, R, A), NBPRE, s_kb, s_in, R, A, BC, JT, JTP)
    _imp_path(b_q, b_lsafe, b_sel, kp, pp, npath, o_qi, i_h, m_r, o_qc, m_c, o_d, NBP, s_pn, s_ph, s_pb, s_un, s_uh)
    tl.debug_barrier()   # the program's own importance stores, read back by other threads
    for c in tl.static_range(0, CRP, QC):
        o_c = c + tl.arange(0, QC)
        o_q = (i_g * CR + o_c).to(tl.int64)
        _topk_rows(imp, pp, npath, pos, idx, NBPRE, NBS, o_q, (o_c < CR) & (o_q < N), i_h, s_in, s_ih, s_un, s_uh,
                   s_xn, s_xh, LS, R, A, BJ, NSEL, NSELP, FORCED_FIRST, FORCED_LOCAL)


@triton.jit
def nsa_path_blocks_fwd_kernel(
    w, k, v, kp, vp, s0p, S, NBP, L, s_wn, s_wb, s_kh, s_kt, s_pn, s_ph, s_pb,
    BSB: tl.constexpr, D: tl.constexpr, NBPP: tl.constexpr,
):
    # one program per (query, KV head): its path-specific compressed keys/values, w[n, :] @ k[h, s0:],
    # every path block of a slot tile at once (each K/V tile is loaded once, not once per block);
    # s0 is read from device memory (it moves with the context length), slots stop at the cache's end L
    i_n, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    S0 = tl.load(s0p)
    o_d = tl.arange(0, D)
    o_b = tl.arange(0, NBPP)
    b_ak = tl.zeros([NBPP, D], tl.float32)
    b_av = tl.zeros([NBPP, D], tl.float32)
    for s0 in range(0, S, BSB):
        o_s = s0 + tl.arange(0, BSB)
        m_s = (o_s < S) & (S0 + o_s < L)
        p_t = (S0 + o_s).to(tl.int64)[:, None] * s_kt + o_d[None, :]
        p_w = w + i_n * s_wn + o_b[:, None] * s_wb + o_s[None, :]
        b_w = tl.load(p_w, mask=(o_b < NBP)[:, None] & m_s[None, :], other=0.0)                # [NBPP, BSB]
        b_k = tl.load(k + i_h * s_kh + p_t, mask=m_s[:, None], other=0.0).to(tl.float32)   # [BSB, D]
        b_v = tl.load(v + i_h * s_kh + p_t, mask=m_s[:, None], other=0.0).to(tl.float32)
        # the weights are 0 or 1/l: exact products, fp32 sums
        b_ak += tl.dot(b_w, b_k, input_precision="ieee")
        b_av += tl.dot(b_w, b_v, input_precision="ieee")
    o_o = i_n * s_pn + i_h * s_ph + o_b[:, None] * s_pb + o_d[None, :]
    m_o = (o_b < NBP)[:, None]
    tl.store(kp + o_o, b_ak, mask=m_o)
    tl.store(vp + o_o, b_av, mask=m_o)
