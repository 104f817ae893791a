"""Plain-PyTorch twin of one draft-tree level (the glue `grow_tree` ran as ~15 tensor ops a level)."""
from __future__ import annotations

import torch

from ssv.ops.topk.naive import rank_topk_naive


def tree_level_naive(vals, toks, t: int, base: int, root, front, rows_in, tok, par, score, front_out, ftok_out,
                     fpar_out, rows_out) -> None:
    """Level t's candidates into the pool and the next frontier (see ops.tree_level for the layout).

    vals, toks [R, K]: each frontier node's K best children (float64 log-probs, descending; token ids);
    R = 1 at level 1 (the root, whose entries root [1] and score 0 are written too), else front [R]
    holds the frontier's pool ids and rows_in [R, D] their ancestors' scratch rows.
    Writes tok / par / score [base, base + R K), then the K best candidates by cumulative score
    (descending, ties to creation order) as the next frontier: front_out [K] pool ids, ftok_out [K]
    tokens, fpar_out [K] the parent's scratch row ((t - 2) K + r, -1 at level 1), rows_out [K, D] the
    parent's rows with the node's own row (t - 1) K + j at column t - 1."""
    R, K = vals.shape
    D = rows_out.shape[1]
    dev = vals.device
    kk = slice(base, base + R * K)
    if t == 1:
        tok[:1] = root
        par[:1] = -1
        score[:1] = 0.0
        pid = torch.zeros(1, dtype=torch.long, device=dev)
    else:
        pid = front[:R]
    tok[kk] = toks.reshape(-1)
    par[kk].view(R, K).copy_(pid[:, None].expand(R, K))
    cs = torch.add(score[pid][:, None], vals, out=score[kk].view(R, K)).view(-1)
    _, best = rank_topk_naive(cs[None], K)
    best = best[0]
    src = best // K
    j = torch.arange(K, device=dev)
    front_out.copy_(best + base)
    ftok_out.copy_(toks.reshape(-1)[best])
    if t == 1:
        fpar_out.fill_(-1)
        rows = torch.full((K, D), -1, dtype=torch.long, device=dev)
    else:
        fpar_out.copy_((t - 2) * K + src)
        rows = rows_in[src].clone()
    if t - 1 < D:
        rows[:, t - 1] = (t - 1) * K + j
    rows_out.copy_(rows)


def tree_finish_naive(tok, par, score, dlen, T: int, K: int, D: int, order: str, spares: int = 0):
    """The kept tree of a grown pool, flattened in `order`, with its mask and positions: the tensor
    form (`ssv.spec.device._kept` and `flatten_device_masked`, ~75 launches on CUDA).

    tok / par / score [M] the pool (int64, int64, float64; M = 1 + K + (D - 1) K^2); dlen [1] the
    committed length. Returns tokens, parents, scores (float32), depth, pos = dlen + depth [T] and the
    ancestor mask [T, T] bool, in the traversal order. spares: then the next `spares` nodes by rank
    (`ssv.spec.lookup.grow_spares`): tokens, parents, scores, depth [spares]."""
    from ssv.spec.device import _kept, flatten_device_masked   # lazily: ssv.spec.device imports ops
    from ssv.spec.tree import TreeSpec
    if spares:
        from ssv.spec.lookup import grow_spares
        flat, mask, pos, sp = grow_spares(tok, par, score, T, spares, K, order, D, dlen)
        return flat.tokens, flat.parents, flat.scores, flat.depth, pos, mask, sp.tokens, sp.parents, sp.scores, sp.depth
    flat, _, mask = flatten_device_masked(_kept(tok, par, score, T, K), order, TreeSpec(D, K, T))
    return flat.tokens, flat.parents, flat.scores, flat.depth, dlen.long() + flat.depth, mask
