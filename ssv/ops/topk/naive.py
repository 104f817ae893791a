"""Plain-PyTorch twin of the vocabulary top-k: a stable descending sort, the first k."""
from __future__ import annotations

import torch


def vocab_topk_naive(x: torch.Tensor, k: int, id_map=None, clamp: bool = False, logits: bool = False, norm=None):
    """x [R, V] -> (values [R, k] float64, ids [R, k] int64): descending, ties to the lower index;
    ids mapped through id_map [V] when given, values capped at 0 when clamp; logits: x's float32
    log_softmax ranked and returned instead of x, after each row is scaled by xn's 1 / rms when
    norm = (xn [R, Dm], eps)."""
    if logits:
        x = logits_log_probs(x, norm)
    vals, idx = rank_topk_naive(x.double(), k)
    return (vals.clamp_max(0.0) if clamp else vals), (idx if id_map is None else id_map[idx])


def logits_log_probs(x: torch.Tensor, norm=None) -> torch.Tensor:
    """Rows of logits -> their float32 log_softmax, each row first scaled by xn's 1 / rms when norm =
    (xn [R, Dm], eps) (a folded RMSNorm): what `vocab_topk(logits=True, norm=)` ranks."""
    x = x.float()
    if norm is not None:
        from ssv.ops.glue.naive import row_rsqrt
        x = x * row_rsqrt(*norm)
    return x.log_softmax(-1)


def rank_topk_naive(x: torch.Tensor, k: int, largest: bool = True, by_index: bool = False):
    """x [R, N] -> the first k entries of a stable sort (descending when largest), values and int64
    indices; by_index: those entries in ascending index order."""
    vals, idx = torch.sort(x, dim=-1, descending=largest, stable=True)
    vals, idx = vals[..., :k], idx[..., :k]
    if by_index:
        idx = idx.sort(-1).values
        vals = x.gather(-1, idx)
    return vals, idx


def row_argmax_naive(x: torch.Tensor) -> torch.Tensor:
    """x [R, V] -> int64 [R]: torch.argmax over each row (the lower index on ties, the first NaN first)."""
    return x.argmax(-1)
