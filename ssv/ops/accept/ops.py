"""Launcher of the greedy tree walk (one launch where the tensor walk takes ~100)."""
from __future__ import annotations

import torch
import triton

from ssv.ops.accept.kernels import accept_greedy_fwd_kernel
from ssv.ops.pdl import pdl_args

MAX_T = 1024


def accept_greedy_walk(parents: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor, best: torch.Tensor,
                       max_depth: int):
    """parents/tokens [T] int64, scores [T] float, best [T] int64 (the target's argmax at each node) ->
    (path [max_depth + 1] -1 padded, length [1], bonus [1]) as `ssv.spec.device.accept_greedy_device`."""
    t = parents.numel()
    if not (tokens.numel() == scores.numel() == best.numel() == t) or not 0 < t <= MAX_T:
        raise ValueError(f"accept_greedy_walk: parents, tokens, scores, best must be [T] with 0 < T <= {MAX_T}")
    dev = parents.device
    path = torch.empty(max_depth + 1, dtype=torch.long, device=dev)
    length = torch.empty(1, dtype=torch.long, device=dev)
    bonus = torch.empty(1, dtype=torch.long, device=dev)
    accept_greedy_fwd_kernel[(1,)](parents.contiguous(), tokens.contiguous(), scores.contiguous(),
                                   best.contiguous(), path, length, bonus, T=t,
                                   BT=max(16, triton.next_power_of_2(t)), D=max_depth, **pdl_args(dev), num_warps=1)
    return path, length, bonus
