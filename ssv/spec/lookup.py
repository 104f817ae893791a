"""Drafting from the context: the tokens that followed the latest earlier occurrence of the text's
current suffix (prompt lookup), as one chain beside the head's tree.

A long document's continuation repeats it: names, option lists, phrases. The target's own greedy
continuation of a held-out man page follows the suffix lookup's first token 85% of the time where the
head's first choice is right 50% (`scripts/lookup_probe_cpu.py`). The head cannot copy a rare name
it has no row for; a lookup can, at the cost of K more verified rows.

`context_lookup` works on a fixed buffer in fixed shapes (no host read: a graphed round can run it);
`attach_chain` puts its proposal into a host `DraftTree` beside the head's nodes. A chain node's
token is verified like any other, so greedy strict output is unchanged; sampled rounds do not use
the chain (its tokens have no draft distribution for the lossless rule).
"""
from __future__ import annotations

import torch

from ssv.spec.tree import DraftTree

NGRAMS = (2, 4)   # the suffix lengths tried, the longest found wins
CHAIN_SCORE = -30.0   # a chain node's score below its parent's: it ranks after the head's siblings


def context_lookup(hist: torch.Tensor, length, k: int, ngrams: tuple = NGRAMS):
    """The k tokens after the latest occurrence of the longest suffix of hist[:length] (of
    ngrams[0]..ngrams[1] tokens) that ends before the last token. hist: [S] int64, entries past
    `length` ignored; length: int or [1] int64 tensor. Returns (tokens [k] int64, valid [k] bool):
    valid is False past the history's end and everywhere when no suffix recurs."""
    lo, hi = ngrams
    if not 1 <= lo <= hi:
        raise ValueError(f"context_lookup: ngrams must be 1 <= lo <= hi, got {ngrams}")
    if k < 1:
        raise ValueError(f"context_lookup: k must be >= 1, got {k}")
    S, dev = hist.numel(), hist.device
    length = torch.as_tensor(length, dtype=torch.long, device=dev).reshape(1)
    start = torch.full((1,), -1, dtype=torch.long, device=dev)   # where the proposal starts
    for n in range(lo, min(hi, S - 1) + 1):   # a longer suffix found overrides a shorter one
        suffix = hist[(length - n + torch.arange(n, device=dev)).clamp(0, S - 1)]   # [n]
        at = torch.arange(S - n + 1, device=dev)
        hit = (hist.unfold(0, n, 1) == suffix).all(1) & (at + n <= length - 1) & (length > n)   # [S - n + 1]
        last = torch.where(hit, at, -1).max().reshape(1)
        start = torch.where(last >= 0, last + n, start)
    pos = start + torch.arange(k, device=dev)
    valid = (start >= 0) & (pos < length)
    return hist[pos.clamp(0, S - 1)], valid


def attach_chain(tree: DraftTree, chain: list) -> DraftTree:
    """`tree` with the chain of tokens `chain` under its root: the chain's prefix that the tree already
    holds (the child greedy acceptance would follow, `sorted_children`) is reused, and the rest hangs
    as new nodes under the last node reused. Nodes keep their indices; new ones come after."""
    tokens, parents, scores = tree.tokens.tolist(), tree.parents.tolist(), tree.scores.tolist()
    at, i = 0, 0
    while i < len(chain):
        nxt = next((c for c in tree.sorted_children(at) if tokens[c] == chain[i]), None)
        if nxt is None:
            break
        at, i = nxt, i + 1
    for t in chain[i:]:
        tokens.append(int(t))
        parents.append(at)
        scores.append(scores[at] + CHAIN_SCORE)
        at = len(tokens) - 1
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                     torch.tensor(scores, dtype=torch.float32))


def chain_of(hist: torch.Tensor, length: int, k: int) -> list:
    """The host's chain: `context_lookup`'s valid tokens as a list."""
    toks, valid = context_lookup(hist, length, k)
    return toks[valid].tolist()


def attach_chain_device(tree, mask: torch.Tensor, pos: torch.Tensor, toks: torch.Tensor, valid: torch.Tensor):
    """`attach_chain` in fixed shapes, on a flattened `DeviceTree` with its ancestor mask [T, T] and
    positions [T] (`grow_flat`'s): always K = toks.numel() nodes more. The chain's prefix the tree
    holds is walked as greedy acceptance would walk it; the rest of the valid chain hangs under
    the last node reached. Slots left over (a prefix held, a short or no proposal) become dead
    nodes: a copy of the root's child at index 1 under the root, scored -inf, which acceptance
    never follows (it takes the higher-scored copy first). Returns (tree, mask, pos) of T + K nodes."""
    from ssv.spec.device import DeviceTree
    T, K, dev = tree.n, toks.numel(), toks.device
    if T < 2:
        raise ValueError("a looked-up chain needs a tree of >= 2 nodes (its dead slots copy a child of the root)")
    idx = torch.arange(T, device=dev)
    cur = torch.zeros(1, dtype=torch.long, device=dev)
    alive = torch.ones(1, dtype=torch.bool, device=dev)
    held = torch.zeros(1, dtype=torch.long, device=dev)
    for i in range(K):   # the walk of ssv.ops.accept's greedy walk, along the chain's tokens
        hit = (tree.parents == cur) & (tree.tokens == toks[i]) & alive & valid[i]
        cand = torch.where(hit, tree.scores, float("-inf"))
        first = torch.where(hit & (cand == cand.max()), idx, T).min().reshape(1)
        found = first < T
        cur = torch.where(found, first, cur)
        held = held + found.long()
        alive = alive & found
    j = torch.arange(K, device=dev)
    src = (held + j).clamp(max=K - 1)
    real = (held + j < K) & valid[src]
    own = T + j
    parents = torch.where(real, torch.where(j == 0, cur, own - 1), 0)
    tokens = torch.where(real, toks[src], tree.tokens[1])
    depth = torch.where(real, tree.depth[cur] + 1 + j, 1)
    scores = torch.where(real, tree.scores[cur] + CHAIN_SCORE * (j + 1).float(), float("-inf"))
    full = torch.zeros(T + K, T + K, dtype=torch.bool, device=dev)
    full[:T, :T] = mask
    for i in range(K):   # a node sees its parent's ancestors and itself (parents come first)
        full[T + i] = full.index_select(0, parents[i:i + 1])[0] | (torch.arange(T + K, device=dev) == T + i)
    out = DeviceTree(torch.cat([tree.tokens, tokens]), torch.cat([tree.parents, parents]),
                     torch.cat([tree.scores, scores.to(tree.scores.dtype)]), torch.cat([tree.depth, depth]))
    return out, full, torch.cat([pos, pos[:1] + depth])
