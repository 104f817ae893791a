"""Triton kernels of NSA routing's launches (the math is in this folder's README.md, the launches in
route.py, the shared pieces in route_kernels.py): one sweep of the keys (score,
merge_topk) for rows up to `route_policy.ONE_SWEEP_MAX_BLOCKS` selection blocks, two (score without
sums, imp, topk) past them.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ssv.ops.nsa.route_kernels import (_cmp_scores, _cmp_values, _finish_softmax, _imp_path, _imp_range, _load_q_rows,
                                       _lse_path, _lse_range, _num_own, _path_mask, _path_scores, _query_cols,
                                       _topk_rows)
from ssv.ops.pdl import l2_prefetch_tail, pdl_prologue


@triton.jit
def _score_range(b_q, kc, vc, kd, vd, i_h, own, tail, mt, i_lo, i_hi, o_d, o_row, m_r, NJO, s_kb, s_on, s_mn, b_m,
                 b_l, b_a, BM: tl.constexpr, BC: tl.constexpr, R: tl.constexpr, A: tl.constexpr,
                 WANT_O: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    # `_lse_range` over [i_lo, i_hi) in tiles aligned to selection blocks that also keeps, from the same
    # scores, each (query, head) row's own/tail sums per selection block relative to the tile's max,
    # with that max (mt): the importance needs no second sweep of the keys. The top-n launch scales
    # a tile's sums by exp2(max - lse) once the log-sum-exp is known and sums the group's heads
    JB: tl.constexpr = BC // R
    o_u = tl.arange(0, R)
    for i0 in range(i_lo, i_hi, BC):
        o_i = i0 + tl.arange(0, BC)
        m_i = o_i < i_hi
        b_s = _cmp_scores(b_q, kc, kd, i_h, i0, o_i, m_i, o_d, s_kb, BC, D, TMA)
        b_s = tl.where(m_i[None, :], b_s, float("-inf"))
        b_mt = tl.max(b_s, 1)
        b_mt = tl.where(b_mt == float("-inf"), 0.0, b_mt)
        b_p = tl.exp2(b_s - b_mt[:, None])                                              # [BM, BC]
        b_mn = tl.maximum(b_m, b_mt)
        b_al = tl.exp2(b_m - b_mn)
        b_bt = tl.exp2(b_mt - b_mn)
        b_l = b_l * b_al + tl.sum(b_p, 1) * b_bt
        if WANT_O:
            b_v = _cmp_values(vc, vd, i_h, i0, o_i, m_i, o_d, s_kb, BC, D, TMA)
            b_a = b_a * b_al[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision="ieee") * b_bt[:, None]
        b_m = b_mn
        b_ps = tl.reshape(b_p, [BM, JB, R])                                             # [BM, JB, R]
        o_j = i0 // R + tl.arange(0, JB)
        p_o = o_row[:, None] * s_on + o_j[None, :]
        m_o = m_r[:, None] & (o_j < NJO)[None, :]
        tl.store(own + p_o, tl.sum(b_ps, 2), mask=m_o)
        if A > 1:
            tl.store(tail + p_o, tl.sum(tl.where((o_u >= R - A + 1)[None, None, :], b_ps, 0.0), 2), mask=m_o)
        tl.store(mt + o_row * s_mn + i0 // BC, b_mt, mask=m_r)
    return b_m, b_l, b_a


@triton.jit
def _merge_splits(m_in, l_in, a_in, o_row, m_r, N, HQ, NSPLIT, o_d, with_o, ROWS: tl.constexpr, NSP: tl.constexpr,
                  D: tl.constexpr, WANT_O: tl.constexpr):
    # rows o_row = query * HQ + head: the score launch's NSPLIT partial states (m_in / l_in / a_in
    # [splits, N, HQ(, D)]) merged, all splits' maxima and sums in one [NSP, rows] load each (one
    # memory round trip, not one a split); the values (gated NSA) only `with_o`
    o_sp = tl.arange(0, NSP)
    p_sp = o_sp[:, None] * N * HQ + o_row[None, :]                                       # [NSP, ROWS]
    m_sp = (o_sp < NSPLIT)[:, None] & m_r[None, :]
    b_mp = tl.load(m_in + p_sp, mask=m_sp, other=float("-inf"))
    b_m = tl.max(b_mp, 0)
    b_ms = tl.where(b_m == float("-inf"), 0.0, b_m)
    b_l = tl.sum(tl.exp2(b_mp - b_ms[None, :]) * tl.load(l_in + p_sp, mask=m_sp, other=0.0), 0)
    b_a = tl.zeros([ROWS, D], tl.float32)
    if WANT_O:
        if with_o:
            for s in range(0, NSPLIT):
                p_part = s * N * HQ + o_row
                b_w = tl.exp2(tl.load(m_in + p_part, mask=m_r, other=float("-inf")) - b_ms)
                b_a += b_w[:, None] * tl.load(a_in + p_part[:, None] * D + o_d[None, :], mask=m_r[:, None], other=0.0)
    return b_m, b_l, b_a


@triton.jit
def nsa_route_score_fwd_kernel(
    q, kc, vc, kd, vd, k, v, w, s0p, npath, nbpre, sp, m_out, l_out, a_out, own_h, tail_h, mt,
    N, NBP, NCS, NBS, S, L, scale,
    s_qn, s_qh, s_kh, s_kb, s_ch, s_kt, s_wn, s_wb, HQ, s_on, s_mn,
    G: tl.constexpr, CR: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, BC: tl.constexpr,
    WANT_O: tl.constexpr, GP: tl.constexpr, R: tl.constexpr, A: tl.constexpr, SB: tl.constexpr,
    NBPP: tl.constexpr, SUMS: tl.constexpr, TMA: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # split launch 1, grid (query groups, Hkv, NCS + NBP): splits i_s < NCS take a range of the
    # committed compression blocks in whole BC tiles: partial softmax states and, when SUMS (the
    # one-sweep form), per head each selection block's sums against its tile's max; split NCS + b
    # the path-specific block b of every row (its raw score kept in sp): its own program, so the
    # path blocks' slot products run beside the compressed sweep, not after it. Under PDL the head's
    # committed compressed keys (and values) go into L2 first, while the previous kernel runs
    i_g, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_part, n_part = i_g * tl.num_programs(2) + i_s, tl.num_programs(0) * tl.num_programs(2)
    # (at most NBS * R rows, every compression block a row's selection blocks can start: a bound on
    # the loop that holds whatever the length read before the wait)
    l2_prefetch_tail(kc + i_h * s_kh, nbpre, NBS * R, s_kb, i_part, n_part, D, PDL)
    if WANT_O:
        l2_prefetch_tail(vc + i_h * s_kh, nbpre, NBS * R, s_kb, i_part, n_part, D, PDL)
    pdl_prologue(PDL)
    b_q, o_r, o_qi, m_r, o_hq, o_d = _load_q_rows(q, i_g, i_h, N, scale, s_qn, s_qh, G, CR, BM, D, GP)
    b_m = tl.full([BM], float("-inf"), tl.float32)
    b_l = tl.zeros([BM], tl.float32)
    b_a = tl.zeros([BM, D], tl.float32)
    if i_s < NCS:
        NBPRE = tl.load(nbpre)
        BPS = tl.cdiv(tl.cdiv(tl.maximum(NBPRE, 1), NCS), BC) * BC
        i_lo = i_s * BPS
        if SUMS:
            b_m, b_l, b_a = _score_range(b_q, kc + i_h * s_kh, vc + i_h * s_kh, kd, vd, i_h, own_h, tail_h, mt,
                                         i_lo, tl.minimum(i_lo + BPS, NBPRE), o_d, o_qi * HQ + o_hq, m_r,
                                         _num_own(NBPRE, NBS, R), s_kb, s_on, s_mn, b_m, b_l, b_a, BM, BC, R, A,
                                         WANT_O, D, TMA)
        else:
            b_m, b_l, b_a = _lse_range(b_q, kc + i_h * s_kh, vc + i_h * s_kh, kd, vd, i_h, i_lo,
                                       tl.minimum(i_lo + BPS, NBPRE), o_d, s_kb, b_m, b_l, b_a, BC, D, WANT_O, TMA)
    else:
        b = i_s - NCS
        S0 = tl.load(s0p)
        b_sp = _path_scores(b_q, k + i_h * s_ch, w, S0, o_qi, m_r, o_d, S, L, b, b + 1, s_kt, s_wn, s_wb, BM, SB,
                            NBPP)
        m_b = _path_mask(npath, o_qi, m_r, b, b + 1, NBPP)
        b_m, b_l, b_a = _lse_path(b_sp, m_b, v + i_h * s_ch, w, S0, o_qi, m_r, o_d, S, L, b, b + 1, s_kt, s_wn,
                                  s_wb, b_m, b_l, b_a, BM, SB, NBPP, WANT_O)
        o_b = tl.arange(0, NBPP)
        tl.store(sp + (o_qi * HQ + o_hq)[:, None] * NBPP + o_b[None, :], b_sp, mask=m_r[:, None] & (o_b == b)[None, :])
    p_part = (i_s * N + o_qi) * HQ + o_hq
    tl.store(m_out + p_part, b_m, mask=m_r)
    tl.store(l_out + p_part, b_l, mask=m_r)
    if WANT_O:
        tl.store(a_out + p_part[:, None] * D + o_d[None, :], b_a, mask=m_r[:, None])


@triton.jit
def nsa_route_merge_topk_fwd_kernel(
    own_h, tail_h, mt, sp, m_in, l_in, a_in, own, tail, pp, npath, nbpre, pos, idx, o_cmp, lse,
    N, NBP, NBS, NSPLIT, HQ, s_on, s_mn, s_in, s_ih, s_un, s_uh, s_xn, s_xh,
    G: tl.constexpr, D: tl.constexpr, BC: tl.constexpr, WANT_O: tl.constexpr, NSP: tl.constexpr,
    QC: tl.constexpr, LS: tl.constexpr, R: tl.constexpr, A: tl.constexpr, BJ: tl.constexpr, NSEL: tl.constexpr,
    NSELP: tl.constexpr, SORTED: tl.constexpr, FORCED_FIRST: tl.constexpr, FORCED_LOCAL: tl.constexpr,
    NBPP: tl.constexpr, NW: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # one-sweep launch 2, grid (query chunks of QC, Hkv): per head of the group, the final log-sum-exp
    # from all the states of launch 1 (o_cmp for gated NSA), the tiles' sums scaled by
    # exp2(tile max - lse) and the path blocks' probabilities, summed over the heads into the
    # importance rows; then the top-n of those rows
    pdl_prologue(PDL)
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    o_q = (i_n * QC + tl.arange(0, QC)).to(tl.int64)
    m_q = o_q < N
    NBPRE = tl.load(nbpre)
    NJO = _num_own(NBPRE, NBS, R)
    JB: tl.constexpr = BC // R
    o_j = tl.arange(0, BJ)
    m_oj = m_q[:, None] & (o_j < NJO)[None, :]
    o_b = tl.arange(0, NBPP)
    b_np = tl.load(npath + o_q, mask=m_q, other=0)
    m_pb = m_q[:, None] & (o_b[None, :] < b_np[:, None]) & (o_b < NBP)[None, :]
    o_d = tl.arange(0, D)
    b_own = tl.zeros([QC, BJ], tl.float32)
    b_tail = tl.zeros([QC, BJ], tl.float32)
    b_pp = tl.zeros([QC, NBPP], tl.float32)
    for g in tl.static_range(G):
        o_row = o_q * HQ + i_h * G + g                                                   # [QC]
        b_m, b_l, b_a = _merge_splits(m_in, l_in, a_in, o_row, m_q, N, HQ, NSPLIT, o_d, True, QC, NSP, D, WANT_O)
        b_lsafe = _finish_softmax(b_m, b_l, b_a, lse, o_cmp, o_q, i_h * G + g, m_q, o_d, HQ, True, D, WANT_O)
        b_f = tl.exp2(tl.load(mt + o_row[:, None] * s_mn + o_j[None, :] // JB, mask=m_oj, other=0.0)
                      - b_lsafe[:, None])                                                # [QC, BJ]
        p_r = o_row[:, None] * s_on + o_j[None, :]
        b_own += b_f * tl.load(own_h + p_r, mask=m_oj, other=0.0)
        if A > 1:
            b_tail += b_f * tl.load(tail_h + p_r, mask=m_oj, other=0.0)
        b_sp = tl.load(sp + o_row[:, None] * NBPP + o_b[None, :], mask=m_pb, other=0.0)
        b_pp += tl.where(m_pb, tl.exp2(b_sp - b_lsafe[:, None]), 0.0)
    p_row = o_q[:, None] * s_in + i_h * s_ih + o_j[None, :]
    tl.store(own + p_row, b_own, mask=m_oj)
    if A > 1:
        tl.store(tail + p_row, b_tail, mask=m_oj)
    tl.store(pp + o_q[:, None] * s_un + i_h * s_uh + o_b[None, :], b_pp, mask=m_q[:, None] & (o_b < NBP)[None, :])
    tl.debug_barrier()   # the rows' stores, read back by other threads
    _topk_rows(own, tail, pp, npath, pos, idx, NBPRE, NBS, o_q, m_q, i_h, s_in, s_ih, s_un, s_uh,
               s_xn, s_xh, LS, R, A, BJ, NSEL, NSELP, SORTED, FORCED_FIRST, FORCED_LOCAL, NBPP, NW)


@triton.jit
def nsa_route_imp_fwd_kernel(
    q, kc, kd, npath, nbpre, sp, m_in, l_in, a_in, own, tail, pp, o_cmp, lse,
    N, NBS, NCS, scale,
    s_qn, s_qh, s_kh, s_kb, HQ, s_in, s_ih, s_un, s_uh,
    G: tl.constexpr, CR: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, BC: tl.constexpr,
    WANT_O: tl.constexpr, GP: tl.constexpr, R: tl.constexpr, A: tl.constexpr, NBPP: tl.constexpr,
    NSP: tl.constexpr, TMA: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # two-sweep launch 2, the score launch's grid: the final log-sum-exp from all its states, then the
    # importance of a range of whole selection blocks (split NCS + b: path block b's sums)
    pdl_prologue(PDL)
    i_g, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NSPLIT = tl.num_programs(2)
    _, o_r, o_qi, m_r, o_hq, o_d = _load_q_rows(q, i_g, i_h, N, scale, s_qn, s_qh, G, CR, BM, D, GP)
    b_m, b_l, b_a = _merge_splits(m_in, l_in, a_in, o_qi * HQ + o_hq, m_r, N, HQ, NSPLIT, o_d, i_s == 0, BM, NSP, D,
                                  WANT_O)
    b_lsafe = _finish_softmax(b_m, b_l, b_a, lse, o_cmp, o_qi, o_hq, m_r, o_d, HQ, i_s == 0, D, WANT_O)
    o_qc, m_c = _query_cols(i_g, N, CR)
    if i_s < NCS:
        NBPRE = tl.load(nbpre)
        NJO = _num_own(NBPRE, NBS, R)
        JB: tl.constexpr = BC // R
        JPS = tl.cdiv(tl.cdiv(tl.maximum(NJO, 1), NCS), JB) * JB
        j_lo = i_s * JPS
        _imp_range(q, i_g, N, scale, s_qn, s_qh, b_lsafe, kc + i_h * s_kh, kd, i_h, own + i_h * s_ih,
                   tail + i_h * s_ih, o_qc, m_c, m_r, o_d, j_lo, tl.minimum(j_lo + JPS, NJO), NBPRE, s_kb, s_in, G, R,
                   A, BC, CR, GP, D, TMA)
    else:
        b = i_s - NCS
        o_b = tl.arange(0, NBPP)
        b_sp = tl.load(sp + (o_qi * HQ + o_hq)[:, None] * NBPP + o_b[None, :], mask=m_r[:, None] & (o_b == b)[None, :],
                       other=0.0)
        _imp_path(b_sp, _path_mask(npath, o_qi, m_r, b, b + 1, NBPP), b_lsafe, pp, o_qc, m_c, i_h, b, b + 1, s_un,
                  s_uh, CR, GP, NBPP)


@triton.jit
def nsa_route_topk_fwd_kernel(
    own, tail, pp, npath, nbpre, pos, idx,
    N, NBS, s_in, s_ih, s_un, s_uh, s_xn, s_xh,
    QC: tl.constexpr, LS: tl.constexpr, R: tl.constexpr, A: tl.constexpr, BJ: tl.constexpr, NSEL: tl.constexpr,
    NSELP: tl.constexpr, SORTED: tl.constexpr, FORCED_FIRST: tl.constexpr, FORCED_LOCAL: tl.constexpr,
    NBPP: tl.constexpr, NW: tl.constexpr, BT: tl.constexpr = 0,
    PDL: tl.constexpr = False,
):
    # two-sweep launch 3, grid (query chunks of QC, Hkv); rows of BJ blocks and a tail of BT
    pdl_prologue(PDL)
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    o_q = (i_n * QC + tl.arange(0, QC)).to(tl.int64)
    _topk_rows(own, tail, pp, npath, pos, idx, tl.load(nbpre), NBS, o_q, o_q < N, i_h, s_in, s_ih, s_un, s_uh,
               s_xn, s_xh, LS, R, A, BJ, NSEL, NSELP, SORTED, FORCED_FIRST, FORCED_LOCAL, NBPP, NW, BT)
