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


def round_record_naive(tokens, path, length, bonus):
    """The round's record from an accepted path [D + 1] (-1 padded), its length [1] and bonus [1]:
    rows = the path with padding at the root, and the token after each row (the next accepted
    node's token, the bonus after the last). Returns (rows, nxt), [D + 1] each."""
    rows = path.clamp_min(0)
    j = torch.arange(path.numel(), device=path.device)
    nxt = torch.where(j == length - 1, bonus, tokens[torch.cat([rows[1:], rows[:1]])])
    return rows, nxt


def accept_greedy_round_naive(parents, tokens, scores, best, max_depth: int, length, nxt, bonus):
    """`accept_greedy_round` as tensor ops: the walk, then the record copied into the buffers."""
    path, n, b = accept_greedy_walk_naive(parents, tokens, scores, best, max_depth)
    rows, after = round_record_naive(tokens, path, n, b)
    length.copy_(n)
    nxt.copy_(after)
    bonus.copy_(b)
    return path, rows
