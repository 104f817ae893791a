"""Launcher of the vocabulary top-k (one launch for the rows of a draft level)."""
from __future__ import annotations

from typing import Optional

import torch
import triton

from ssv.ops.glue.ops import _norm_args
from ssv.ops.pdl import pdl_args
from ssv.ops.topk.kernels import (argmax_merge_fwd_kernel, argmax_part_fwd_kernel, rank_topk_fwd_kernel,
                                 vocab_topk_fwd_kernel)

# a row lives in one program's registers: past this many entries the torch path (naive.py's
# int64-key top-k twin in ssv.spec.device) is used instead
MAX_V = 16384
# rank_topk compares a row with itself in chunks: rows of a tree's pool (a few hundred entries)
MAX_RANK_N = 1024
# row_argmax: columns per program of its first launch (at most ARGMAX_MAX_SPLITS of them a row,
# which the merge holds in registers)
ARGMAX_COLS = (1024, 4096)
ARGMAX_MAX_SPLITS = 1024


def vocab_topk(x: torch.Tensor, k: int, id_map=None, clamp: bool = False, num_warps: Optional[int] = None,
               logits: bool = False, norm=None):
    """x [R, V] (finite or -inf) -> (values [R, k] float64, ids [R, k] int64), descending, ties to the
    lower index: `vocab_topk_naive` in one launch instead of a sort. id_map [V] int64: ids returned
    as id_map[index]; clamp: values capped at 0; logits: x are logits, ranked and returned as their
    log_softmax; norm (xn [R, Dm], eps), with logits: x projected the un-normalized rows xn through a
    weight with an RMSNorm's folded in, each row is first scaled by xn's 1 / rms (all as the naive
    twin's arguments)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"vocab_topk: x must be [R, V] with contiguous rows, got {tuple(x.shape)}")
    r, v = x.shape
    if not 0 < k <= v or v > MAX_V:
        raise ValueError(f"vocab_topk: needs 0 < k <= V <= {MAX_V}, got k={k}, V={v}")
    if norm is not None and not logits:
        raise ValueError("vocab_topk: norm= scales logits (logits=True)")
    xn, s_xn, eps, nk = _norm_args(norm, r, x.device)
    vals = torch.empty(r, k, dtype=torch.float64, device=x.device)
    ids = torch.empty(r, k, dtype=torch.long, device=x.device)
    if r:
        bv = triton.next_power_of_2(v)
        if id_map is not None and id_map.shape != (v,):
            raise ValueError(f"vocab_topk: id_map must be [{v}], got {tuple(id_map.shape)}")
        vocab_topk_fwd_kernel[(r,)](x, vals, ids, ids if id_map is None else id_map.contiguous(),
                                    x if xn is None else xn, x.stride(0), vals.stride(0), s_xn, eps, V=v, BV=bv, K=k,
                                    MAP=id_map is not None, CLAMP=bool(clamp), LOGITS=bool(logits), **nk,
                                    **pdl_args(x.device), num_warps=num_warps or (8 if bv >= 4096 else 4),
                                    # the folded norm's x * s, unfused: LLVM contracted it into some
                                    # elements' x * s - max and not others, so equal logits ranked as
                                    # unequal ones (an H100, 2026-12-06)
                                    enable_fp_fusion=False)
    return vals, ids


def rank_topk(x: torch.Tensor, k: int, largest: bool = True, by_index: bool = False, out=None):
    """x [R, N] (float or int, N <= MAX_RANK_N) -> (values [R, k] in x's dtype, indices [R, k] int64):
    the first k entries of a stable sort (descending when largest, NaN first; ascending otherwise,
    NaN last), or with by_index those same k entries in ascending index order: `rank_topk_naive`
    in one launch instead of a radix sort (~8 us for 64 float64 entries on the H200, ~33 us for 328).
    out: (values, indices) to write into."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"rank_topk: x must be [R, N] with contiguous rows, got {tuple(x.shape)}")
    r, n = x.shape
    if not 0 < k <= n or n > MAX_RANK_N:
        raise ValueError(f"rank_topk: needs 0 < k <= N <= {MAX_RANK_N}, got k={k}, N={n}")
    if out is None:
        out = (torch.empty(r, k, dtype=x.dtype, device=x.device), torch.empty(r, k, dtype=torch.long, device=x.device))
    vals, ids = out
    if vals.shape != (r, k) or ids.shape != (r, k) or vals.dtype != x.dtype or ids.dtype != torch.long:
        raise ValueError(f"rank_topk: out must be ([{r}, {k}] {x.dtype}, [{r}, {k}] int64)")
    if r:
        bn = triton.next_power_of_2(n)
        rank_topk_fwd_kernel[(r,)](x, vals, ids, x.stride(0), vals.stride(0), n, K=k, BN=bn, BJ=min(bn, 16),
                                   LARGEST=bool(largest), BY_INDEX=bool(by_index), num_warps=8 if bn >= 512 else 4,
                                   **pdl_args(x.device))
    return vals, ids


def row_argmax(x: torch.Tensor, out: Optional[torch.Tensor] = None, out2: Optional[torch.Tensor] = None):
    """x [R, V] -> the index of each row's maximum [R] int64, torch.argmax's (the lower index on ties,
    the first NaN over any number): `row_argmax_naive` in two launches spread over the GPU, where
    torch's reduction gives a row one block (12.5 us for the default model's 49,152 logits on an
    H100). out [R] int64 (a view is fine) receives it; out2 [R] int64 a copy of it, so a step's
    token lands in two buffers without a copy launch."""
    if x.dim() != 2 or x.stride(1) != 1 or x.shape[1] == 0:
        raise ValueError(f"row_argmax: x must be [R, V] with V > 0 and contiguous rows, got {tuple(x.shape)}")
    r, v = x.shape
    cols = ARGMAX_COLS[0] if r <= 4 else ARGMAX_COLS[1]   # one row: more, shorter programs
    ns = triton.cdiv(v, cols)
    if ns > ARGMAX_MAX_SPLITS:
        raise ValueError(f"row_argmax: rows of {v} entries exceed {ARGMAX_MAX_SPLITS * cols}")
    for name, t in (("out", out), ("out2", out2)):
        if t is not None and (t.dtype != torch.long or t.shape != (r,) or t.device != x.device
                              or not t.is_contiguous()):
            raise ValueError(f"row_argmax: {name} must be a contiguous int64 [{r}] on {x.device}, "
                             f"got {tuple(t.shape)} {t.dtype}")
    out = torch.empty(r, dtype=torch.long, device=x.device) if out is None else out
    if r:
        pk = pdl_args(x.device)
        p_v = torch.empty(r, ns, dtype=torch.float32, device=x.device)
        p_i = torch.empty(r, ns, dtype=torch.int32, device=x.device)
        argmax_part_fwd_kernel[(r, ns)](x, p_v, p_i, x.stride(0), v, ns, BC=cols, **pk, num_warps=4)
        argmax_merge_fwd_kernel[(r,)](p_v, p_i, out, out if out2 is None else out2, ns,
                                      BS=max(16, triton.next_power_of_2(ns)), OUT2=out2 is not None, **pk,
                                      num_warps=1)
    return out
