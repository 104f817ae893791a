"""Launcher of the drafter's ring commit: one launch where the tensor form (`ring_commit_naive`) is ~11."""
from __future__ import annotations

import torch
import triton

from ssv.ops.pdl import pdl_args
from ssv.ops.ring_commit.kernels import ring_commit_fwd_kernel


def ring_commit(k_new: torch.Tensor, v_new: torch.Tensor, k_ring: torch.Tensor, v_ring: torch.Tensor,
                slot_pos: torch.Tensor, x: torch.Tensor, hid: torch.Tensor, n: torch.Tensor,
                dlen: torch.Tensor, window: int) -> None:
    """As `ring_commit_naive`, in one launch. The rows must fit the ring (R <= window), so that no two
    real rows share a slot."""
    r, e, h = k_new.shape[0], k_new[0].numel(), x.shape[-1]
    if not 0 < r <= window:
        raise ValueError(f"ring_commit: 1..{window} rows (the window), got {r}")
    for name, t in (("k_new", k_new), ("v_new", v_new), ("k_ring", k_ring), ("v_ring", v_ring)):
        if not t[0].is_contiguous() or t.shape[1:] != k_new.shape[1:]:
            raise ValueError(f"ring_commit: {name} must be [*, Hkv, D] with contiguous rows like k_new "
                             f"{tuple(k_new.shape)}, got {tuple(t.shape)}")
    if v_new.stride() != k_new.stride() or v_ring.stride() != k_ring.stride():
        raise ValueError("ring_commit: keys and values must share strides")
    if k_ring.shape[0] != window + 1 or slot_pos.shape != (window + 1,):
        raise ValueError(f"ring_commit: the ring must hold window + 1 = {window + 1} slots, got "
                         f"{k_ring.shape[0]} and slot_pos {tuple(slot_pos.shape)}")
    if x.dim() != 2 or x.shape[0] != r or x.stride(1) != 1 or hid.shape != (h,) or not hid.is_contiguous():
        raise ValueError(f"ring_commit: x must be [{r}, H] with contiguous rows and hid [H], got "
                         f"{tuple(x.shape)}, {tuple(hid.shape)}")
    if n.numel() != 1 or dlen.numel() != 1 or dlen.dtype != torch.long:
        raise ValueError("ring_commit: n and dlen must be one-element tensors (dlen int64)")
    ring_commit_fwd_kernel[(1,)](k_new, v_new, k_ring, v_ring, slot_pos, x, hid, n, dlen, r, k_new.stride(0),
                                 k_ring.stride(0), x.stride(0), W=window, E=e, H=h,
                                 BR=max(2, triton.next_power_of_2(r)), BE=triton.next_power_of_2(e),
                                 BH=triton.next_power_of_2(h), num_warps=4, **pdl_args(k_new.device))
