"""The commit as plain tensor ops (the CPU path and the kernel's twin)."""
from __future__ import annotations

from typing import Optional

import torch

from ssv.config import NSAConfig


def _blocks(length: torch.Tensor, nsa: NSAConfig) -> torch.Tensor:
    l, st = nsa.cmp_block, nsa.cmp_stride
    return torch.where(length >= l, (length - l) // st + 1, torch.zeros_like(length))


def kv_commit_naive(k: torch.Tensor, v: torch.Tensor, cmp: Optional[torch.Tensor], dlen: torch.Tensor,
                    path: torch.Tensor, n: torch.Tensor, nsa: Optional[NSAConfig], hist: Optional[torch.Tensor] = None,
                    tokens: Optional[torch.Tensor] = None) -> None:
    """k, v [Lyr, H, T, D]; cmp [2, Lyr, H, NB + 1, D] (the last block a spare that padded updates hit);
    dlen [1] int32 committed length P; path [R] scratch offsets (increasing, -1 padded), n [1] accepted.
    Slots P + path[i] move to P + i for i < n, the compressed blocks completed by [P, P + n) are
    filled, and dlen becomes P + n. hist [L] int64 with tokens [M]: also hist[P + 1 + i] = tokens[i]
    (the text by position: the token after each accepted row; positions clamped to L - 1, which the
    callers size never to reach)."""
    R = path.numel()
    P = dlen.long()
    j = torch.arange(R, device=path.device)
    dst = P + j
    src = torch.where(j < n, P + path.clamp_min(0), dst)
    # src >= dst elementwise: the gather copies before any slot is overwritten. index_select / index_copy_, not
    # k[:, :, src]: advanced indexing of the whole cache made a CPU commit 317-504 us against 228-290 (session 55)
    for t in (k, v):
        t.index_copy_(2, dst, t.index_select(2, src))
    new = P + n.long()
    if nsa is not None:
        l, st = nsa.cmp_block, nsa.cmp_stride
        cap = cmp.shape[3] - 1
        b = _blocks(P, nsa) + torch.arange(R // st + 1, device=path.device)   # the blocks it may complete
        slots = ((b * st)[:, None] + torch.arange(l, device=path.device)).clamp_max(k.shape[2] - 1)  # [M, l]
        dst_b = torch.where(b < _blocks(new, nsa), b, cap).clamp_max(cap)
        for i, t in enumerate((k, v)):
            win = t.index_select(2, slots.reshape(-1)).view(*t.shape[:2], *slots.shape, -1)   # [Lyr, H, M, l, D]
            cmp[i].index_copy_(2, dst_b, win.float().mean(-2).to(t.dtype))
    if hist is not None:
        at = (P + 1 + torch.arange(tokens.numel(), device=P.device)).clamp_(max=hist.numel() - 1)
        hist.index_copy_(0, at, tokens)
    dlen.copy_(new.to(torch.int32))
