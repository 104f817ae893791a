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
                                   best.contiguous(), path, length, bonus, path, path, T=t,
                                   BT=max(16, triton.next_power_of_2(t)), D=max_depth,
                                   BD=max(16, triton.next_power_of_2(max_depth + 1)), RECORD=False,
                                   **pdl_args(dev), num_warps=1)
    return path, length, bonus


def accept_greedy_round(parents: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor, best: torch.Tensor,
                        max_depth: int, length: torch.Tensor, nxt: torch.Tensor, bonus: torch.Tensor):
    """`accept_greedy_walk` and the round's record in the same launch, written into the caller's
    buffers (the engine's record and root token: no copies after it): length [1], nxt [max_depth + 1]
    the token after each path row (the next accepted token, the bonus after the last), bonus [1].
    Returns (path [max_depth + 1], rows [max_depth + 1]: the path with padding at the root)."""
    t, d = parents.numel(), max_depth
    if not (tokens.numel() == scores.numel() == best.numel() == t) or not 0 < t <= MAX_T:
        raise ValueError(f"accept_greedy_round: parents, tokens, scores, best must be [T] with 0 < T <= {MAX_T}")
    for name, x, n in (("length", length, 1), ("nxt", nxt, d + 1), ("bonus", bonus, 1)):
        if x.dtype != torch.long or x.numel() != n or (n > 1 and x.stride(0) != 1):
            raise ValueError(f"accept_greedy_round: {name} must be a contiguous int64 [{n}]")
    dev = parents.device
    path = torch.empty(d + 1, dtype=torch.long, device=dev)
    rows = torch.empty(d + 1, dtype=torch.long, device=dev)
    accept_greedy_fwd_kernel[(1,)](parents.contiguous(), tokens.contiguous(), scores.contiguous(),
                                   best.contiguous(), path, length, bonus, rows, nxt, T=t,
                                   BT=max(16, triton.next_power_of_2(t)), D=d,
                                   BD=max(16, triton.next_power_of_2(d + 1)), RECORD=True,
                                   **pdl_args(dev), num_warps=1)
    return path, rows
