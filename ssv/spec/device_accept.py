"""The speculative round's acceptance as fixed-shape tensor ops (the device twins of
`accept.accept_greedy` and `accept.accept_sample`; same paths and bonus tokens for the same inputs
and coins), and the dispatch to their Triton kernels on CUDA (`ssv.ops.accept`). The tree work they
read is in `ssv.spec.device`.
"""
from __future__ import annotations

import torch

from ssv.ops.accept.naive import accept_greedy_round_naive, accept_greedy_walk_naive, round_record_naive
from ssv.spec.accept import probs_unchecked
from ssv.spec.device import DeviceTree, sibling_rank


def target_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[T, V] -> [T] int64, torch.argmax's (lowest id on ties); on CUDA in two launches over the whole
    GPU (`ssv.ops.topk.row_argmax`) instead of torch's one block a row."""
    if logits.is_cuda and logits.stride(-1) == 1:
        from ssv.ops.topk.ops import row_argmax   # lazily, as the walks
        return row_argmax(logits)
    return logits.argmax(-1)


def accept_greedy_device(tree: DeviceTree, logits: torch.Tensor, max_depth: int):
    """`accept_greedy` on the device. Returns (path [max_depth + 1] node ids, -1 padded; its length
    [1] int64, root included; bonus [1] int64): the target's argmax (lowest id on ties) followed
    through the tree, the first matching child in sibling order."""
    best = target_argmax(logits)                                              # [T]
    if logits.is_cuda:
        from ssv.ops.accept.ops import MAX_T, accept_greedy_walk   # lazily, as the top-k
        if tree.n <= MAX_T:
            return accept_greedy_walk(tree.parents, tree.tokens, tree.scores, best, max_depth)
    return accept_greedy_walk_naive(tree.parents, tree.tokens, tree.scores, best, max_depth)


def accept_greedy_round(tree: DeviceTree, logits: torch.Tensor, max_depth: int, length: torch.Tensor,
                        nxt: torch.Tensor, bonus: torch.Tensor) -> tuple:
    """`accept_greedy_device` and the round's record (`ssv.ops.accept.naive.round_record_naive`),
    written into the caller's length [1], nxt [max_depth + 1] and bonus [1]; on CUDA one launch after
    the argmax. Returns (path, rows) [max_depth + 1] each."""
    best = target_argmax(logits)                                              # [T]
    if logits.is_cuda:
        from ssv.ops.accept.ops import MAX_T, accept_greedy_round as walk   # lazily, as the top-k
        if tree.n <= MAX_T:
            return walk(tree.parents, tree.tokens, tree.scores, best, max_depth, length, nxt, bonus)
    return accept_greedy_round_naive(tree.parents, tree.tokens, tree.scores, best, max_depth, length, nxt, bonus)


def child_table(tree: DeviceTree, k: int) -> torch.Tensor:
    """[T, k] int64: the children of each node in sibling order (descending score, ties to the lower
    index: `sorted_children`), -1 padded. k bounds the children of a node (the spec's top-k)."""
    T, dev = tree.n, tree.parents.device
    rank = sibling_rank(tree)
    slot = torch.where(tree.parents >= 0, tree.parents * k + rank.clamp_max(k - 1), T * k)   # root: the dump
    table = torch.full((T * k + 1,), -1, dtype=torch.long, device=dev)
    table.index_copy_(0, slot, torch.arange(T, device=dev))
    return table[: T * k].view(T, k)


def accept_sample_device(tree: DeviceTree, logits: torch.Tensor, params, coins: torch.Tensor, depth: int, top_k: int):
    """`accept.accept_sample` on the device (the same path and bonus for the same coins): at node u
    the children are tried in sibling order, child j with token x_j accepted when coin[u, j] * R_j <
    q_j, where q_j = p_u(x_j) (0 for a token an earlier sibling already carried) and R_j the mass
    not yet removed (p_u's total minus q_1..q_{j-1}): that is coin < p(x_j) renormalised, as the
    host walk. On a rejection of every child the bonus is drawn by inverse CDF with coin[u, -1]
    from p_u with the tried tokens removed. coins [T, top_k + 1] uniforms in [0, 1). depth, top_k:
    the longest path and the most children of a node (the head's, or one more of each with a chain
    from the context). Returns (path [depth + 1] -1 padded, length [1], bonus [1])."""
    k, D = top_k, depth
    T, V = logits.shape
    dev = logits.device
    probs = probs_unchecked(logits, params).double()                         # [T, V]
    # every node's decision at once: a node's coins are its own, so whether a walk that reaches u
    # goes on (and to which child) does not depend on how it got there (102 ops at T = 48, k = 9,
    # D = 8, where a walk level by level took 474: scripts/count_accept_ops.py)
    kids = child_table(tree, k)                                               # [T, k]
    valid = kids >= 0
    x = tree.tokens[kids.clamp_min(0)]                                        # [T, k]
    tri = torch.ones(k, k, dtype=torch.bool, device=dev).tril(-1)             # [j, i]: i before j
    dup = ((x[:, :, None] == x[:, None, :]) & valid[:, None, :] & tri).any(-1)
    q = torch.where(valid & ~dup, probs.gather(1, x), 0.0)                    # [T, k]
    R = probs.sum(-1, keepdim=True) - (q.cumsum(-1) - q)
    # the last token with mass left is always accepted (the host's p[x] = a / a = 1 exactly;
    # R - q here is a difference of sums, so it is taken as zero within rounding)
    last = (q > 0) & (R - q <= 1e-12 * R)
    acc = valid & ((coins[:T, :k].double() * R < q) | last)   # coins: a bucket's rows, the tree may use fewer
    found = acc.any(-1)                                                       # [T]
    nxt = kids.gather(1, torch.argmax(acc.to(torch.int8), -1, keepdim=True))[:, 0]
    # on the path: every node from the root down was its parent's accepted child (pointer doubling
    # over the ancestors: ceil(log2(D + 1)) steps)
    par = tree.parents.clamp_min(0)
    good = (tree.parents < 0) | (found[par] & (nxt[par] == torch.arange(T, device=dev)))
    up = par
    for _ in range(max(1, D.bit_length())):
        good = good & good[up]
        up = up[up]
    depth_of = tree.depth.clamp_max(D + 1)
    path = torch.full((D + 2,), -1, dtype=torch.long, device=dev)
    path.scatter_(0, torch.where(good, depth_of, D + 1), torch.arange(T, device=dev))   # D + 1: a dump
    path = path[: D + 1]
    length = good.sum().reshape(1)
    stop = path.gather(0, length - 1)                                         # the deepest node reached
    # the bonus: inverse CDF at the stop node over what its rejections left (every child was tried)
    xs = x[stop][0]
    removed = torch.zeros(V + 1, dtype=torch.bool, device=dev).index_fill_(0, torch.where(valid[stop][0], xs, V), True)
    p = torch.where(removed[:V], 0.0, probs[stop][0])
    return path, length, sample_device(p, coins[stop, -1])


def accept_sample_round(tree: DeviceTree, logits: torch.Tensor, params, coins: torch.Tensor, depth: int, top_k: int,
                        length: torch.Tensor, nxt: torch.Tensor, bonus: torch.Tensor) -> tuple:
    """`accept_sample_device` and the round's record (`round_record_naive`) written into the caller's
    length [1], nxt [depth + 1] and bonus [1], as `accept_greedy_round`; on CUDA four launches after
    the target's probabilities (`ssv.ops.accept`), where the tensor form is ~115 ops. Returns
    (path, rows) [depth + 1] each."""
    if logits.is_cuda:
        from ssv.ops.accept.ops import MAX_T, accept_sample_round as walk   # lazily, as the top-k
        if tree.n <= MAX_T:
            probs, total = probs_device(logits, params)
            return walk(tree.parents, tree.tokens, tree.scores, probs, coins, depth, top_k, length, nxt, bonus,
                        total=total)
    path, n, b = accept_sample_device(tree, logits, params, coins, depth, top_k)
    rows, after = round_record_naive(tree.tokens, path, n, b)
    length.copy_(n)
    nxt.copy_(after)
    bonus.copy_(b)
    return path, rows


def probs_device(logits: torch.Tensor, params) -> tuple:
    """`probs_unchecked` for a sampled setting, and the rows' fp64 masses when they come with it: on CUDA
    without top-p one launch (`ssv.ops.accept.probs_rows`) where the tensor form takes three; else the tensor
    form and None."""
    if logits.is_cuda and not params.filters and logits.stride(-1) == 1:
        from ssv.ops.accept.ops import probs_rows   # lazily, as the walk
        return probs_rows(logits, params.inv_temperature)
    return probs_unchecked(logits, params).contiguous(), None


def sample_ar_token(logits: torch.Tensor, params, coin: torch.Tensor, out: torch.Tensor, out2: torch.Tensor):
    """An AR step's sampled token on CUDA, written to out [1] and out2 [1] by the step's own launches: straight
    from the logits without top-p (`ssv.ops.accept.sample_logits_row`, two launches), else from the filtered
    probabilities (`sample_row`). logits [1, V]; params: the engine's `DeviceSampling`. Returns out."""
    from ssv.ops.accept.ops import sample_logits_row, sample_row   # lazily, as the walk
    if not params.filters:
        return sample_logits_row(logits, params.inv_temperature, coin, out, out2)
    return sample_row(probs_device(logits, params)[0], coin, out=out, out2=out2)


def sample_device(p: torch.Tensor, coin: torch.Tensor) -> torch.Tensor:
    """`accept.sample_from` in tensor ops: p [V] (unnormalised, >= 0), coin [1] in [0, 1) -> [1] int64,
    the first index whose CDF exceeds coin x total, never a zero-probability one."""
    p = p.double()
    cdf = p.cumsum(0)
    idx = torch.searchsorted(cdf, coin.double() * cdf[-1:], right=True)
    last_pos = torch.where(p > 0, torch.arange(p.numel(), device=p.device), 0).max().reshape(1)
    return torch.minimum(idx, last_pos)
