"""The speculative round's tree work as fixed-shape tensor ops: no host sync, no Python loop over nodes.

Device twins of `tree.build_tree`, `tree.flatten` and `tree.tree_metadata` (same trees, same orders;
tests compare them on random inputs, ties included); the acceptance is in `ssv.spec.device_accept`.
Shapes depend only on the tree spec (depth, top-k, total tokens), never on the context or on the
data, so a round built from them can be captured in one CUDA graph. Loops run over tree levels
(the spec's depth), not over nodes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Union

import torch

from ssv.spec.tree import ORDERS, TreeSpec, top_k_stable

# BFS/DFS orders sort by a key of sibling ranks packed one digit per level (rank + 1 <= top_k, so
# top_k.bit_length() bits a digit) above the depth: that must fit an int64.
def _key_bits(spec: TreeSpec) -> int:
    return spec.top_k.bit_length()


@dataclass
class DeviceTree:
    """A draft tree as device tensors, [T] each; node 0 is the root, parents precede children."""

    tokens: torch.Tensor    # int64
    parents: torch.Tensor   # int64, -1 for the root
    scores: torch.Tensor    # float32 (cumulative draft log-prob; ranks siblings, as DraftTree's)
    depth: torch.Tensor     # int64

    @property
    def n(self) -> int:
        return self.tokens.numel()


def check_spec(spec: TreeSpec) -> None:
    """The shapes a device round supports: a full pool and levels that fit the order keys."""
    if _key_bits(spec) * spec.depth + 6 > 62:
        raise ValueError(f"a device-resident round orders trees of depth x bits(top-k) <= 56, got depth "
                         f"{spec.depth} with top-k {spec.top_k}")
    if spec.total_tokens > spec.max_nodes:
        raise ValueError(f"tree of {spec.total_tokens} tokens exceeds its candidate pool of {spec.max_nodes} "
                         f"(depth {spec.depth}, top-k {spec.top_k}); a device round keeps exactly total_tokens")


class Logits(NamedTuple):
    """An expand's rows as logits [F, V] instead of log-probs: the top-k takes their log_softmax (on
    CUDA inside its one launch, so the row's log_softmax is no launch of its own). norm (xn [F, Dm],
    eps): x projected the un-normalized rows xn through a weight with their RMSNorm's folded in, and
    each row is first scaled by xn's 1 / rms (the norm's launch saved as well)."""
    x: torch.Tensor
    norm: Optional[tuple] = None

    def log_probs(self) -> torch.Tensor:
        """The rows' float32 log-probs, as the top-k's launch takes them."""
        from ssv.ops.topk.naive import logits_log_probs
        return logits_log_probs(self.x, self.norm)


# expand(level, tokens [F], parent_rows [F], path_rows [F, depth]) -> log-probs [F, V] of each frontier
# node's children (or their `Logits`). Frontier nodes of level t >= 2 get rows (t - 2) * top_k + r (the
# drafter's scratch rows); parent_rows is -1 for a child of the root, path_rows lists the rows of the
# node's ancestors at depth >= 1 and its own, -1 padded.
ExpandFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], Union[torch.Tensor, Logits]]


def _stable_top(x: torch.Tensor, k: int, largest: bool = True, by_index: bool = False):
    """Top-k along the last dim, ties to the lower index (a stable descending sort, as build_tree's;
    ascending when not largest); by_index: the same k entries in index order. On CUDA a short row
    is one rank launch (ssv/ops/topk) instead of a radix sort: 5 of a round's sorts took ~8 us each
    and the kept set's ~33 us on the H200."""
    if x.is_cuda:
        from ssv.ops.topk.ops import MAX_RANK_N, rank_topk   # lazily: Triton reads its mode at import
        if x.shape[-1] <= MAX_RANK_N:
            v, i = rank_topk(x.reshape(-1, x.shape[-1]).contiguous(), k, largest, by_index)
            return v.reshape(*x.shape[:-1], k), i.reshape(*x.shape[:-1], k)
    from ssv.ops.topk.naive import rank_topk_naive
    return rank_topk_naive(x, k, largest, by_index)


def _vocab_top(lp: Union[torch.Tensor, Logits], k: int, ids: Optional[torch.Tensor] = None, clamp: bool = False):
    """`_stable_top` over vocabulary rows of float32 log-probs (or the `Logits` they are the
    log_softmax of): on CUDA one Triton launch (ssv/ops/topk); for rows past its size and on the CPU
    `top_k_stable`, one top-k of an int64 key that orders by value, then by the lower index (a top-k,
    whose capture was checked on the H200; a long-row sort's was not; on the CPU no sort of the row).
    Values are ranked in float32 (what log_softmax gives; exact for their float64).
    ids: indices returned as ids[index] (token ids of a draft vocabulary); clamp: values capped at
    0 (log-probs a rounding put above 0). The kernel does both in its launch."""
    logits = isinstance(lp, Logits)
    x = lp.x if logits else lp
    if x.is_cuda and x.dim() == 2:
        from ssv.ops.topk.ops import MAX_V, vocab_topk   # lazily: Triton reads its mode at import
        if x.shape[-1] <= MAX_V:
            return vocab_topk(x.contiguous(), k, ids, clamp=clamp, logits=logits, norm=lp.norm if logits else None)
    if logits:
        lp = lp.log_probs()
    if lp.is_cuda and lp.dim() != 2:
        vals, t = _stable_top(lp.double(), k)
    else:
        vals, t = top_k_stable(lp, k)
        vals = vals.double()
    return (vals.clamp_max(0.0) if clamp else vals), (t if ids is None else ids[t])


def grow_tree(expand: ExpandFn, root_token: torch.Tensor, root_logp: torch.Tensor, spec: TreeSpec,
              ids: Optional[torch.Tensor] = None) -> DeviceTree:
    """`build_tree` in fixed shapes: the same pool, frontiers and kept set, in creation order.

    ids: log-probs (root_logp and expand's) are over these ascending token ids instead of the whole
    vocabulary (the draft vocabulary): the same ranking, as ids off it have log-prob -inf."""
    return _kept(*grow_pool(expand, root_token, root_logp, spec, ids), spec.total_tokens, spec.top_k)


def grow_flat(expand: ExpandFn, root_token: torch.Tensor, root_logp: torch.Tensor, spec: TreeSpec, order: str,
              dlen: torch.Tensor, ids: Optional[torch.Tensor] = None):
    """`grow_tree`, then `flatten_device_masked` in `order` and the positions dlen + depth: (the
    flattened tree, its mask [T, T], pos [T]). On CUDA the kept set, the order, the mask and the
    positions are one launch (ssv/ops/tree) where the tensor form is ~75."""
    pool = grow_pool(expand, root_token, root_logp, spec, ids)
    D, k, T = spec.depth, spec.top_k, spec.total_tokens
    finish = _tree_finish(root_logp, T, spec.max_nodes)
    tok, par, score, depth, pos, mask = finish(*pool, dlen, T, k, D, order)
    return DeviceTree(tok, par, score, depth), mask, pos


def grow_pool(expand: ExpandFn, root_token: torch.Tensor, root_logp: torch.Tensor, spec: TreeSpec,
              ids: Optional[torch.Tensor] = None):
    """`grow_tree`'s candidate pool: tok, par, score [max_nodes] (int64, int64, float64), the root
    then every level's k * k candidates in creation order (the root alone, scored 0, when T = 1)."""
    check_spec(spec)
    D, k, T = spec.depth, spec.top_k, spec.total_tokens
    dev = root_logp.device
    M = spec.max_nodes
    if T == 1:
        tok = torch.zeros(M, dtype=torch.long, device=dev)
        tok[0] = root_token
        return tok, torch.full((M,), -1, dtype=torch.long, device=dev), torch.zeros(M, dtype=torch.float64, device=dev)
    # every pool entry is written by its level: the root and level 1, then k * k a level
    tok = torch.empty(M, dtype=torch.long, device=dev)
    par = torch.empty(M, dtype=torch.long, device=dev)
    score = torch.empty(M, dtype=torch.float64, device=dev)
    # the frontier (pool ids, tokens, parents' scratch rows, ancestors' rows) a level reads and the
    # one it writes, alternating
    fr = [(torch.empty(k, dtype=torch.long, device=dev), torch.empty(k, dtype=torch.long, device=dev),
           torch.empty(k, dtype=torch.long, device=dev), torch.empty(k, D, dtype=torch.long, device=dev))
          for _ in range(2)]
    level = _tree_level(root_logp, k)
    # level 1: the root's children, proposed lowest token id first on equal log-probs
    v1, t1 = _vocab_top(root_logp.reshape(1, -1), k, ids, clamp=True)
    level(v1, t1, 1, 1, root_token.reshape(1), None, None, tok, par, score, *fr[0])
    base = 1 + k
    # level t's candidates are the pool's contiguous range [base, base + k * k)
    for t in range(2, D + 1):
        front, f_tok, f_parent, f_rows = fr[t % 2]
        vals, toks = _vocab_top(expand(t, f_tok, f_parent, f_rows), k, ids, clamp=True)   # [k, k] of [k, V]
        level(vals, toks, t, base, None, front, f_rows, tok, par, score, *fr[(t + 1) % 2])
        base += k * k
    return tok, par, score


def _tree_level(x: torch.Tensor, k: int):
    """A level's pool writes and next frontier: on CUDA one launch (ssv/ops/tree) for up to 256
    candidates, else the tensor form."""
    if x.is_cuda:
        from ssv.ops.tree.ops import MAX_CANDIDATES, tree_level   # lazily, as the top-k
        if k * k <= MAX_CANDIDATES:
            return tree_level
    from ssv.ops.tree.naive import tree_level_naive
    return tree_level_naive


def _tree_finish(x: torch.Tensor, T: int, M: int):
    """The kept set, order, mask and positions of a grown pool: on CUDA one launch (ssv/ops/tree) for
    up to 64 kept of 1024 pool nodes, else the tensor form."""
    if x.is_cuda:
        from ssv.ops.tree.ops import MAX_POOL, MAX_TREE, tree_finish   # lazily, as the top-k
        if T <= MAX_TREE and M <= MAX_POOL:
            return tree_finish
    from ssv.ops.tree.naive import tree_finish_naive
    return tree_finish_naive


def _kept(tok, par, score, T: int, k: int = 1) -> DeviceTree:
    kept = torch.zeros(1, dtype=torch.long, device=tok.device)
    if T > 1:   # (the rank kernel takes k >= 1)
        kept = torch.cat([kept, _stable_top(score[1:], T - 1, by_index=True)[1] + 1])
    return _kept_at(tok, par, score, kept, k)


def pool_depth(i: torch.Tensor, k: int) -> torch.Tensor:
    """A pool node's depth, fixed by where it was created: the root, k children, then k*k a level."""
    return torch.where(i == 0, 0, torch.where(i <= k, 1, 2 + (i - 1 - k).clamp_min(0) // (k * k)))


def _kept_at(tok, par, score, kept: torch.Tensor, k: int) -> DeviceTree:
    """The pool's nodes `kept` (the root first, ascending pool ids) as a tree."""
    new_index = torch.full((tok.numel(),), -1, dtype=torch.long, device=tok.device)
    new_index[kept] = torch.arange(kept.numel(), device=tok.device)
    parents = torch.where(par[kept] >= 0, new_index[par[kept].clamp_min(0)], par[kept])
    return DeviceTree(tok[kept], parents, score[kept].float(), pool_depth(kept, k))


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[T, T] bool: mask[q, s] iff s is q or an ancestor of q (tree_metadata's mask)."""
    n = parents.numel()
    ar = torch.arange(n, device=parents.device)
    # up[q, j]: q's ancestor j levels up, -1 past the root: a parents table with a trailing -1, so
    # that indexing it at -1 (the last entry) stays -1 -- one launch a level
    up_of = torch.cat([parents, parents.new_full((1,), -1)])
    cols = [ar]
    for _ in range(max_depth):
        cols.append(up_of[cols[-1]])
    up = torch.stack(cols, 1)                                                  # [T, D + 1]
    return (up[:, :, None] == ar[None, None, :]).any(1)


def sibling_rank(tree: DeviceTree) -> torch.Tensor:
    """Each node's rank among its siblings: descending score, ties to the lower index (sorted_children)."""
    p, s = tree.parents, tree.scores
    idx = torch.arange(tree.n, device=p.device)
    before = (s[None, :] > s[:, None]) | ((s[None, :] == s[:, None]) & (idx[None, :] < idx[:, None]))
    return ((p[None, :] == p[:, None]) & before).sum(1)


def flatten_device(tree: DeviceTree, order: str, spec: TreeSpec):
    """`flatten` on the device: (tree in the traversal order, perm with perm[new] = old)."""
    flat, perm, _ = flatten_device_masked(tree, order, spec)
    return flat, perm


def flatten_device_masked(tree: DeviceTree, order: str, spec: TreeSpec):
    """`flatten_device` and the flattened tree's `ancestor_mask` (permuted, not recomputed)."""
    if order not in ORDERS:
        raise ValueError(f"flatten: order must be one of {ORDERS}, got {order!r}")
    check_spec(spec)
    max_depth, bits = spec.depth, _key_bits(spec)
    mask = ancestor_mask(tree.parents, max_depth)
    # a node's digit at its own depth: rank + 1 (0 = no node at that level, so an ancestor sorts
    # before its subtree: preorder); the key of a node is the digits of its root-to-node path
    digit = (sibling_rank(tree) + 1) * (tree.depth > 0)
    weight = (digit << (bits * (max_depth - tree.depth).clamp_min(0))) * (tree.depth > 0)
    key = (mask.long() * weight[None, :]).sum(1)
    if order in ("bfs", "pos"):  # level order: depth first, then the same path key
        key = key + (tree.depth << (bits * max_depth))
    perm = _stable_top(key, tree.n, largest=False)[1]
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(tree.n, device=perm.device)
    old_par = tree.parents[perm]
    parents = torch.where(old_par >= 0, inverse[old_par.clamp_min(0)], old_par)
    flat = DeviceTree(tree.tokens[perm], parents, tree.scores[perm], tree.depth[perm])
    return flat, perm, mask[perm][:, perm]
