"""Synthetic inputs of the kernel benchmarks and their byte counts: EAGLE-like trees, selections with a
controlled adjacent overlap, and the bytes a verify step must read (once, and as its work lists read them)."""
from __future__ import annotations

import math

import torch

from ssv.config import NSAConfig

SHAPES = {  # name: (query heads, KV heads, head dim)
    "llama3.1-8b": (32, 8, 128),
    "nsa-1b": (32, 2, 64),
    "smollm2-135m": (9, 3, 64),
}


def eagle_tree(n: int, gen: torch.Generator, max_depth: int = 7):
    """A random EAGLE-like tree of n nodes in BFS order: wide near the root, narrowing with depth."""
    parents, depth = [-1], [0]
    levels = [[0]]
    while len(parents) < n:
        d = len(levels)
        prev = levels[-1] if d < max_depth else levels[-2]
        width = min(n - len(parents), max(1, int(math.ceil(n / max_depth))) if d > 1 else min(8, n - 1))
        lvl = []
        for _ in range(width):
            p = prev[int(torch.randint(0, len(prev), (1,), generator=gen))]
            parents.append(p)
            depth.append(depth[p] + 1)
            lvl.append(len(parents) - 1)
        levels.append(lvl)
    from ssv.spec.flatten import tree_metadata  # the one place tree masks come from
    from ssv.spec.tree import DraftTree
    tree = DraftTree(torch.zeros(n, dtype=torch.long), torch.tensor(parents), torch.zeros(n))
    meta = tree_metadata(tree, 0)
    return meta.depth, meta.mask


def synthetic_selection(pos: torch.Tensor, hkv: int, cfg: NSAConfig, overlap: float, gen: torch.Generator):
    """Selections with a controlled overlap: each query keeps each free block of the previous query
    (in flattened order) with probability `overlap`, else draws a new one. Forced blocks as NSA's."""
    n = pos.numel()
    out = torch.full((n, hkv, cfg.n_select), -1, dtype=torch.int32)
    for h in range(hkv):
        prev = None
        for i in range(n):
            cur = int(pos[i]) // cfg.slc_block
            forced = {0, cur, cur - 1} & set(range(cur + 1))
            pool = [j for j in range(1, max(1, cur - 1))]
            want = cfg.n_select - len(forced)
            keep = [j for j in (prev or []) if j not in forced and float(torch.rand((), generator=gen)) < overlap]
            chosen = set(keep[:want])
            while len(chosen) < min(want, len(pool)):
                chosen.add(pool[int(torch.randint(0, len(pool), (1,), generator=gen))])
            sel = sorted(forced | chosen)
            out[i, h, :len(sel)] = torch.tensor(sel, dtype=torch.int32)
            prev = sorted(chosen)
    return out


def unique_bytes(idx, pos, P, n, cfg, d, elt):
    """Fewest bytes the verify step must read: every needed K/V token once, plus q and o."""
    toks = 0
    for h in range(idx.shape[1]):
        need = set()
        for i in range(n):
            t = int(pos[i])
            need.update(range(max(0, t - cfg.window + 1), P))
            for j in idx[i, h].tolist():
                if j >= 0:
                    need.update(range(j * cfg.slc_block, min(P, (j + 1) * cfg.slc_block)))
        toks += len(need) + n
    return toks * d * 2 * elt


def tile_bytes(idx, pos, P, n, cfg, d, elt, C, approx=False, row_splits=1):
    """K/V bytes the verify kernel's programs load (from L2 or HBM), as its work lists say: per
    (group of C queries, KV head), each tile once -- the union of the group's selected blocks below
    its window region (approximate: the first query's), the window region's tiles, the tree's
    tiles -- times the row splits. Against `unique_bytes`: how often a tile is read again."""
    bs = cfg.slc_block
    tiles = 0
    for g0 in range(0, n, C):
        members = range(g0, min(n, g0 + C))
        lim = max(min(int(pos[i]) for i in members) - cfg.window + 1, 0) // bs
        window_tiles = max(-(-(P - lim * bs) // bs), 0) + -(-n // bs)
        for h in range(idx.shape[1]):
            u = {b for i in (members[:1] if approx else members) for b in idx[i, h].tolist() if 0 <= b < lim}
            tiles += (len(u) + window_tiles) * row_splits
    return tiles * bs * d * 2 * elt


def work_list_bytes(idx, pos, P, n, cfg, hq, d, elt, C, approx=False):
    """`tile_bytes` of the launch `nsa_verify` makes for group size C, its row splits included."""
    from ssv.ops.nsa.verify import tile_rows
    rows = C * (hq // idx.shape[1])
    return tile_bytes(idx, pos, P, n, cfg, d, elt, C, approx, -(-rows // tile_rows(rows)))


def overlap_of(idx):
    """Mean Jaccard overlap of adjacent queries' selections (over KV heads)."""
    vals = []
    for i in range(1, idx.shape[0]):
        for h in range(idx.shape[1]):
            a = {x for x in idx[i - 1, h].tolist() if x >= 0}
            b = {x for x in idx[i, h].tolist() if x >= 0}
            vals.append(len(a & b) / max(1, len(a | b)))
    return sum(vals) / max(1, len(vals))

