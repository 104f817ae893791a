"""Kernels of dense tree verification (the dense baseline's attention): `dense_verify_fwd_kernel` (partial
softmax states of the KV splits, flash-decoding style) and `dense_verify_combine_kernel` (their merge).
The launcher is `ops.py`, the launch policy `policy.py`; the math is in README.md.

One program per (row tile, KV head, split). A row is one (query, query head of the KV head's GQA group):
every query of the step sees the whole committed prefix, so all N x G rows of a KV head share each K/V
tile, and the rows sit on the MMA's M side (the per-query NSA kernel's C = 1 form reads every tile once a
query). Splits 0..NS-1 take equal ranges of the prefix [0, P); split NS takes the step's own tokens
[P, P + N) under the tree's ancestor mask.
"""
import triton
import triton.language as tl

from ssv.ops.pdl import l2_prefetch_span, pdl_prologue
from ssv.ops.softmax import online_softmax as _online


@triton.jit
def _split_range(P, i_s, NS, BN: tl.constexpr):
    # prefix split i_s of NS: whole BN-key tiles, [lo, hi) (empty past the prefix)
    KPS = tl.cdiv(tl.cdiv(tl.maximum(P, 1), NS), BN) * BN
    lo = i_s * KPS
    return lo, tl.minimum(lo + KPS, P)


@triton.jit
def _l2_prefetch_split(kbase, vbase, plen, i_s, NS, part, parts, s_kt, BN: tl.constexpr, D: tl.constexpr,
                       PF: tl.constexpr, PDL: tl.constexpr):
    # under PDL, before the wait: the first PF keys and values of prefix split i_s into L2 while the previous
    # kernel runs (the row tiles of a (head, split), part of parts, share them out). The length read here
    # forms addresses only (no kernel of the step writes it; a stale one could cost a miss, never a result)
    if PDL:
        if PF > 0 and i_s < NS:
            lo, hi = _split_range(tl.load(plen), i_s, NS, BN)
            l2_prefetch_span(kbase, lo, tl.minimum(lo + PF, hi), s_kt, part, parts, D, PDL)
            l2_prefetch_span(vbase, lo, tl.minimum(lo + PF, hi), s_kt, part, parts, D, PDL)


@triton.jit
def dense_verify_fwd_kernel(
    q, k, v, kd, vd, plen, tm, ws_m, ws_l, ws_a,
    N, qk_scale, s_qn, s_qh, s_kh, s_kt, s_tm, HQ,
    G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, D: tl.constexpr,
    TMA: tl.constexpr, PF: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # grid (row tiles of BM (query, head) rows, Hkv, NS + 1). qk_scale folds log2(e): base-2 scores.
    # The split ranges come from the prefix length in device memory, so the grid is the cache
    # capacity's and a captured graph replays at any length; splits past the prefix store empty states
    i_r, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NS = tl.num_programs(2) - 1
    kbase = k + i_h.to(tl.int64) * s_kh
    vbase = v + i_h.to(tl.int64) * s_kh
    _l2_prefetch_split(kbase, vbase, plen, i_s, NS, i_r, tl.num_programs(0), s_kt, BN, D, PF, PDL)
    pdl_prologue(PDL)
    P = tl.load(plen)
    lo, hi = _split_range(P, i_s, NS, BN)
    o_r = i_r * BM + tl.arange(0, BM)
    o_i = o_r // G                                   # query
    o_hq = i_h * G + o_r % G                         # its head
    m_r = o_i < N
    o_d = tl.arange(0, D)
    p_q = q + o_i.to(tl.int64)[:, None] * s_qn + o_hq[:, None] * s_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_r[:, None], other=0.0)                                   # [BM, D]
    b_m = tl.full([BM], float("-inf"), tl.float32)
    b_l = tl.zeros([BM], tl.float32)
    b_acc = tl.zeros([BM, D], tl.float32)
    if i_s < NS:
        for t0 in range(lo, hi, BN):
            o_t = t0 + tl.arange(0, BN)
            m_t = o_t < hi
            if TMA:
                # the descriptors span the cache: rows past the prefix are finite and masked here
                b_k = kd.load([i_h, t0, 0]).reshape(BN, D)
                b_v = vd.load([i_h, t0, 0]).reshape(BN, D)
            else:
                p_t = o_t.to(tl.int64)[:, None] * s_kt + o_d[None, :]
                b_k = tl.load(kbase + p_t, mask=m_t[:, None], other=0.0)
                b_v = tl.load(vbase + p_t, mask=m_t[:, None], other=0.0)
            b_s = tl.dot(b_q, tl.trans(b_k), input_precision="ieee") * qk_scale      # [BM, BN]
            b_m, b_l, b_acc = _online(b_s, m_t[None, :], b_v, b_m, b_l, b_acc)
    else:
        # the step's tokens: query i sees token j where its ancestor mask says so
        o_j = tl.arange(0, BT)
        m_j = o_j < N
        p_t = (P + o_j).to(tl.int64)[:, None] * s_kt + o_d[None, :]
        b_k = tl.load(kbase + p_t, mask=m_j[:, None], other=0.0)                        # [BT, D]
        b_v = tl.load(vbase + p_t, mask=m_j[:, None], other=0.0)
        b_vis = tl.load(tm + o_i.to(tl.int64)[:, None] * s_tm + o_j[None, :],
                        mask=m_r[:, None] & m_j[None, :], other=0) != 0                # [BM, BT]
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision="ieee") * qk_scale
        b_m, b_l, b_acc = _online(b_s, b_vis, b_v, b_m, b_l, b_acc)
    p_st = (i_s * N + o_i).to(tl.int64) * HQ + o_hq                                     # [BM]
    tl.store(ws_m + p_st, b_m, mask=m_r)
    tl.store(ws_l + p_st, b_l, mask=m_r)
    tl.store(ws_a + p_st[:, None] * D + o_d[None, :], b_acc, mask=m_r[:, None])


@triton.jit
def dense_verify_combine_kernel(
    ws_m, ws_l, ws_a, out, N, NSPLIT, HQ, s_on, s_oh,
    NSP: tl.constexpr, D: tl.constexpr, SC: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # grid (N * Hq): one (query, head) row merges the NSPLIT states (-inf, 0, 0 where a split saw nothing)
    pdl_prologue(PDL)
    i_row = tl.program_id(0)
    o_sp = tl.arange(0, NSP)
    m_sp = o_sp < NSPLIT
    o_d = tl.arange(0, D)
    p_st = o_sp.to(tl.int64) * N * HQ + i_row                                          # [NSP]
    b_m = tl.load(ws_m + p_st, mask=m_sp, other=float("-inf"))
    b_mx = tl.max(b_m, 0)
    b_mx = tl.where(b_mx == float("-inf"), 0.0, b_mx)   # every split empty: weights 0, not NaN
    b_w = tl.exp2(b_m - b_mx)                                                          # [NSP]
    b_l = tl.sum(b_w * tl.load(ws_l + p_st, mask=m_sp, other=0.0), 0)
    # the values SC splits at a time (policy.merge_chunk: one tile where it fits the registers)
    b_o = tl.zeros([D], tl.float32)
    for s0 in range(0, NSPLIT, SC):
        o_c = s0 + tl.arange(0, SC)
        m_c = o_c < NSPLIT
        p_c = o_c.to(tl.int64) * N * HQ + i_row                                            # [SC]
        b_wc = tl.exp2(tl.load(ws_m + p_c, mask=m_c, other=float("-inf")) - b_mx)
        b_o += tl.sum(b_wc[:, None] * tl.load(ws_a + p_c[:, None] * D + o_d[None, :], mask=m_c[:, None], other=0.0), 0)
    b_o = b_o / b_l
    i_n, i_q = i_row // HQ, i_row % HQ
    tl.store(out + i_n.to(tl.int64) * s_on + i_q * s_oh + o_d, b_o.to(out.dtype.element_ty))
