"""Plain-PyTorch twins of the fused glue kernels: the same arithmetic as ssv.model.layers, step by step."""
from __future__ import annotations

import torch
from torch.nn import functional as F


def rmsnorm_naive(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rmsnorm_pair_naive(x1: torch.Tensor, w1: torch.Tensor, eps1: float, rows: torch.Tensor, x2: torch.Tensor,
                       w2: torch.Tensor, eps2: float, rows2=None) -> torch.Tensor:
    """[RMSNorm(x1[rows]) * w1 | RMSNorm(x2[rows2]) * w2] [N, 2D] (rows2 None: x2's own rows)."""
    return torch.cat([rmsnorm_naive(x1[rows], w1, eps1), rmsnorm_naive(x2 if rows2 is None else x2[rows2], w2, eps2)],
                     -1)


def row_rsqrt(x: torch.Tensor, eps: float) -> torch.Tensor:
    """[N, 1] fp32: 1 / rms of each row (a folded RMSNorm's row scale)."""
    return torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)


def fold_norm(w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """A projection's weight [O, D] with an RMSNorm weight g [D] folded in: RMSNorm(x) @ W.T ==
    rsqrt(mean(x^2) + eps) * (x @ (W * g).T), the product in fp32, rounded once."""
    return (w.float() * g.float()[None, :]).to(w.dtype)


def rope_write_naive(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, hq: int, hkv: int,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, norm=None,
                     pos=None) -> torch.Tensor:
    """qkv [N, (Hq + 2 Hkv) D]; RoPE (rotate-half) on q and k; k, v stored at `slots` of the caches
    [Hkv, L, D]. Returns q [N, Hq, D]. norm (x, eps): qkv is first scaled by x's 1 / rms (fp32).
    pos [N]: cos / sin are tables by position, row n uses their rows pos[n]."""
    if pos is not None:
        cos, sin = cos[pos], sin[pos]
    n = qkv.shape[0]
    d = cos.shape[-1]
    dt = qkv.dtype
    if norm is not None:
        qkv = qkv.float() * row_rsqrt(*norm)

    def rope(x):
        x1, x2 = x.chunk(2, -1)
        rot = torch.cat([-x2, x1], -1)
        return (x.float() * cos[:, None] + rot.float() * sin[:, None]).to(dt)
    q = rope(qkv[:, : hq * d].reshape(n, hq, d))
    k = rope(qkv[:, hq * d:(hq + hkv) * d].reshape(n, hkv, d))
    v = qkv[:, (hq + hkv) * d:].reshape(n, hkv, d)
    k_cache.index_copy_(1, slots, k.transpose(0, 1).to(k_cache.dtype))
    v_cache.index_copy_(1, slots, v.transpose(0, 1).to(v_cache.dtype))
    return q


def swiglu_naive(gu: torch.Tensor, norm=None) -> torch.Tensor:
    """gu [N, 2I] (gate, up) -> silu(gate) * up [N, I]; norm (x, eps): gu first scaled by x's 1 / rms."""
    if norm is not None:
        dt = gu.dtype
        g, u = (gu.float() * row_rsqrt(*norm)).chunk(2, -1)
        return (F.silu(g).to(dt).float() * u).to(dt)
    g, u = gu.chunk(2, -1)
    return F.silu(g) * u
