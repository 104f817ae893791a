"""Drafting from the context: the tokens that followed the latest earlier occurrence of the text's
current suffix (prompt lookup), as one chain beside the head's tree.

A long document's continuation repeats it: names, option lists, phrases. The target's own greedy
continuation of a held-out man page follows the suffix lookup's first token 85% of the time where the
head's first choice is right 50% (`scripts/lookup_probe_cpu.py`). The head cannot copy a rare name
it has no row for; a lookup can, at the cost of K more verified rows.

`context_lookup` works on a fixed buffer in fixed shapes (no host read: a graphed round can run it);
`attach_chain` puts its proposal into a host `DraftTree` in the place of the head's lowest-ranked
nodes (`attach_chain_device` and `grow_spares` in fixed shapes): a round without a proposal verifies
the head's whole tree, one with a proposal gives up only as many of its nodes as the chain needs. A chain node's
token is verified like any other, so greedy strict output is unchanged. Sampled rounds use it too:
a looked-up token is one more deterministic candidate, which `ssv.spec.accept`'s rule (sequential
sampling without replacement) accepts with exactly the target's probability, so the emitted
distribution is unchanged (the chi-square tests in tests/engine/test_spec.py).
"""
from __future__ import annotations

import torch

from ssv.spec.tree import DraftTree

NGRAMS = (2, 4)   # the suffix lengths tried, the longest found wins


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


def attach_chain(tree: DraftTree, chain: list, spares: int) -> DraftTree:
    """The head's tree with `chain` (tokens after the root) in the place of its `spares`
    lowest-ranked nodes (score, then index: the kept set's order). The chain's prefix that the other
    nodes hold is walked as greedy acceptance walks it (`sorted_children`); the rest (r tokens)
    hangs under the last node reached, and min(r, spares) of the lowest-ranked spares give way. A
    chain node scores its parent's score: it comes first among its siblings, so acceptance prefers
    it to a spare with its token. spares = len(chain) = K: always n nodes (a fixed-shape round's);
    spares = 0: the tree and the chain's new nodes. Returns main nodes, chain, spares, parents first
    (a spare's parent ranks before it)."""
    n = tree.n
    if not 0 <= spares < n:
        raise ValueError(f"attach_chain: {spares} spares of a {n}-node tree")
    tokens, parents, scores = tree.tokens.tolist(), tree.parents.tolist(), tree.scores.tolist()
    ranked = sorted(range(1, n), key=lambda i: (-scores[i], i))
    spare = ranked[n - 1 - spares:]
    gone = set(spare)
    main = [i for i in range(n) if i not in gone]
    orphan = next((i for i in main[1:] if parents[i] in gone), None)
    if orphan is not None:   # a drafter's tree ranks a node below its parent (cumulative scores)
        raise ValueError(f"attach_chain: node {orphan} ranks above its parent {parents[orphan]}: the tree's "
                         "scores must not rise along a path")
    kids = {}
    for i in main[1:]:
        kids.setdefault(parents[i], []).append(i)
    at, held = 0, 0
    while held < len(chain):
        nxt = next((c for c in sorted(kids.get(at, ()), key=lambda c: (-scores[c], c)) if tokens[c] == chain[held]),
                   None)
        if nxt is None:
            break
        at, held = nxt, held + 1
    new = {old: i for i, old in enumerate(main)}
    t2, p2, s2 = [tokens[i] for i in main], [-1] + [new[parents[i]] for i in main[1:]], [scores[i] for i in main]
    for j, t in enumerate(chain[held:]):
        t2.append(int(t))
        p2.append(new[at] if j == 0 else len(t2) - 2)
        s2.append(scores[at])
    for old in spare[:max(0, spares - (len(chain) - held))]:
        new[old] = len(t2)
        t2.append(tokens[old])
        p2.append(new[parents[old]])
        s2.append(scores[old])
    return DraftTree(torch.tensor(t2, dtype=torch.long), torch.tensor(p2, dtype=torch.long),
                     torch.tensor(s2, dtype=torch.float32))


def attach_chain_device(tree, mask: torch.Tensor, pos: torch.Tensor, spare, toks: torch.Tensor, valid: torch.Tensor,
                        compact: bool = False):
    """`attach_chain` in fixed shapes, on a flattened `DeviceTree` of T nodes with its ancestor mask
    [T, T] and positions [T] (`grow_flat`'s) and the K spares after it (`grow_spares`: a DeviceTree
    whose parents index the T nodes or, as T + i, spare i). The valid chain's prefix the tree holds
    is walked as the greedy walk would; the rest (r tokens) takes slots T..T + r - 1 under the last
    node reached, and spares 0..K - r - 1 take the slots after it. Returns (tree, mask, pos) of
    T + K nodes, parents first. compact: the spares' slots dropped, T + r nodes (a shape that
    depends on the data: the CPU's round, where a verified row costs and nothing is captured)."""
    from ssv.spec.device import DeviceTree
    T, K, dev = tree.n, toks.numel(), toks.device
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
    real = (held + j < K) & valid[(held + j).clamp(max=K - 1)]
    r = real.sum().reshape(1)
    chain = j < r
    src = (held + j).clamp(max=K - 1)
    sp = (j - r).clamp(min=0)                                        # the spare a slot holds
    sp_par = spare.parents[sp]
    parents = torch.where(chain, torch.where(j == 0, cur, T + j - 1), torch.where(sp_par >= T, sp_par + r, sp_par))
    tokens = torch.where(chain, toks[src], spare.tokens[sp])
    depth = torch.where(chain, tree.depth[cur] + 1 + j, spare.depth[sp])
    scores = torch.where(chain, tree.scores[cur], spare.scores[sp].to(tree.scores.dtype))
    full = torch.zeros(T + K, T + K, dtype=torch.bool, device=dev)
    full[:T, :T] = mask
    cols = torch.arange(T + K, device=dev)
    for i in range(K):   # a node sees its parent's ancestors and itself (parents come first)
        full[T + i] = full.index_select(0, parents[i:i + 1])[0] | (cols == T + i)
    out = DeviceTree(torch.cat([tree.tokens, tokens]), torch.cat([tree.parents, parents]),
                     torch.cat([tree.scores, scores]), torch.cat([tree.depth, depth]))
    pos = torch.cat([pos, pos[:1] + depth])
    if compact:
        keep = cols < T + r
        out = DeviceTree(out.tokens[keep], out.parents[keep], out.scores[keep], out.depth[keep])
        full, pos = full[keep][:, keep], pos[keep]
    return out, full, pos


def grow_spares(tok, par, score, T: int, K: int, k: int, order: str, spec_depth: int, dlen):
    """A grown pool's (`ssv.spec.device.grow_pool`) kept tree of T nodes, flattened in `order` with
    its mask and positions (what `grow_flat` gives), and the next K candidates by rank (score, then
    pool index: `_kept`'s order) as spares (a DeviceTree; parents index the flattened T nodes or,
    as T + i, spare i: a spare's parent ranks before it). The tensor form (the CPU's)."""
    from ssv.spec.device import DeviceTree, _kept_at, _stable_top, flatten_device_masked, pool_depth
    from ssv.spec.tree import TreeSpec
    M, dev = tok.numel(), tok.device
    # one ranking: its first T - 1 are the kept set (`_kept`'s, in pool order), the next K the spares
    ranked = _stable_top(score[1:], T + K - 1)[1] + 1
    kept = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), ranked[:T - 1].sort().values])
    flat, perm, mask = flatten_device_masked(_kept_at(tok, par, score, kept, k), order, TreeSpec(spec_depth, k, T))
    spares = ranked[T - 1:]
    where = torch.full((M,), -1, dtype=torch.long, device=dev)
    where[kept[perm]] = torch.arange(T, device=dev)
    where[spares] = T + torch.arange(K, device=dev)
    spare = DeviceTree(tok[spares], where[par[spares]], score[spares].float(), pool_depth(spares, k))
    return flat, mask, dlen.long() + flat.depth, spare


def no_spares(tree, K: int):
    """K placeholder spares for `attach_chain_device(compact=True)`, which drops them: copies of the
    root's child at index 1 (of the root itself in a root-only tree: the chain alone drafts), under
    the root."""
    from ssv.spec.device import DeviceTree
    one = torch.ones(K, dtype=torch.long, device=tree.tokens.device)
    tok = tree.tokens[min(1, tree.tokens.numel() - 1)]
    return DeviceTree(tok * one, 0 * one, torch.full((K,), float("-inf"), device=one.device), one)


def grow_with_chain(expand, root_token: torch.Tensor, root_logp: torch.Tensor, opts, dlen: torch.Tensor,
                    hist: torch.Tensor, ids=None, fused: bool = False, best: torch.Tensor = None):
    """A device round's draft with a context lookup (`opts.lookup` = K, SpecOptions): the head's
    tree (`grow_flat`'s flattened tree, mask, positions) with the chain looked up in `hist` (the
    text's tokens by position, the root at dlen) attached. With spares the head grows K candidates
    more for the chain to displace (fixed rows); without, the chain's new nodes come after the tree.
    fused (the kernel round's; spares only): the lookup and the attachment in two launches
    (`ssv.ops.lookup`; best: its workspace, `lookup_workspace`, owned by the caller) where the tensor
    form is ~290 small ops."""
    from ssv.spec.device import DeviceTree, _tree_finish, grow_flat, grow_pool
    from ssv.spec.tree import TreeSpec
    spec, K = opts.tree, opts.lookup
    if not opts.spares:
        flat, mask, pos = grow_flat(expand, root_token, root_logp, spec, opts.order, dlen, ids=ids)
        toks, valid = context_lookup(hist, dlen.long() + 1, K)
        return attach_chain_device(flat, mask, pos, no_spares(flat, K), toks, valid, compact=True)
    big = TreeSpec(spec.depth, spec.top_k, spec.total_tokens + K)
    pool = grow_pool(expand, root_token, root_logp, big, ids)
    # the kept tree and its K spares: on CUDA the tree finish's one launch (ssv/ops/tree), as grow_flat's
    finish = _tree_finish(root_logp, spec.total_tokens, big.max_nodes)
    tok, par, sc, dep, pos, mask, *sp = finish(*pool, dlen, spec.total_tokens, spec.top_k, spec.depth, opts.order,
                                               spares=K)
    flat, spare = DeviceTree(tok, par, sc, dep), DeviceTree(*sp)
    if fused:
        from ssv.ops.lookup.ops import lookup_attach
        return lookup_attach(hist, dlen, flat, mask, pos, spare, K, best=best, length_offset=1)
    toks, valid = context_lookup(hist, dlen.long() + 1, K)
    return attach_chain_device(flat, mask, pos, spare, toks, valid)
