"""Launcher of the small-M linear kernel (shapes checked here, tiles from policy.py)."""
from __future__ import annotations

from typing import Optional

import torch
import triton

from ssv.ops.glue.ops import rope_tables
from ssv.ops.linear.kernels import linear_fwd_kernel, linear_rope_fwd_kernel
from ssv.ops.linear.policy import LinearLaunch, default_launch
from ssv.ops.pdl import pdl as pdl_enabled


def _check_rows(x: torch.Tensor, w: torch.Tensor, op: str) -> None:
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"{op}: x must be [M, K] and w [N, K] with contiguous rows, got {tuple(x.shape)} and "
                         f"{tuple(w.shape)}")


def _launch_args(lp: LinearLaunch, pdl: Optional[bool], device, op: str, half: Optional[int] = None) -> bool:
    """Checks the tiles (powers of two >= 16, tl.dot's; half: the column tile must divide it) and
    resolves pdl (None: as every kernel of the step)."""
    if any(t < 16 or t & (t - 1) for t in (lp.bm, lp.bn, lp.bk)) or (half is not None and half % lp.bn) \
            or lp.warps < 1 or lp.stages < 1:
        extra = "" if half is None else f" with the column tile dividing D / 2 = {half}"
        raise ValueError(f"{op}: tiles must be powers of two >= 16{extra}, got {lp}")
    on = pdl_enabled(device) if pdl is None else pdl
    if on and not pdl_enabled(device):
        raise ValueError(f"{op}: pdl (programmatic dependent launch) needs a CUDA device of compute capability >= 9, "
                         "not the interpreter")
    return on


def linear(x: torch.Tensor, w: torch.Tensor, out: Optional[torch.Tensor] = None, accumulate: bool = False,
           norm_eps: Optional[float] = None, glu: bool = False, launch: Optional[LinearLaunch] = None,
           pdl: Optional[bool] = None, out2: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [M, K] @ w.T in one launch, w [N, K] ([2N, K] gate | up for glu); the math is `linear_naive`'s:
    norm_eps scales each row by x's own 1 / rms (an RMSNorm folded into w), glu gives silu(g) * u
    [M, N], accumulate adds into out (a residual, in place). out [M, N] may be a view with
    contiguous rows; without it a new tensor in x's dtype. pdl: programmatic dependent launch (CUDA,
    Hopper or newer; None: as every kernel of the step, `ssv.ops.pdl.pdl(x.device)`; False: a plain
    launch, which `ssv bench linear --pdl` times against). out2 [M, N] (a view with contiguous rows,
    out's dtype) receives a copy of the result from the same launch (a layer's output tapped)."""
    _check_rows(x, w, "linear")
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
    if out2 is not None and (out2.shape != (m, n) or out2.stride(1) != 1 or out2.dtype != out.dtype):
        raise ValueError(f"linear: out2 must be [{m}, {n}] {out.dtype} with contiguous rows, got "
                         f"{tuple(out2.shape)} {out2.dtype}")
    lp = default_launch(m, k) if launch is None else launch
    pdl = _launch_args(lp, pdl, x.device, "linear")
    if m and n:
        y2 = out if out2 is None else out2
        linear_fwd_kernel[(triton.cdiv(n, lp.bn), triton.cdiv(m, lp.bm))](
            x, w, out, y2, m, n, x.stride(0), w.stride(0), out.stride(0), y2.stride(0),
            0.0 if norm_eps is None else float(norm_eps), K=k, BM=lp.bm, BN=lp.bn, BK=lp.bk,
            NORM=norm_eps is not None, GLU=glu, ACC=accumulate, OUT2=out2 is not None, PDL=pdl,
            num_warps=lp.warps, num_stages=lp.stages, **({"launch_pdl": True} if pdl else {}))
    return out


def linear_rope(x: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, hq: int, hkv: int,
                k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, norm_eps: Optional[float] = None,
                pos: Optional[torch.Tensor] = None, launch: Optional[LinearLaunch] = None,
                pdl: Optional[bool] = None) -> torch.Tensor:
    """The q|k|v projection x [M, K] @ w.T (w [(Hq + 2 Hkv) D, K], an RMSNorm folded in with norm_eps)
    with rotate-half RoPE on q and k, k and v stored at `slots` [M] of k_cache / v_cache [Hkv, L, D],
    in one launch (`linear` then `ssv.ops.glue.ops.rope_write`, without rounding the product between
    them): returns q [M, Hq, D]. cos / sin as rope_write takes them ([M, D], [1, D], or tables with pos).
    The launch's column tile must divide D / 2 (each program holds a head's columns and their RoPE
    partners)."""
    d = cos.shape[-1]
    _check_rows(x, w, "linear_rope")
    m, k = x.shape
    if w.shape[0] != (hq + 2 * hkv) * d or d & (d - 1) or d < 32:
        raise ValueError(f"linear_rope: w must have (Hq + 2 Hkv) * D rows with D a power of two >= 32, got "
                         f"{w.shape[0]} rows for Hq={hq}, Hkv={hkv}, D={d}")
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride() or k_cache.stride(2) != 1 \
            or k_cache.shape[0] != hkv or k_cache.shape[2] != d:
        raise ValueError(f"linear_rope: k and v caches must be [{hkv}, L, {d}] of one stride, rows contiguous, got "
                         f"{tuple(k_cache.shape)} / {tuple(v_cache.shape)}")
    if slots.shape != (m,):
        raise ValueError(f"linear_rope: slots must be [{m}], got {tuple(slots.shape)}")
    cos, sin, pos, s_c = rope_tables(cos, sin, pos, m, "linear_rope")
    lp = default_launch(m, k) if launch is None else launch
    pdl = _launch_args(lp, pdl, x.device, "linear_rope", half=d // 2)
    slots = slots.contiguous()
    q = torch.empty(m, hq, d, device=x.device, dtype=x.dtype)
    if m:
        grid = ((hq + 2 * hkv) * (d // 2 // lp.bn), triton.cdiv(m, lp.bm))
        linear_rope_fwd_kernel[grid](
            x, w, cos, sin, slots, slots if pos is None else pos, q, k_cache, v_cache, m, x.stride(0), w.stride(0),
            s_c, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
            0.0 if norm_eps is None else float(norm_eps), K=k, HQ=hq, HKV=hkv, D=d, BM=lp.bm, BN=lp.bn, BK=lp.bk,
            NORM=norm_eps is not None, POS=pos is not None, PDL=pdl, num_warps=lp.warps, num_stages=lp.stages,
            **({"launch_pdl": True} if pdl else {}))
    return q
