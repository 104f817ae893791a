"""Plain-PyTorch twin of the vocabulary top-k: a stable descending sort, the first k."""
from __future__ import annotations

import torch


def vocab_topk_naive(x: torch.Tensor, k: int):
    """x [R, V] -> (values [R, k] float64, ids [R, k] int64): descending, ties to the lower index."""
    vals, idx = torch.sort(x.double(), dim=-1, descending=True, stable=True)
    return vals[..., :k], idx[..., :k]
