"""Triton kernel of the small-M linear (math in this folder's README.md, launches in ops.py / policy.py)."""
from __future__ import annotations

import triton
import triton.language as tl

from ssv.ops.pdl import l2_prefetch_rows, pdl_prologue


@triton.jit
def _row_rsqrt(p_x, m_m, eps, K: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr):
    # the folded RMSNorm's row scale [BM, 1] from the rows (cache-hot by now) in a loop of its own:
    # no cross-thread sum inside the weights' pipelined loop
    b_ss = tl.zeros([BM], tl.float32)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        b_xf = tl.load(p_x + o_k[None, :], mask=m_m[:, None] & (o_k < K)[None, :], other=0.0).to(tl.float32)
        b_ss += tl.sum(b_xf * b_xf, 1)
    return tl.math.rsqrt(b_ss / K + eps)[:, None]


@triton.jit
def _dot_pair(p_x, p_a, p_b, m_m, m_n, K: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              TWO: tl.constexpr):
    # x[BM, :] @ a[BN, :].T and (TWO) x @ b[BN, :].T over K in BK chunks, each x chunk loaded once for
    # both: GLU's gate and up rows, or a head's two RoPE halves
    b_a = tl.zeros([BM, BN], tl.float32)
    b_b = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        b_x = tl.load(p_x + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0.0)         # [BM, BK]
        m_w = m_n[:, None] & m_k[None, :]
        b_w = tl.load(p_a + o_k[None, :], mask=m_w, other=0.0)                                  # [BN, BK]
        b_a += tl.dot(b_x, tl.trans(b_w), input_precision="ieee")                              # [BM, BN]
        if TWO:
            b_wb = tl.load(p_b + o_k[None, :], mask=m_w, other=0.0)
            b_b += tl.dot(b_x, tl.trans(b_wb), input_precision="ieee")
    return b_a, b_b


@triton.jit
def linear_fwd_kernel(x, w, y, y2, M, N, s_xm, s_wn, s_ym, s_y2m, eps, K: tl.constexpr, BM: tl.constexpr,
                      BN: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr, GLU: tl.constexpr, ACC: tl.constexpr,
                      OUT2: tl.constexpr = False, PDL: tl.constexpr = False):
    # program (column tile, row tile): y[BM, BN] = x[BM, :] @ w[BN, :].T over K in BK chunks on the
    # tensor cores, rows padded to 16 (one decode row wastes MMA rows, not bytes: the weights'
    # tiles are what streams, pipelined through shared memory). Under PDL the weights' tile is
    # prefetched into L2 before the wait, while the previous kernel runs: the loop then streams it
    # from L2, not from DRAM
    i_n, i_m = tl.program_id(0), tl.program_id(1)
    o_n = i_n * BN + tl.arange(0, BN)
    l2_prefetch_rows(w + tl.minimum(o_n, N - 1).to(tl.int64) * s_wn, K, PDL)
    if GLU:
        l2_prefetch_rows(w + (tl.minimum(o_n, N - 1) + N).to(tl.int64) * s_wn, K, PDL)
    pdl_prologue(PDL)
    o_m = i_m * BM + tl.arange(0, BM)
    m_m, m_n = o_m < M, o_n < N
    p_x = x + o_m.to(tl.int64)[:, None] * s_xm
    p_g = w + o_n.to(tl.int64)[:, None] * s_wn
    p_u = w + (o_n + N).to(tl.int64)[:, None] * s_wn       # GLU: the up rows follow the N gate rows
    b_g, b_u = _dot_pair(p_x, p_g, p_u, m_m, m_n, K, BK, BM, BN, GLU)
    if NORM:
        b_r = _row_rsqrt(p_x, m_m, eps, K, BK, BM)
        b_g, b_u = b_g * b_r, b_u * b_r
    if GLU:    # silu rounded to the activations' dtype before the product, as F.silu(g) * u
        b_g = (b_g * tl.sigmoid(b_g)).to(y.dtype.element_ty).to(tl.float32) * b_u
    p_y = y + o_m.to(tl.int64)[:, None] * s_ym + o_n[None, :]
    m_y = m_m[:, None] & m_n[None, :]
    if ACC:    # the residual, added in fp32 and rounded once (as addmm_)
        b_g += tl.load(p_y, mask=m_y, other=0.0).to(tl.float32)
    b_y = b_g.to(y.dtype.element_ty)
    tl.store(p_y, b_y, mask=m_y)
    if OUT2:   # the same values to a second place (a layer's output tapped for the drafter)
        tl.store(y2 + o_m.to(tl.int64)[:, None] * s_y2m + o_n[None, :], b_y, mask=m_y)


@triton.jit
def linear_rope_fwd_kernel(x, w, cos, sin, slots, pos, q_out, kc, vc, M, s_xm, s_wn, s_c, s_qn, s_qh, s_kh, s_kt, eps,
                           K: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
                           BN: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr, POS: tl.constexpr,
                           PDL: tl.constexpr = False):
    # program (head block, row tile) of a q|k|v projection: the columns [c, c + BN) of one head's first
    # half and their rotate-half partners [c + D/2, ...) in two accumulators, so RoPE needs no other
    # program's columns; then q to q_out, k and v to the cache rows slots[m] (rope_write's stores).
    # The weights' rows are prefetched into L2 before the PDL wait, as linear_fwd_kernel's
    HALF: tl.constexpr = D // 2
    NB: tl.constexpr = HALF // BN
    i_u, i_m = tl.program_id(0), tl.program_id(1)
    i_h, i_j = i_u // NB, i_u % NB          # head among the Hq + 2 Hkv, block within its first half
    o_c = i_j * BN + tl.arange(0, BN)
    p_w1 = w + (i_h * D + o_c).to(tl.int64) * s_wn                                  # [BN]
    l2_prefetch_rows(p_w1, K, PDL)
    l2_prefetch_rows(p_w1 + HALF * s_wn, K, PDL)
    pdl_prologue(PDL)
    o_m = i_m * BM + tl.arange(0, BM)
    m_m = o_m < M
    p_x = x + o_m.to(tl.int64)[:, None] * s_xm
    p_1 = p_w1[:, None]
    p_2 = p_1 + HALF * s_wn
    # the epilogue's operands (positions, cos / sin, slots) loaded before the weights' loop, so that
    # their latency hides under it rather than following it
    if POS:    # cos / sin tables by position: each row's own
        i_c = tl.load(pos + o_m, mask=m_m, other=0).to(tl.int64)
    else:
        i_c = o_m.to(tl.int64)
    p_c = i_c[:, None] * s_c + o_c[None, :]
    m_c = m_m[:, None]
    b_c1 = tl.load(cos + p_c, mask=m_c, other=0.0)
    b_s1 = tl.load(sin + p_c, mask=m_c, other=0.0)
    b_c2 = tl.load(cos + p_c + HALF, mask=m_c, other=0.0)
    b_s2 = tl.load(sin + p_c + HALF, mask=m_c, other=0.0)
    t = tl.load(slots + o_m, mask=m_m, other=0).to(tl.int64)
    b_1, b_2 = _dot_pair(p_x, p_1, p_2, m_m, tl.full([BN], 1, tl.int1), K, BK, BM, BN, True)   # every column valid
    if NORM:
        b_r = _row_rsqrt(p_x, m_m, eps, K, BK, BM)
        b_1, b_2 = b_1 * b_r, b_2 * b_r
    if i_h < HQ:
        p_q = q_out + o_m.to(tl.int64)[:, None] * s_qn + i_h.to(tl.int64) * s_qh + o_c[None, :]
        tl.store(p_q, (b_1 * b_c1 - b_2 * b_s1).to(q_out.dtype.element_ty), mask=m_c)
        tl.store(p_q + HALF, (b_2 * b_c2 + b_1 * b_s2).to(q_out.dtype.element_ty), mask=m_c)
    else:
        if i_h < HQ + HKV:
            p_k = kc + (i_h - HQ).to(tl.int64) * s_kh + t[:, None] * s_kt + o_c[None, :]
            tl.store(p_k, (b_1 * b_c1 - b_2 * b_s1).to(kc.dtype.element_ty), mask=m_c)
            tl.store(p_k + HALF, (b_2 * b_c2 + b_1 * b_s2).to(kc.dtype.element_ty), mask=m_c)
        else:
            p_v = vc + (i_h - HQ - HKV).to(tl.int64) * s_kh + t[:, None] * s_kt + o_c[None, :]
            tl.store(p_v, b_1.to(vc.dtype.element_ty), mask=m_c)
            tl.store(p_v + HALF, b_2.to(vc.dtype.element_ty), mask=m_c)
