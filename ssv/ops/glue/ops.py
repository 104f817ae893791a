"""Launchers of the fused glue kernels (shapes checked here, launch sizes fixed by the shapes)."""
from __future__ import annotations

from typing import Optional

import torch
import triton

from ssv.ops.glue.kernels import rmsnorm_fwd_kernel, rmsnorm_pair_fwd_kernel, rope_write_fwd_kernel, swiglu_fwd_kernel
from ssv.ops.pdl import pdl_args


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float, out=None, rows=None) -> torch.Tensor:
    """x [N, D] -> RMSNorm(x) * w, one launch. rows [M] int64: normalise rows x[rows] instead (an
    embedding lookup and its norm in one launch). out [N or M, D]: written in place (e.g. a column
    range of a wider buffer, so that no concatenation follows); its dtype is the result's."""
    if x.dim() != 2 or x.stride(1) != 1 or w.shape != (x.shape[1],):
        raise ValueError(f"rmsnorm: x must be [N, D] with contiguous rows and w [D], got {tuple(x.shape)}, "
                         f"{tuple(w.shape)}")
    n, d = (x.shape[0] if rows is None else rows.numel()), x.shape[1]
    if out is None:
        out = torch.empty(n, d, device=x.device, dtype=x.dtype)
    elif out.shape != (n, d) or out.stride(1) != 1:
        raise ValueError(f"rmsnorm: out must be [{n}, {d}] with contiguous rows, got {tuple(out.shape)}")
    if rows is not None:
        rows = rows.contiguous()
    if n:
        rmsnorm_fwd_kernel[(n,)](x, w, out, out if rows is None else rows, float(eps), x.stride(0), out.stride(0),
                                 D=d, BD=triton.next_power_of_2(d), GATHER=rows is not None, num_warps=4,
                                 **pdl_args(x.device))
    return out


def rmsnorm_pair(x1: torch.Tensor, w1: torch.Tensor, eps1: float, rows: torch.Tensor, x2: torch.Tensor,
                 w2: torch.Tensor, eps2: float, out: torch.Tensor, rows2: Optional[torch.Tensor] = None,
                 raw: Optional[torch.Tensor] = None) -> torch.Tensor:
    """out [N, 2D] = [RMSNorm(x1[rows]) * w1 | RMSNorm(x2[rows2]) * w2] in one launch (`rmsnorm` twice,
    gathering rows [N] of x1 and, given rows2 [N], of x2): the EAGLE-3 layer's embedding and feature
    norms. x1 [V, D] and x2 [*, D] with contiguous rows (without rows2 x2 is [N, D], or a broadcast row),
    w1, w2 [D]. raw [N, D]: also receives the feature rows as they are (x2[rows2], or x2), which it must
    not overlap."""
    n, d = rows.numel(), x1.shape[-1]
    for name, t in (("x1", x1), ("x2", x2)) + ((("raw", raw),) if raw is not None else ()):
        if t.dim() != 2 or t.shape[1] != d or t.stride(1) != 1:
            raise ValueError(f"rmsnorm_pair: {name} must be [*, {d}] with contiguous rows, got {tuple(t.shape)}")
    if (rows2 is None and x2.shape[0] != n) or w1.shape != (d,) or w2.shape != (d,):
        raise ValueError(f"rmsnorm_pair: x2 must be [{n}, {d}] and w1, w2 [{d}], got {tuple(x2.shape)}, "
                         f"{tuple(w1.shape)}, {tuple(w2.shape)}")
    if rows2 is not None and rows2.shape != (n,):
        raise ValueError(f"rmsnorm_pair: rows2 must be [{n}], got {tuple(rows2.shape)}")
    if raw is not None and raw.shape[0] != n:
        raise ValueError(f"rmsnorm_pair: raw must be [{n}, {d}], got {tuple(raw.shape)}")
    if out.shape != (n, 2 * d) or out.stride(1) != 1:
        raise ValueError(f"rmsnorm_pair: out must be [{n}, {2 * d}] with contiguous rows, got {tuple(out.shape)}")
    if n:
        r2 = rows if rows2 is None else rows2.contiguous()     # not read without GATHER2
        rw = out if raw is None else raw                      # not written without RAW
        rmsnorm_pair_fwd_kernel[(n, 2)](x1, w1, rows.contiguous(), x2, w2, out, r2, rw, float(eps1), float(eps2),
                                        x1.stride(0), x2.stride(0), out.stride(0), rw.stride(0), D=d,
                                        BD=triton.next_power_of_2(d), GATHER2=rows2 is not None, RAW=raw is not None,
                                        num_warps=4, **pdl_args(x1.device))
    return out


def _norm_args(norm, n: int, device) -> tuple:
    """(x, eps) of a folded RMSNorm -> the kernels' (xn, s_xn, eps, NORM, DM, BDM)."""
    if norm is None:
        return None, 0, 0.0, dict(NORM=False, DM=1, BDM=1)
    x, eps = norm
    if x.dim() != 2 or x.shape[0] != n or x.stride(1) != 1 or x.device != device:
        raise ValueError(f"norm: the un-normalized input must be [{n}, D] with contiguous rows, got {tuple(x.shape)}")
    return x, x.stride(0), float(eps), dict(NORM=True, DM=x.shape[1], BDM=triton.next_power_of_2(x.shape[1]))


def rope_tables(cos: torch.Tensor, sin: torch.Tensor, pos: Optional[torch.Tensor], n: int, op: str) -> tuple:
    """cos / sin for n rows as the RoPE kernels read them: [n, D], [1, D] (one position for every row),
    or tables [P, D] read at rows pos [n] -> (cos, sin fp32 contiguous, pos contiguous or None, the
    row stride: 0 for a shared row)."""
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    if pos is not None:
        if pos.shape != (n,) or pos.dtype not in (torch.int32, torch.int64) or cos.shape != sin.shape:
            raise ValueError(f"{op}: pos must be [{n}] integer and cos / sin tables of one shape, got "
                             f"{tuple(pos.shape)} {pos.dtype}, {tuple(cos.shape)} / {tuple(sin.shape)}")
        return cos, sin, pos.contiguous(), cos.stride(0)
    if cos.shape != sin.shape or cos.shape[0] not in (1, n):
        raise ValueError(f"{op}: cos / sin must be [{n}, D] or [1, D], got {tuple(cos.shape)}")
    return cos, sin, None, cos.stride(0) if cos.shape[0] == n else 0


def rope_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, hq: int, hkv: int,
               k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, norm=None,
               pos: Optional[torch.Tensor] = None) -> torch.Tensor:
    """qkv [N, (Hq + 2 Hkv) D] (one projection) -> q [N, Hq, D] with RoPE; k (RoPE) and v stored at
    `slots` [N] of k_cache / v_cache [Hkv, L, D]. cos / sin [N, D], or [1, D] for one position
    shared by every row, or with pos [N] (int64) tables [P, D] whose rows pos[n] the kernel reads (the
    caller keeps pos < P). One launch instead of ~20. norm (x [N, Dm], eps): qkv projects the
    un-normalized x with the norm's weight folded into its columns; every row is first scaled by
    x's 1 / rms (the RMSNorm launch before the projection saved)."""
    n = qkv.shape[0]
    d = cos.shape[-1]
    if qkv.shape[1] != (hq + 2 * hkv) * d or qkv.stride(1) != 1 or d & (d - 1) or d < 2:
        raise ValueError(f"rope_write: qkv must be [N, (Hq + 2 Hkv) * D] with D a power of two, got "
                         f"{tuple(qkv.shape)} for Hq={hq}, Hkv={hkv}, D={d}")
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride() or k_cache.stride(2) != 1:
        raise ValueError("rope_write: k and v caches must share shape and strides, rows contiguous")
    cos, sin, pos, s_c = rope_tables(cos, sin, pos, n, "rope_write")
    slots = slots.contiguous()   # the kernel reads slots[n] at n: a strided column would be misread
    xn, s_xn, eps, nk = _norm_args(norm, n, qkv.device)
    q = torch.empty(n, hq, d, device=qkv.device, dtype=qkv.dtype)
    if n:
        rope_write_fwd_kernel[(n, hq + hkv)](qkv, cos, sin, slots, slots if pos is None else pos, q, k_cache,
                                              v_cache, qkv if xn is None else xn, qkv.stride(0), s_c, q.stride(0),
                                              q.stride(1), k_cache.stride(0), k_cache.stride(1), s_xn, eps, HQ=hq,
                                              HKV=hkv, D=d, POS=pos is not None, **nk, num_warps=1,
                                              **pdl_args(qkv.device))
    return q


def swiglu(gu: torch.Tensor, norm=None) -> torch.Tensor:
    """gu [N, 2I] (gate | up) -> silu(gate) * up [N, I], one launch. norm (x [N, Dm], eps): gu
    projects the un-normalized x (the norm's weight folded into the projection), so gate and up are
    first scaled by x's 1 / rms (the RMSNorm launch before the projection saved)."""
    if gu.dim() != 2 or gu.shape[1] % 2 or gu.stride(1) != 1:
        raise ValueError(f"swiglu: expected [N, 2I] with contiguous rows, got {tuple(gu.shape)}")
    n, i2 = gu.shape
    inter = i2 // 2
    xn, s_xn, eps, nk = _norm_args(norm, n, gu.device)
    y = torch.empty(n, inter, device=gu.device, dtype=gu.dtype)
    bi = min(1024, triton.next_power_of_2(inter))
    if n:
        swiglu_fwd_kernel[(n, triton.cdiv(inter, bi))](gu, y, gu if xn is None else xn, gu.stride(0), y.stride(0),
                                                       s_xn, eps, I=inter, BI=bi, **nk, num_warps=4,
                                                       **pdl_args(gu.device))
    return y
