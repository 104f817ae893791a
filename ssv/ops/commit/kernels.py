"""Triton kernel of the device commit."""
from __future__ import annotations

import triton
import triton.language as tl

from ssv.ops.pdl import pdl_prologue


@triton.jit
def kv_commit_fwd_kernel(
    k, v, cmp, dlen, path, n_acc, T, NB, s_kl, s_kh, s_kt, s_cx, s_cl, s_ch, s_cb, H,
    R: tl.constexpr, D: tl.constexpr, L_CMP: tl.constexpr, BL: tl.constexpr, STRIDE: tl.constexpr,
    M: tl.constexpr, NSA: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # one program per (layer, KV head): the accepted rows moved down in increasing order (row i
    # reads P + path[i] >= P + i, and no later row reads P + i since path is strictly increasing),
    # then, after a barrier, the compressed blocks the new rows complete, read back from the cache
    pdl_prologue(PDL)
    i_lh = tl.program_id(0).to(tl.int64)
    i_l, i_h = i_lh // H, i_lh % H
    P = tl.load(dlen).to(tl.int64)
    n = tl.load(n_acc).to(tl.int64)
    o_d = tl.arange(0, D)
    p_k = k + i_l * s_kl + i_h * s_kh
    p_v = v + i_l * s_kl + i_h * s_kh
    for i in range(R):
        src = P + tl.maximum(tl.load(path + i).to(tl.int64), 0)
        dst = P + i
        m = (o_d < D) & (i < n) & (src != dst)
        tl.store(p_k + dst * s_kt + o_d, tl.load(p_k + src * s_kt + o_d, mask=m), mask=m)
        tl.store(p_v + dst * s_kt + o_d, tl.load(p_v + src * s_kt + o_d, mask=m), mask=m)
    if NSA:
        tl.debug_barrier()
        new = P + n
        nb0 = tl.where(P >= L_CMP, (P - L_CMP) // STRIDE + 1, 0)
        nb1 = tl.where(new >= L_CMP, (new - L_CMP) // STRIDE + 1, 0)
        o_s = tl.arange(0, BL)
        for mb in range(M):
            b = nb0 + mb
            slot = tl.minimum(b * STRIDE + o_s, T - 1)
            m_b = (o_s < L_CMP)[:, None] & (b < nb1) & (b < NB)
            p_t = slot[:, None] * s_kt + o_d[None, :]
            b_k = tl.load(p_k + p_t, mask=m_b, other=0.0).to(tl.float32)                 # [BL, D]
            b_v = tl.load(p_v + p_t, mask=m_b, other=0.0).to(tl.float32)
            p_c = cmp + i_l * s_cl + i_h * s_ch + b * s_cb + o_d
            m_c = (o_d < D) & (b < nb1) & (b < NB)
            tl.store(p_c, (tl.sum(b_k, 0) / L_CMP).to(cmp.dtype.element_ty), mask=m_c)
            tl.store(p_c + s_cx, (tl.sum(b_v, 0) / L_CMP).to(cmp.dtype.element_ty), mask=m_c)


@triton.jit
def kv_advance_fwd_kernel(dlen, n_acc, hist, tokens, M, L, HIST: tl.constexpr, BM: tl.constexpr,
                          PDL: tl.constexpr = False):
    # after the commit's programs have all read the old length: the length advanced and (HIST) the
    # tokens after the accepted rows put in the text by position, in one program (where a cast, an
    # add, a position row and a scatter were four launches or more)
    pdl_prologue(PDL)
    P = tl.load(dlen).to(tl.int64)
    if HIST:
        o_m = tl.arange(0, BM)
        m_m = o_m < M
        p_at = tl.minimum(P + 1 + o_m, L - 1)
        tl.store(hist + p_at, tl.load(tokens + o_m, mask=m_m), mask=m_m)
    tl.store(dlen, (P + tl.load(n_acc).to(tl.int64)).to(dlen.dtype.element_ty))
