"""Launch policy of dense tree verification: row tiles, key tiles, KV splits, warps and stages.

Decided from shapes and the cache's capacity only (never the prefix length of a step), so a captured
graph replays the same launches at any length.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import triton

from ssv.ops.utils import pow2

MAX_ROWS = 64      # (query, head) rows of one program's tile
MAX_SPLITS = 64    # prefix splits (the step's own tokens take one more)
# programs a launch keeps within WAVES per SM, the step's-tokens split included: 2 fit on an SM (3 stages of 16 KB
# K and V tiles). One over is a second wave: the default model's 48-node verify at 4K took 19.2 us at 29 + 1
# splits (270 programs; H100, bench/results/gpu-s50/a/probe-dense.txt) against 17.2 at 28 + 1 (gpu-s50/q0/)
WAVES = 2
# Under PDL a program pulls its split's first key / value tile into L2 before the wait, where the launch is
# latency-bound: one row tile (an AR step) or at most PREFETCH_MAX_TILES key tiles a split at the capacity.
# Graphed steps (H100, bench/results/gpu-s50/b/probe-dense-steps.txt, two runs each): the default model's
# 48-node verify pass 0.825 / 0.819 -> 0.806 / 0.802 ms at 4K (1-2 tiles a split), 0.859 / 0.873 -> 0.845 / 0.843
# at 8K; its AR step on this kernel 0.604 / 0.597 ms against 0.632 / 0.649 on the NSA verify kernel's window form;
# but the Llama verify pass (13-100 tiles a split) 9.809 / 9.815 -> 9.907 / 9.891 ms at 64K, 13.67 / 13.72 ->
# 13.82 / 13.89 at 128K: there the prefetch only competes with the previous kernel for bandwidth
PREFETCH_MAX_TILES = 4


@dataclass(frozen=True)
class DenseLaunch:
    bm: int        # rows of a tile
    bn: int        # prefix keys of a tile
    bt: int        # the step's tokens' tile (a power of two >= N)
    pf: int        # keys (and values) of its split a program prefetches into L2 under PDL
    n_tiles: int   # row tiles of a KV head
    n_split: int   # prefix splits
    num_warps: int
    num_stages: int


def plan_dense(n: int, hq: int, hkv: int, d: int, capacity: int, sms: int, n_split: Optional[int] = None,
               max_rows: int = MAX_ROWS) -> tuple:
    """(DenseLaunch, grid) for N queries of Hq heads over Hkv KV heads, a prefix of at most `capacity` keys."""
    rows = n * (hq // hkv)
    bm = min(pow2(rows), pow2(max_rows))
    n_tiles = triton.cdiv(rows, bm)
    bn = 64 if d >= 128 else 128
    tiles = max(1, triton.cdiv(max(capacity, 1), bn))
    if n_split is None:
        n_split = max(1, min(MAX_SPLITS, tiles, (WAVES * sms) // max(1, n_tiles * hkv) - 1))
    n_split = max(1, min(int(n_split), tiles))
    latency_bound = n_tiles == 1 or triton.cdiv(tiles, n_split) <= PREFETCH_MAX_TILES
    lp = DenseLaunch(bm, bn, pow2(n), bn if latency_bound else 0, n_tiles, n_split, num_warps=4,
                     num_stages=3 if bm * d <= 8192 else 2)
    return lp, (n_tiles, hkv, n_split + 1)


# The merge's values in one [NSP, D] tile up to MERGE_TILE elements (one warp: 168 registers at 64 x 64 in the sm_90
# build, no spill), in chunks of splits beyond (64 x 128 spilled). Chunks of 8 at every shape (9d4070d) made the
# default model's AR step 0.633 ms at 4K and 0.728 at 8K (H100, gpu-s50/c0/) against 0.597-0.604 and 0.687-0.692
# with the one tile (98ae585, gpu-s50/b/; another H100): each chunk is a dependent round trip to memory
MERGE_TILE = 4096


def merge_chunk(nsp: int, d: int) -> int:
    """Splits whose values the merge loads at once: all nsp where the tile stays within MERGE_TILE elements."""
    return nsp if nsp * d <= MERGE_TILE else max(1, MERGE_TILE // d)
