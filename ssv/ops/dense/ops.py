"""Launcher of dense tree verification: N queries over the committed prefix and the step's own tokens (a
tree under its ancestor mask), in two launches (the KV splits' states, their merge). Kernels in
`kernels.py`, launch policy in `policy.py`, the math in README.md; `naive.py` is the reference.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ssv.ops.dense.kernels import dense_verify_combine_kernel, dense_verify_fwd_kernel
from ssv.ops.dense.policy import merge_chunk, plan_dense
from ssv.ops.pdl import pdl_args
from ssv.ops.utils import kv_descriptors, pow2, sm_count


def dense_verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len, tree_mask: torch.Tensor,
                 scale: Optional[float] = None, out: Optional[torch.Tensor] = None, n_split: Optional[int] = None,
                 tma: Optional[bool] = None) -> torch.Tensor:
    """Dense attention of N queries: q [N, Hq, D]; k, v [Hkv, L, D], the prefix in [0, P) and the step's
    tokens in [P, P + N); tree_mask [N, N] (bool / uint8), query i sees token j of the step where it is
    set. Returns o [N, Hq, D] in q's dtype (into `out` when given).

    prefix_len: an int, or an int32 [1] device tensor the kernel reads (no host sync: a captured graph
    replays at any length; the launch is then sized for the cache's capacity, whose slots past the
    step must hold finite values, as a KVCache's do). tma: K/V tiles through tensor descriptors
    (default: on Hopper or newer with 16-byte aligned caches). n_split: the prefix's KV splits."""
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or k.stride() != v.stride():
        raise ValueError(f"dense_verify: q must be [N, Hq, D] and k, v equal [Hkv, L, D], got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    n, hq, d = q.shape
    hkv, cap = k.shape[0], k.shape[1]
    if hq % hkv or k.shape[2] != d or k.stride(2) != 1:
        raise ValueError(f"dense_verify: {hq} query heads over {hkv} KV heads of dim {k.shape[2]} (q's {d}) with a "
                         f"contiguous last dimension are needed")
    if d not in (16, 32, 64, 128):
        raise ValueError(f"dense_verify: head dim {d} not supported (16, 32, 64, 128)")
    if not 0 <= n <= 128 or tree_mask.shape != (n, n):
        raise ValueError(f"dense_verify: 1..128 queries with a [N, N] tree mask, got {n} and {tuple(tree_mask.shape)}")
    if isinstance(prefix_len, torch.Tensor):
        plen, prefix_max = prefix_len, cap - n
    else:
        prefix_max = int(prefix_len)
        plen = torch.full((1,), prefix_max, device=q.device, dtype=torch.int32)
    if prefix_max < 0 or prefix_max + n > cap:
        raise ValueError(f"dense_verify: cache of {cap} slots cannot hold prefix {prefix_max} + {n} new tokens")
    q = q.contiguous()
    out = torch.empty_like(q) if out is None else out
    if out.shape != q.shape or out.stride(2) != 1:
        raise ValueError(f"dense_verify: out must be {tuple(q.shape)} with a contiguous last dimension")
    if n == 0:
        return out
    tm = (tree_mask if tree_mask.dtype == torch.uint8 else tree_mask.to(torch.uint8)).contiguous()
    scale = d ** -0.5 if scale is None else float(scale)
    lp, grid = plan_dense(n, hq, hkv, d, prefix_max, sm_count(q.device), n_split)
    kd, vd, tma = kv_descriptors(k, v, prefix_max + n, lp.bn, tma, "dense_verify")
    states = (lp.n_split + 1) * n * hq
    f32 = dict(device=q.device, dtype=torch.float32)
    ws_m, ws_l, ws_a = torch.empty(states, **f32), torch.empty(states, **f32), torch.empty(states * d, **f32)
    pk = pdl_args(q.device)
    dense_verify_fwd_kernel[grid](
        q, k, v, kd, vd, plen, tm, ws_m, ws_l, ws_a, n, scale * math.log2(math.e), q.stride(0), q.stride(1),
        k.stride(0), k.stride(1), tm.stride(0), hq, G=hq // hkv, BM=lp.bm, BN=lp.bn, BT=lp.bt, D=d, TMA=tma,
        PF=lp.pf, **pk, num_warps=lp.num_warps, num_stages=lp.num_stages)
    nsp = pow2(lp.n_split + 1, 2)
    dense_verify_combine_kernel[(n * hq,)](ws_m, ws_l, ws_a, out, n, lp.n_split + 1, hq, out.stride(0), out.stride(1),
                                           NSP=nsp, D=d, SC=merge_chunk(nsp, d), **pk, num_warps=1)
    return out
