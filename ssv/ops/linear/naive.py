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
