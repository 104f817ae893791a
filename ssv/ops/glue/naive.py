"""Plain-PyTorch twins of the fused glue kernels: the same arithmetic as ssv.model.layers, step by step."""
from __future__ import annotations

import torch
from torch.nn import functional as F


def rmsnorm_naive(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope_write_naive(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, hq: int, hkv: int,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """qkv [N, (Hq + 2 Hkv) D]; RoPE (rotate-half) on q and k; k, v stored at `slots` of the caches
    [Hkv, L, D]. Returns q [N, Hq, D]."""
    n = qkv.shape[0]
    d = cos.shape[-1]

    def rope(x):
        x1, x2 = x.chunk(2, -1)
        rot = torch.cat([-x2, x1], -1)
        return (x.float() * cos[:, None] + rot.float() * sin[:, None]).to(x.dtype)
    q = rope(qkv[:, : hq * d].reshape(n, hq, d))
    k = rope(qkv[:, hq * d:(hq + hkv) * d].reshape(n, hkv, d))
    v = qkv[:, (hq + hkv) * d:].reshape(n, hkv, d)
    k_cache.index_copy_(1, slots, k.transpose(0, 1).to(k_cache.dtype))
    v_cache.index_copy_(1, slots, v.transpose(0, 1).to(v_cache.dtype))
    return q


def swiglu_naive(gu: torch.Tensor) -> torch.Tensor:
    """gu [N, 2I] (gate, up) -> silu(gate) * up [N, I]."""
    g, u = gu.chunk(2, -1)
    return F.silu(g) * u
