"""Launcher of the grouped NSA verification (the SSV kernel): selected + window + tree branches of N
queries in one launch. The kernels are in `verify_kernels.py`, the launch policy (tiles, warps, KV
splits, merge, scratch sizes) in `verify_policy.py`; the math is in README.md.
"""
from __future__ import annotations

from typing import Optional

import torch

from ssv.ops.nsa.verify_kernels import nsa_verify_combine_kernel, nsa_verify_fwd_kernel
from ssv.ops.nsa.verify_policy import (FOLD_MAX_SPLITS, GROUP_SIZES, launch_config, num_counters, occupancy,
                                       pdl_pays, plan_launch, tile_rows)
from ssv.ops.pdl import pdl_args
from ssv.ops.utils import kv_descriptors, pow2, sm_count

# what callers import from here: the launcher, and the kernels and policy it runs
__all__ = ["nsa_verify", "check_shapes", "nsa_verify_fwd_kernel", "nsa_verify_combine_kernel", "FOLD_MAX_SPLITS",
           "launch_config", "num_counters", "occupancy", "tile_rows"]


def nsa_verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len, positions: torch.Tensor,
               tree_mask: torch.Tensor, block_indices: torch.Tensor, slc_block: int, window: int,
               group_size: int = 1, approx: bool = False, gates: Optional[torch.Tensor] = None,
               o_cmp: Optional[torch.Tensor] = None, scale: Optional[float] = None,
               out: Optional[torch.Tensor] = None, max_rows: int = 128, n_split: Optional[int] = None,
               launch: Optional[dict] = None, tma: Optional[bool] = None, lazy: Optional[bool] = None,
               fold: Optional[bool] = None, counters: Optional[torch.Tensor] = None):
    """Selected + window attention of N queries (see verify_kernels.py and README.md).

    q [N, Hq, D]; k, v [Hkv, L, D]; positions [N] int; tree_mask [N, N] (bool/uint8); block_indices
    [N, Hkv, n] ascending, -1 padded; gates [N, Hq, 3] and o_cmp [N, Hq, D] for gated NSA (None:
    union gating). Returns (o [N, Hq, D] in q's dtype, lse_a [N, Hq], lse_b [N, Hq]): for union
    gating lse_a is the log-sum-exp over selected ∪ window; for gated, lse_a / lse_b are the
    selected / window branches'.
    tma: K/V tiles through tensor descriptors (default: on Hopper or newer with 16-byte aligned
    caches), else pointer loads. Positions must lie in [prefix_len, prefix_len + N), as a plan's do.
    prefix_len: an int, or an int32 [1] device tensor that the kernel reads (no host sync, and a
    captured graph replays at any length): the launch is then sized for the cache's capacity and
    the TMA descriptors span the whole cache, whose slots past the step must hold finite values
    (a KVCache's do: zeros or earlier steps' keys).
    launch: an explicit (num_warps, num_stages), for probes; default: the fixed table of `launch_config`.
    n_split: KV splits (default: one wave of the programs that fit on an SM, `plan_launch`).
    lazy: softmax against each row's score on its own token (no per-iteration row max or row sum),
    with an in-kernel fallback to the online softmax when that over/underflows. Default: on in exact
    mode, off in approximate mode, as measured side by side on the H200 at fixed launch configs
    (Llama 64K / 64: exact C = 4 1.14x, per-query 1.23x, approximate C = 16 0.83x; real routing of the
    default model: exact C = 4 1.13-1.19x).
    fold (with KV splits): the last split of each program group to finish merges the splits itself,
    instead of a second launch (`nsa_verify_combine_kernel`). Default: when the folded launch needs at
    most `FOLD_MAX_SPLITS` splits (beyond, one program merging many splits costs more than the launch).
    counters: its int32 arrival counters, `num_counters(...)` of them, zero before the call and left
    zero by it, so a plan allocates them once for every layer; None: allocated (zeroed) here.
    """
    q = q.contiguous()
    n, hq, d = q.shape
    hkv = k.shape[0]
    lazy = not approx if lazy is None else bool(lazy)
    if isinstance(prefix_len, torch.Tensor):
        plen, prefix_len = prefix_len, k.shape[1] - n   # launch sized for the largest prefix the cache holds
    else:
        prefix_len = int(prefix_len)
        plen = torch.full((1,), prefix_len, device=q.device, dtype=torch.int32)
    check_shapes(n, hq, d, hkv, k, v, prefix_len, slc_block, group_size, block_indices)
    gated = gates is not None
    if gated and (o_cmp is None or gates.shape != (n, hq, 3) or o_cmp.shape != (n, hq, d)):
        raise ValueError("gated NSA needs gates [N, Hq, 3] and o_cmp [N, Hq, D]")
    scale = d ** -0.5 if scale is None else scale
    out = torch.empty_like(q) if out is None else out
    lse_a = torch.empty(n, hq, device=q.device, dtype=torch.float32)
    lse_b = torch.empty_like(lse_a)
    if n == 0:
        return out, lse_a, lse_b
    # no conversions when the plan already holds these dtypes: a layer's run is the launch alone
    tm = (tree_mask if tree_mask.dtype == torch.uint8 else tree_mask.to(torch.uint8)).contiguous()
    bi = (block_indices if block_indices.dtype in (torch.int32, torch.int64) else block_indices.int()).contiguous()
    pos = (positions if positions.dtype in (torch.int32, torch.int64) else positions.int()).contiguous()
    gt = gates.float().contiguous() if gated else lse_a
    oc = o_cmp.float().contiguous() if gated else lse_a
    # TMA wants 16-byte aligned bases and row strides
    kd, vd, tma = kv_descriptors(k, v, prefix_len + n, slc_block, tma, "nsa_verify")

    def args(ws_m, ws_l, ws_a, items, cnt, n_splits):  # the kernel's positional arguments
        return (q, k, v, kd, vd, pos, tm, bi, gt, oc, out, lse_a, lse_b, ws_m, ws_l, ws_a, items, cnt,
                plen, n, int(window), float(scale), n_splits,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), bi.stride(0), bi.stride(1), tm.stride(0), hq)

    # programmatic dependent launch on Hopper (ssv/ops/pdl.py), where the policy says it pays
    pk = pdl_args(q.device) if pdl_pays(n, group_size) else {"PDL": False}

    def fit(consts, cfg, folded):  # placeholder scratch of the right dtypes: the code does not depend on it
        # the variant the launch compiles (PDL included), so its registers are what is counted
        return occupancy(args(lse_a, lse_a, lse_a, plen, plen, 2), consts, {**cfg, **pk}, folded, q.device)
    lp = plan_launch(n, hq, hkv, d, block_indices.shape[-1], slc_block, int(window), prefix_len, group_size,
                     approx, gated, tma, lazy, max_rows, n_split, fold, launch, fit if q.is_cuda else None,
                     sm_count(q.device))
    if counters is None:
        counters = torch.zeros(max(lp.counters, 1), device=q.device, dtype=torch.int32)
    elif counters.dtype != torch.int32 or counters.numel() < lp.counters or counters.device != q.device:
        raise ValueError(f"counters must be {lp.counters}+ int32 zeros on {q.device}, got {counters.numel()} "
                         f"{counters.dtype} on {counters.device}")
    # partial softmax states of the KV splits (two branches per row for gated NSA)
    ws_m = torch.empty(max(lp.states, 1), device=q.device, dtype=torch.float32)
    ws_l = torch.empty_like(ws_m)
    ws_a = torch.empty(max(lp.states * d, 1), device=q.device, dtype=torch.float32)
    # per program: the (block, query bits) work list; written and read by that program only
    items = torch.empty(lp.items, device=q.device, dtype=torch.int32)
    nsa_verify_fwd_kernel[lp.grid](*args(ws_m, ws_l, ws_a, items, counters, lp.n_split), **lp.consts, **lp.cfg, **pk)
    if lp.n_split > 1 and not lp.fold:
        nsa_verify_combine_kernel[(n * hq,)](gt, oc, out, lse_a, lse_b, ws_m, ws_l, ws_a, n, lp.n_split, hq,
                                             NSP=pow2(lp.n_split), D=d, GATED=gated, **pk, num_warps=1)
    return out, lse_a, lse_b


def check_shapes(n, hq, d, hkv, k, v, prefix_len, slc_block, group_size, block_indices) -> None:
    """Raise a clear error for shapes the kernels do not support."""
    if hq % hkv or not 1 <= hq // hkv <= 16:
        raise ValueError(f"GQA group size must be 1..16 (Hq={hq}, Hkv={hkv})")
    if d not in (16, 32, 64, 128):
        raise ValueError(f"head dim {d} not supported (16, 32, 64, 128)")
    if slc_block < 16 or slc_block & (slc_block - 1):
        raise ValueError(f"selection block {slc_block} must be a power of two >= 16")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group size C must be one of 1, 2, 4, 8, 16, got {group_size}")
    if not 0 <= n <= 128:
        raise ValueError(f"1..128 verification queries are supported, got {n}")
    if k.shape != v.shape or k.shape[0] != hkv or k.shape[2] != d or prefix_len + n > k.shape[1]:
        raise ValueError(f"cache {tuple(k.shape)} does not hold prefix {prefix_len} + {n} tokens")
    if k.stride(2) != 1 or v.stride() != k.stride():
        raise ValueError("k and v must share strides with a contiguous last dimension")
    if block_indices.shape[:2] != (n, hkv):
        raise ValueError(f"block_indices must be [N={n}, Hkv={hkv}, n], got {tuple(block_indices.shape)}")
