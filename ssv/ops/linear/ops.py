"""Launcher of the small-M linear kernel (shapes checked here, tiles from policy.py)."""
from __future__ import annotations

from typing import Optional

import torch
import triton

from ssv.ops.linear.kernels import linear_fwd_kernel
from ssv.ops.linear.policy import LinearLaunch, default_launch
from ssv.ops.pdl import pdl as pdl_enabled


def linear(x: torch.Tensor, w: torch.Tensor, out: Optional[torch.Tensor] = None, accumulate: bool = False,
           norm_eps: Optional[float] = None, glu: bool = False, launch: Optional[LinearLaunch] = None,
           pdl: Optional[bool] = None) -> torch.Tensor:
    """x [M, K] @ w.T in one launch, w [N, K] ([2N, K] gate | up for glu); the math is `linear_naive`'s:
    norm_eps scales each row by x's own 1 / rms (an RMSNorm folded into w), glu gives silu(g) * u
    [M, N], accumulate adds into out (a residual, in place). out [M, N] may be a view with
    contiguous rows; without it a new tensor in x's dtype. pdl: programmatic dependent launch (CUDA,
    Hopper or newer; None: as every kernel of the step, `ssv.ops.pdl.pdl(x.device)`; False: a plain
    launch, which `scripts/probe_linear.py --pdl` times against)."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"linear: x must be [M, K] and w [N, K] with contiguous rows, got {tuple(x.shape)} and "
                         f"{tuple(w.shape)}")
    m, k = x.shape
    n = w.shape[0]
    if glu:
        if n % 2:
            raise ValueError(f"linear: glu needs w as [gate | up] with an even row count, got {n}")
        n //= 2
    if accumulate and out is None:
        raise ValueError("linear: accumulate adds into out, which was not given")
    if out is None:
        out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    elif out.shape != (m, n) or out.stride(1) != 1:
        raise ValueError(f"linear: out must be [{m}, {n}] with contiguous rows, got {tuple(out.shape)}")
    lp = default_launch(m, k) if launch is None else launch
    if any(t < 16 or t & (t - 1) for t in (lp.bm, lp.bn, lp.bk)) or lp.warps < 1 or lp.stages < 1:
        raise ValueError(f"linear: tiles must be powers of two >= 16 (tl.dot), got {lp}")
    pdl = pdl_enabled(x.device) if pdl is None else pdl
    if pdl and not pdl_enabled(x.device):
        raise ValueError("linear: pdl (programmatic dependent launch) needs a CUDA device of compute capability >= 9, "
                         "not the interpreter")
    if m and n:
        linear_fwd_kernel[(triton.cdiv(n, lp.bn), triton.cdiv(m, lp.bm))](
            x, w, out, m, n, x.stride(0), w.stride(0), out.stride(0), 0.0 if norm_eps is None else float(norm_eps),
            K=k, BM=lp.bm, BN=lp.bn, BK=lp.bk, NORM=norm_eps is not None, GLU=glu, ACC=accumulate, PDL=pdl,
            num_warps=lp.warps, num_stages=lp.stages, **({"launch_pdl": True} if pdl else {}))
    return out
