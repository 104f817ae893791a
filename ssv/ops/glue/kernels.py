"""Triton kernels of the fused glue: one program per row (a decode step has few rows)."""
from __future__ import annotations

import triton
import triton.language as tl

from ssv.ops.pdl import pdl_prologue


@triton.jit
def _rmsnorm_row(x_row, w, y_row, eps, D: tl.constexpr, BD: tl.constexpr, raw_row=None, RAW: tl.constexpr = False):
    # RAW: the input row is also copied as it is to raw_row
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    b_xr = tl.load(x_row + o_d, mask=m_d, other=0.0)
    if RAW:
        tl.store(raw_row + o_d, b_xr, mask=m_d)
    b_x = b_xr.to(tl.float32)
    b_r = tl.math.rsqrt(tl.sum(b_x * b_x, 0) / D + eps)
    # normalized in fp32, rounded to the activations' dtype, then scaled (as RMSNorm.forward does)
    b_n = (b_x * b_r).to(y_row.dtype.element_ty).to(tl.float32)
    b_w = tl.load(w + o_d, mask=m_d, other=0.0).to(tl.float32)
    tl.store(y_row + o_d, (b_n * b_w).to(y_row.dtype.element_ty), mask=m_d)


@triton.jit
def rmsnorm_fwd_kernel(x, w, y, rows, eps, s_x, s_y, D: tl.constexpr, BD: tl.constexpr, GATHER: tl.constexpr,
                       PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    i = tl.program_id(0).to(tl.int64)
    # GATHER: output row i normalises input row rows[i] (an embedding lookup folded in)
    i_x = tl.load(rows + i).to(tl.int64) if GATHER else i
    _rmsnorm_row(x + i_x * s_x, w, y + i * s_y, eps, D, BD)


@triton.jit
def rmsnorm_pair_fwd_kernel(x1, w1, rows, x2, w2, y, rows2, raw, eps1, eps2, s_x1, s_x2, s_y, s_raw,
                            D: tl.constexpr, BD: tl.constexpr, GATHER2: tl.constexpr, RAW: tl.constexpr,
                            PDL: tl.constexpr = False):
    # program (row i, half j): y[i, :D] = RMSNorm_1(x1[rows[i]]), y[i, D:] = RMSNorm_2(x2[r]) (the
    # EAGLE-3 layer's two input norms: a token's embedding row and a feature, one launch), r =
    # rows2[i] with GATHER2 (a node's parent feature) else i; RAW: raw[i] = x2[r] too (the layer's
    # residual, which it adds into in place: no gather or copy launch of its own)
    pdl_prologue(PDL)
    i = tl.program_id(0).to(tl.int64)
    if tl.program_id(1) == 0:
        _rmsnorm_row(x1 + tl.load(rows + i).to(tl.int64) * s_x1, w1, y + i * s_y, eps1, D, BD)
    else:
        i_2 = tl.load(rows2 + i).to(tl.int64) if GATHER2 else i
        _rmsnorm_row(x2 + i_2 * s_x2, w2, y + i * s_y + D, eps2, D, BD, raw + i * s_raw, RAW)


@triton.jit
def _row_rsqrt(xn, i_n, s_xn, eps, DM: tl.constexpr, BDM: tl.constexpr):
    # 1 / rms of row i_n of the layer's input: an RMSNorm folded into the GEMM before this kernel
    # (its weight multiplied into the GEMM's columns, the row scale applied here)
    o_m = tl.arange(0, BDM)
    b_x = tl.load(xn + i_n * s_xn + o_m, mask=o_m < DM, other=0.0).to(tl.float32)
    return tl.math.rsqrt(tl.sum(b_x * b_x, 0) / DM + eps)


@triton.jit
def rope_write_fwd_kernel(qkv, cos, sin, slots, pos, q_out, kc, vc, xn, s_n, s_c, s_qn, s_qh, s_kh, s_kt, s_xn, eps,
                          HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, NORM: tl.constexpr,
                          DM: tl.constexpr, BDM: tl.constexpr, POS: tl.constexpr, PDL: tl.constexpr = False):
    # program (row n, head h) over Hq + Hkv heads: a query head is rotated into q_out, a KV head's
    # key rotated and its value copied into cache slot slots[n] (POS: cos / sin rows pos[n] of a
    # table); NORM: the projection was of the
    # un-normalized row xn[n], scaled here by its 1 / rms first
    pdl_prologue(PDL)
    i_n, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    HALF: tl.constexpr = D // 2
    o_d = tl.arange(0, D)
    o_r = tl.where(o_d < HALF, o_d + HALF, o_d - HALF)          # rotate-half partner
    sign = tl.where(o_d < HALF, -1.0, 1.0)
    if POS:     # cos / sin are tables by position: the row's own
        i_c = tl.load(pos + i_n).to(tl.int64)
    else:
        i_c = i_n
    b_c = tl.load(cos + i_c * s_c + o_d)
    b_s = tl.load(sin + i_c * s_c + o_d)
    base = qkv + i_n * s_n + i_h * D
    b_x = tl.load(base + o_d).to(tl.float32)
    b_p = tl.load(base + o_r).to(tl.float32) * sign
    if NORM:
        b_r = _row_rsqrt(xn, i_n, s_xn, eps, DM, BDM)
        b_x, b_p = b_x * b_r, b_p * b_r
    b_o = (b_x * b_c + b_p * b_s).to(q_out.dtype.element_ty)
    if i_h < HQ:
        tl.store(q_out + i_n * s_qn + i_h * s_qh + o_d, b_o)
    else:
        t = tl.load(slots + i_n).to(tl.int64)
        j = i_h - HQ
        p_c = j * s_kh + t * s_kt + o_d
        tl.store(kc + p_c, b_o.to(kc.dtype.element_ty))
        b_v = tl.load(base + HKV * D + o_d)
        if NORM:
            b_v = b_v.to(tl.float32) * b_r
        tl.store(vc + p_c, b_v.to(vc.dtype.element_ty))


@triton.jit
def swiglu_fwd_kernel(gu, y, xn, s_g, s_y, s_xn, eps, I: tl.constexpr, BI: tl.constexpr, NORM: tl.constexpr,
                      DM: tl.constexpr, BDM: tl.constexpr, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    i_n, i_b = tl.program_id(0).to(tl.int64), tl.program_id(1)
    o_i = i_b * BI + tl.arange(0, BI)
    m_i = o_i < I
    b_g = tl.load(gu + i_n * s_g + o_i, mask=m_i, other=0.0).to(tl.float32)
    b_u = tl.load(gu + i_n * s_g + I + o_i, mask=m_i, other=0.0).to(tl.float32)
    if NORM:   # the gate|up projection was of the un-normalized row xn[n]
        b_r = _row_rsqrt(xn, i_n, s_xn, eps, DM, BDM)
        b_g, b_u = b_g * b_r, b_u * b_r
    # silu rounded to the activations' dtype before the product, as F.silu(g) * u
    b_a = (b_g * tl.sigmoid(b_g)).to(y.dtype.element_ty).to(tl.float32)
    tl.store(y + i_n * s_y + o_i, (b_a * b_u).to(y.dtype.element_ty), mask=m_i)
