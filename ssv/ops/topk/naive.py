"""Plain-PyTorch twin of the vocabulary top-k: a stable descending sort, the first k."""
from __future__ import annotations

import torch


def vocab_topk_naive(x: torch.Tensor, k: int, id_map=None, clamp: bool = False):
    """x [R, V] -> (values [R, k] float64, ids [R, k] int64): descending, ties to the lower index;
    ids mapped through id_map [V] when given, values capped at 0 when clamp."""
    vals, idx = torch.sort(x.double(), dim=-1, descending=True, stable=True)
    vals, idx = vals[..., :k], idx[..., :k]
    return (vals.clamp_max(0.0) if clamp else vals), (idx if id_map is None else id_map[idx])
