"""Plain-PyTorch twin of the small-M linear kernel: the same math in fp32, rounded once at the end."""
from __future__ import annotations

from typing import Optional

import torch
from torch.nn import functional as F

from ssv.ops.glue.naive import row_rsqrt


def linear_naive(x: torch.Tensor, w: torch.Tensor, out: Optional[torch.Tensor] = None, accumulate: bool = False,
                 norm_eps: Optional[float] = None, glu: bool = False) -> torch.Tensor:
    """y = x @ w.T in fp32 with, in order:
    norm_eps: each row scaled by rsqrt(mean(x^2) + eps) of x's own row (an RMSNorm whose weight is
      folded into w, `ssv.ops.glue.naive.fold_norm`);
    glu: w is [gate | up] [2N, K]: y = silu(g).to(dtype) * u, [M, N] (SwiGLU's roundings);
    accumulate: y += out (a residual, added in fp32 and rounded once, as addmm_).
    Written into out when given (its dtype), else returned in x's dtype."""
    xf = x.float()
    a = xf @ w.float().T
    if norm_eps is not None:
        a = a * row_rsqrt(xf, norm_eps)
    dt = x.dtype if out is None else out.dtype
    if glu:
        g, u = a.chunk(2, -1)
        a = F.silu(g).to(dt).float() * u
    if accumulate:
        a = a + out.float()
    if out is None:
        return a.to(dt)
    out.copy_(a)
    return out


def linear_rope_naive(x: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, hq: int, hkv: int,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                      norm_eps: Optional[float] = None, pos: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The q|k|v projection with its RoPE and cache writes, rounded once: a = x @ w.T in fp32 (each row
    scaled by its 1 / rms with norm_eps), rotate-half RoPE on the q and k heads in fp32 (cos / sin
    [N, D], [1, D], or tables [P, D] read at rows pos [N]), then q [N, Hq, D] returned in x's dtype and
    k, v stored at `slots` of k_cache / v_cache [Hkv, L, D] (`ssv.ops.glue.naive.rope_write_naive`
    on the unrounded product)."""
    from ssv.ops.glue.naive import rope_write_naive
    a = linear_naive(x.float(), w.float(), norm_eps=norm_eps)
    kf, vf = k_cache.float(), v_cache.float()
    q = rope_write_naive(a, cos.float(), sin.float(), hq, hkv, kf, vf, slots, pos=pos)
    k_cache.index_copy_(1, slots, kf[:, slots].to(k_cache.dtype))
    v_cache.index_copy_(1, slots, vf[:, slots].to(v_cache.dtype))
    return q.to(x.dtype)
