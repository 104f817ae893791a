"""Triton kernel of the small-M linear (math in this folder's README.md, launches in ops.py / policy.py)."""
from __future__ import annotations

import triton
import triton.language as tl

from ssv.ops.pdl import pdl_prologue


@triton.jit
def linear_fwd_kernel(x, w, y, M, N, s_xm, s_wn, s_ym, eps, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                      BK: tl.constexpr, NORM: tl.constexpr, GLU: tl.constexpr, ACC: tl.constexpr,
                      PDL: tl.constexpr = False):
    # program (column tile, row tile): y[BM, BN] = x[BM, :] @ w[BN, :].T over K in BK chunks on the
    # tensor cores, rows padded to 16 (one decode row wastes MMA rows, not bytes: the weights'
    # tiles are what streams, pipelined through shared memory)
    pdl_prologue(PDL)
    i_n, i_m = tl.program_id(0), tl.program_id(1)
    o_m = i_m * BM + tl.arange(0, BM)
    o_n = i_n * BN + tl.arange(0, BN)
    m_m, m_n = o_m < M, o_n < N
    p_x = x + o_m.to(tl.int64)[:, None] * s_xm
    p_g = w + o_n.to(tl.int64)[:, None] * s_wn
    p_u = w + (o_n + N).to(tl.int64)[:, None] * s_wn       # GLU: the up rows follow the N gate rows
    b_ss = tl.zeros([BM], tl.float32)
    b_g = tl.zeros([BM, BN], tl.float32)
    b_u = tl.zeros([BM, BN], tl.float32)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        b_x = tl.load(p_x + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0.0)         # [BM, BK]
        m_w = m_n[:, None] & m_k[None, :]
        b_w = tl.load(p_g + o_k[None, :], mask=m_w, other=0.0)                                  # [BN, BK]
        b_g += tl.dot(b_x, tl.trans(b_w), input_precision="ieee")                              # [BM, BN]
        if GLU:
            b_wu = tl.load(p_u + o_k[None, :], mask=m_w, other=0.0)
            b_u += tl.dot(b_x, tl.trans(b_wu), input_precision="ieee")
    if NORM:
        # the folded RMSNorm's row scale, from the rows (cache-hot by now) in a loop of its own: no
        # cross-thread sum inside the weights' pipelined loop
        for k0 in range(0, K, BK):
            o_k = k0 + tl.arange(0, BK)
            b_xf = tl.load(p_x + o_k[None, :], mask=m_m[:, None] & (o_k < K)[None, :], other=0.0).to(tl.float32)
            b_ss += tl.sum(b_xf * b_xf, 1)
        b_r = tl.math.rsqrt(b_ss / K + eps)[:, None]
        b_g, b_u = b_g * b_r, b_u * b_r
    if GLU:    # silu rounded to the activations' dtype before the product, as F.silu(g) * u
        b_g = (b_g * tl.sigmoid(b_g)).to(y.dtype.element_ty).to(tl.float32) * b_u
    p_y = y + o_m.to(tl.int64)[:, None] * s_ym + o_n[None, :]
    m_y = m_m[:, None] & m_n[None, :]
    if ACC:    # the residual, added in fp32 and rounded once (as addmm_)
        b_g += tl.load(p_y, mask=m_y, other=0.0).to(tl.float32)
    tl.store(p_y, b_g.to(y.dtype.element_ty), mask=m_y)
