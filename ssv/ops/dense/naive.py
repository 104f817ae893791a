"""Reference dense attention over a committed prefix plus new tokens with tree visibility."""
from __future__ import annotations

from typing import Optional

import torch

from ssv.ops.nsa.naive import check_visibility


def dense_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int, positions: torch.Tensor,
                tree_mask: torch.Tensor, scale: Optional[float] = None, chunk: int = 256,
                check: bool = True) -> torch.Tensor:
    """q [N, Hq, D]; k, v [Hkv, L, D] (prefix in [0, P), new tokens in [P, P+N)) -> o [N, Hq, D] fp32."""
    n, hq, d = q.shape
    hkv = k.shape[0]
    P = int(prefix_len)
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if P + n > k.shape[1]:
        raise ValueError(f"cache of {k.shape[1]} slots cannot hold prefix {P} + {n} new tokens")
    if check:
        check_visibility(P, positions, tree_mask)
    g = hq // hkv
    scale = d ** -0.5 if scale is None else scale
    kf, vf = k[:, : P + n].float(), v[:, : P + n].float()
    out = []
    for c0 in range(0, n, chunk):
        rows = slice(c0, min(n, c0 + chunk))
        qc = q[rows].float().view(-1, hkv, g, d)
        vis = torch.cat([torch.ones(qc.shape[0], P, dtype=torch.bool, device=q.device),
                         tree_mask[rows]], 1)
        s = torch.einsum("chgd,hsd->chgs", qc, kf) * scale
        s = s.masked_fill(~vis[:, None, None], float("-inf"))
        o = torch.einsum("chgs,hsd->chgd", torch.softmax(s, -1), vf)
        out.append(o.reshape(-1, hq, d))
    return torch.cat(out) if out else q.new_zeros(0, hq, d, dtype=torch.float32)
