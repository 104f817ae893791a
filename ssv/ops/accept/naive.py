"""Plain-PyTorch twin of the greedy tree walk (what the CPU round runs)."""
from __future__ import annotations

import torch


def accept_greedy_walk_naive(parents, tokens, scores, best, max_depth: int):
    """`accept_greedy_walk` as tensor ops: fixed shapes, a loop over depths, no host read."""
    dev = best.device
    path = torch.full((max_depth + 1,), -1, dtype=torch.long, device=dev)
    path[:1].zero_()
    # [1] tensors, never 0-dim: indexing with a 0-dim tensor reads it on the host (`.item()`)
    cur = torch.zeros(1, dtype=torch.long, device=dev)
    alive = torch.ones(1, dtype=torch.bool, device=dev)
    length = torch.ones(1, dtype=torch.long, device=dev)
    idx = torch.arange(parents.numel(), device=dev)
    for d in range(1, max_depth + 1):
        hit = (parents == cur) & (tokens == best[cur]) & alive                # [T]
        # the first child in sibling order: the max score, then the lower index (-inf scores too)
        cand = torch.where(hit, scores, float("-inf"))
        first = torch.where(hit & (cand == cand.max()), idx, parents.numel())
        nxt = first.min().reshape(1)
        found = nxt < parents.numel()
        cur = torch.where(found, nxt, cur)
        path[d:d + 1] = torch.where(found, nxt, path[d:d + 1])
        length = length + found.long()
        alive = alive & found
    return path, length, best[cur]
