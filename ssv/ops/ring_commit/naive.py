"""The drafter's ring commit in tensor ops (the twin of `ring_commit_fwd_kernel`)."""
from __future__ import annotations

import torch


def ring_commit_naive(k_new: torch.Tensor, v_new: torch.Tensor, k_ring: torch.Tensor, v_ring: torch.Tensor,
                      slot_pos: torch.Tensor, x: torch.Tensor, hid: torch.Tensor, n: torch.Tensor,
                      dlen: torch.Tensor, window: int) -> None:
    """R new rows at positions dlen + r, of which the first n [1] are real: real row r goes to ring slot
    (dlen + r) % window (keys, values, its position in slot_pos), padded rows to the spare slot
    `window` (position -1); hid = x[max(n - 1, 0)], the last real row's feature; dlen += n.
    k_new, v_new [R, Hkv, D]; k_ring, v_ring [window + 1, Hkv, D]; slot_pos [window + 1]; x [R, H]."""
    ar = torch.arange(k_new.shape[0], device=k_new.device)
    pos = dlen + ar
    real = ar < n
    slots = torch.where(real, pos % window, window)
    k_ring.index_copy_(0, slots, k_new)
    v_ring.index_copy_(0, slots, v_new)
    slot_pos.index_copy_(0, slots, torch.where(real, pos, -1))
    hid.copy_(x[(n - 1).clamp_min(0)][0])
    dlen += n
