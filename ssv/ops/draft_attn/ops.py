"""Launchers of the draft level's attention and of the drafter's commit rows' (two launches each where the
tensor forms are ~20 and ~15: the window's splits, then their merge)."""
from __future__ import annotations

import torch
import triton

from ssv.ops.draft_attn.kernels import draft_attn_fwd_kernel, draft_attn_merge_fwd_kernel
from ssv.ops.draft_attn.policy import window_splits
from ssv.ops.pdl import pdl_args


def _launch(q, k_ring, v_ring, ring_pos, k_scr, v_scr, path, dlen, n_real, level, window, scale, s_pn, dp, rows,
            splits):
    # both launches; the caller checked the shapes. q [F, Hq, D] -> o [F, Hq * D]
    f, hq, d = q.shape
    hkv = k_ring.shape[1]
    o = torch.empty(f, hq * d, device=q.device, dtype=q.dtype)
    if not f:
        return o
    g, bd = hq // hkv, max(16, triton.next_power_of_2(d))
    bk = max(16, min(64, triton.next_power_of_2(window)))
    ns, tps = window_splits(window, bk, splits)
    ws_ml = torch.empty(2, f, hq, ns + 1, device=q.device, dtype=torch.float32)
    ws_a = torch.empty(f, hq, ns + 1, bd, device=q.device, dtype=torch.float32)
    pk = pdl_args(q.device)
    draft_attn_fwd_kernel[(f, hkv, ns + 1)](
        q, k_ring, v_ring, ring_pos, k_scr, v_scr, path, dlen, n_real, ws_ml[0], ws_ml[1], ws_a, int(level),
        float(d ** -0.5 if scale is None else scale), q.stride(0), q.stride(1), k_ring.stride(0), k_ring.stride(1),
        k_scr.stride(0), k_scr.stride(1), s_pn, W=int(window), G=g, BM=max(16, triton.next_power_of_2(g)), D=d,
        BD=bd, BK=bk, TPS=tps, NS=ns, DP=dp, BP=max(16, triton.next_power_of_2(dp)), ROWS=rows, **pk, num_warps=4)
    draft_attn_merge_fwd_kernel[(f,)](ws_ml[0], ws_ml[1], ws_a, o, o.stride(0), HQ=hq,
                                      BH=triton.next_power_of_2(hq), D=d, BD=bd, NS=ns, **pk, num_warps=4)
    return o


def draft_attn(q: torch.Tensor, k_ring: torch.Tensor, v_ring: torch.Tensor, ring_pos: torch.Tensor,
               k_scr: torch.Tensor, v_scr: torch.Tensor, path_rows: torch.Tensor, dlen: torch.Tensor,
               level: int, window: int, scale=None, splits=None) -> torch.Tensor:
    """`draft_attn_naive` in two launches, graph-safe (the length is read from `dlen` on the device):
    q [F, Hq, D]; k_ring/v_ring [>= W, Hkv, D]; ring_pos [>= W] int64; k_scr/v_scr [S, Hkv, D];
    path_rows [F, depth] int64 (-1 padded) -> o [F, Hq * D] in q's dtype. splits: the window's splits
    (`policy.window_splits`; None the measured default)."""
    f, hq, d = q.shape
    hkv = k_ring.shape[1]
    if hq % hkv or k_scr.shape[1:] != k_ring.shape[1:] or k_ring.shape[2] != d:
        raise ValueError(f"draft_attn: q [F, Hq, D] with Hq a multiple of Hkv, "
                         f"ring and scratch [*, Hkv, D]; got q {tuple(q.shape)}, ring {tuple(k_ring.shape)}, "
                         f"scratch {tuple(k_scr.shape)}")
    if k_ring.shape[0] < window or ring_pos.numel() < window or path_rows.shape[0] != f:
        raise ValueError(f"draft_attn: the ring holds {k_ring.shape[0]} slots for a window of {window}, "
                         f"path_rows {tuple(path_rows.shape)} for {f} queries")
    for t in (k_ring, v_ring, k_scr, v_scr):
        if t.stride(2) != 1:
            raise ValueError("draft_attn: keys and values need contiguous head rows")
    if v_ring.stride() != k_ring.stride() or v_scr.stride() != k_scr.stride():
        raise ValueError("draft_attn: keys and values must share strides")
    q = q if q.stride(2) == 1 else q.contiguous()
    path_rows, ring_pos = path_rows.contiguous(), ring_pos.contiguous()
    return _launch(q, k_ring, v_ring, ring_pos, k_scr, v_scr, path_rows, dlen, dlen, level, window, scale,
                   path_rows.stride(0), path_rows.shape[1], False, splits)


def draft_attn_rows(q: torch.Tensor, k_ring: torch.Tensor, v_ring: torch.Tensor, ring_pos: torch.Tensor,
                    k_new: torch.Tensor, v_new: torch.Tensor, dlen: torch.Tensor, n: torch.Tensor, window: int,
                    scale=None, splits=None) -> torch.Tensor:
    """`draft_attn_rows_naive` in two launches (the drafter's commit of R rows, R <= W): row i at
    position dlen + i sees the ring inside its window and the new rows j <= i of the first n [1]
    (a padded row i >= n sees itself). q [R, Hq, D]; k_new / v_new [R, Hkv, D] -> o [R, Hq * D]."""
    r, hq, d = q.shape
    hkv = k_ring.shape[1]
    if k_new.shape != (r, hkv, d) or v_new.shape != k_new.shape or hq % hkv or k_ring.shape[2] != d:
        raise ValueError(f"draft_attn_rows: q [R, Hq, D] and the new rows' k / v [R, Hkv, D]; got q {tuple(q.shape)}, "
                         f"k {tuple(k_new.shape)}, ring {tuple(k_ring.shape)}")
    if r > window or k_ring.shape[0] < window or ring_pos.numel() < window:
        raise ValueError(f"draft_attn_rows: {r} rows for a window of {window} in a ring of {k_ring.shape[0]} slots")
    for t in (k_ring, v_ring, k_new, v_new):
        if t.stride(2) != 1:
            raise ValueError("draft_attn_rows: keys and values need contiguous head rows")
    if v_ring.stride() != k_ring.stride() or v_new.stride() != k_new.stride():
        raise ValueError("draft_attn_rows: keys and values must share strides")
    q = q if q.stride(2) == 1 else q.contiguous()
    return _launch(q, k_ring, v_ring, ring_pos.contiguous(), k_new, v_new, ring_pos, dlen, n, 2, window, scale, 0, r,
                   True, splits)
