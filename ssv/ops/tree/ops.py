"""Launcher of one draft-tree level (one launch where the tensor form is ~15)."""
from __future__ import annotations

import torch
import triton

from ssv.ops.pdl import pdl_args
from ssv.ops.tree.kernels import tree_level_fwd_kernel

MAX_CANDIDATES = 256   # R * K in one program's registers (a [BN, BN] comparison)


def tree_level(vals, toks, t: int, base: int, root, front, rows_in, tok, par, score, front_out, ftok_out,
               fpar_out, rows_out) -> None:
    """`tree_level_naive` in one launch, graph-safe (every index is read on the device).

    Pool tok / par / score [M] (int64, int64, float64); vals [R, K] float64 and toks [R, K] int64; root [1] int64 (level 1) ; front [R] int64, rows_in [K, D] int64 (level >= 2);
    outputs front_out, ftok_out, fpar_out [K] int64 and rows_out [K, D] int64 (not rows_in)."""
    R, K = vals.shape
    D = rows_out.shape[1]
    if toks.shape != (R, K):
        raise ValueError(f"tree_level: vals and toks [R, K], got {tuple(vals.shape)} and {tuple(toks.shape)}")
    vals, toks = vals.contiguous(), toks.contiguous()   # no copy from the top-k kernel
    if R * K > MAX_CANDIDATES or (t == 1) != (R == 1) or base + R * K > tok.numel():
        raise ValueError(f"tree_level: level {t} with {R} x {K} candidates at {base} of a {tok.numel()}-node pool")
    if rows_out.shape != (K, D) or rows_out.stride(0) != D or (t > 1 and rows_in.data_ptr() == rows_out.data_ptr()):
        raise ValueError("tree_level: rows_out [K, D] contiguous and apart from rows_in")
    if vals.dtype != torch.float64 or score.dtype != torch.float64:
        raise ValueError("tree_level: vals and score are float64")
    tree_level_fwd_kernel[(1,)](
        vals, toks, root if t == 1 else toks, front if t > 1 else toks, rows_in if t > 1 else rows_out,
        tok, par, score, front_out, ftok_out, fpar_out, rows_out, int(t), int(base), vals.stride(0),
        R=R, K=K, D=D, BN=max(16, triton.next_power_of_2(R * K)), BD=max(16, triton.next_power_of_2(D)),
        FIRST=t == 1, **pdl_args(vals.device), num_warps=4)
