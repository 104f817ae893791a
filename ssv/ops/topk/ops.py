"""Launcher of the vocabulary top-k (one launch for the rows of a draft level)."""
from __future__ import annotations

from typing import Optional

import torch
import triton

from ssv.ops.glue.ops import _norm_args
from ssv.ops.pdl import pdl_args
from ssv.ops.topk.kernels import rank_topk_fwd_kernel, vocab_topk_fwd_kernel

# a row lives in one program's registers: past this many entries the torch path (naive.py's
# int64-key top-k twin in ssv.spec.device) is used instead
MAX_V = 16384
# rank_topk compares a row with itself in chunks: rows of a tree's pool (a few hundred entries)
MAX_RANK_N = 1024


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
