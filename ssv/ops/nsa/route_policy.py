"""Launch policy of NSA routing: rows per program, one sweep or two, KV splits, tiles, top-n chunks.

Decided from shapes and the cache's capacity only (never the context length of a step), so a
captured graph replays the same launches at any length.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import triton

from ssv.config import NSAConfig
from ssv.ops.utils import pow2

# A fused form (one launch a (query group, KV head) for short caches) was deleted in session 35: on
# the H100 and the H200 the split launches beat it at every short case measured (SmolLM2, 1 to 4
# queries, 256 to 2K tokens: 6.1-6.8 against 6.2-8.7 us; bench/results/route-s35/)

# top-n: a bitonic top-k on short rows (2.8-5.4 us at 64-128 blocks against 8.6-9.8 by bisection),
# bisection on long ones (21 us at 1,024 blocks against 51; 39 against 264 at 2,048)
SORTED_MAX_BLOCKS = 256
TOPK_ELEMS = 512   # [queries, selection blocks] of one bisection tile
# one sweep of the keys (per-head sums against each tile's max, merged by the top-n launch) against
# two (the log-sum-exp first, then the importance): H200, route-v5 probes, the same selections:
# SmolLM2 4K/48 13.7 -> 10.8 us, 4K/1 10.3 -> 8.0, Llama 8K/64 24.1 -> 19.8, 16K/64 27.4 -> 23.6;
# at 64K/64 (rows of 1,025 blocks) 49.1 -> 48.6 but the graphed verify step 6.74 -> 6.95 ms, and at
# 128K 85.4 -> 124.3 us: the per-head sums' traffic, N * Hq * NBs floats twice, grows past a sweep
ONE_SWEEP_MAX_BLOCKS = 1024
# bisection rows just past a power of two: that power's half and a tail tile of at least TAIL_MIN
# (Llama 64K with its tree: 1,025 blocks as 1,024 + 16 columns, not 2,048)
TAIL_MIN = 16
SLOT_TILE = 128    # the step's slots per tile of the path blocks' scores (64, 32: within 2 us, route-v4)
MAX_SELECTION_BLOCKS = 8192


@dataclass(frozen=True)
class RouteLaunch:
    r: int         # compression-block starts per selection block (check_blocks)
    a: int         # strides a compression block spans
    gp: int        # the GQA group's heads padded to a power of two
    cr: int        # queries per program, a power of two (rows bm = cr * gp)
    bm: int
    n_groups: int
    n_split: int   # KV splits of the score launch
    bc: int        # compression blocks per tile (a whole number of selection blocks)
    bj: int        # selection blocks per top-n row, a power of two
    bt: int        # and a tail tile past them (bisection only; 0: none)
    qc: int        # queries per top-n tile
    topk_warps: int
    sorted_topk: bool   # bitonic top-k (short rows) or bisection (long rows)
    one_sweep: bool     # one sweep of the keys (score + merging top-n) or two (+ imp)
    nselp: int
    sb: int        # slots per tile of the path blocks' scores


def check_blocks(cfg: NSAConfig) -> tuple:
    """(R, A): selection blocks hold R = l'/d compression blocks' starts and a compression block spans
    A = ceil(l/d) strides. The kernels sum a tile's blocks by reshapes: R a power of two, A - 1 <= R."""
    r = cfg.slc_block // cfg.cmp_stride
    a = -(-cfg.cmp_block // cfg.cmp_stride)
    if r & (r - 1) or a - 1 > r:
        raise ValueError(f"the Triton routing kernels need slc_block / cmp_stride a power of two and "
                         f"cmp_block <= slc_block + cmp_stride; got l={cfg.cmp_block}, d={cfg.cmp_stride}, "
                         f"l'={cfg.slc_block} (the reference backend takes any)")
    return r, a


def path_window(nbpp: int, r: int, a: int) -> int:
    """Selection blocks that nbpp compression blocks in a row (a step's path-specific ones) can touch,
    a power of two: block j holds the starts [jR - A + 1, (j + 1)R)."""
    return pow2((nbpp + a + r - 3) // r + 1, 1)


def plan_route(n: int, hq: int, hkv: int, nb_cap: int, nbs: int, cfg: NSAConfig, sms: int, max_rows: int = 64,
               n_split: Optional[int] = None, n_slots: int = 0, one_sweep: Optional[bool] = None,
               topk_tail: Optional[bool] = None, topk_warps: Optional[int] = None) -> RouteLaunch:
    """n queries; nb_cap compression blocks the launch must cover (the capacity's when the length
    lives on the device); nbs selection blocks per query row; n_slots the step's slots the path
    blocks average. one_sweep / topk_tail / topk_warps: a launch form other than the policy's."""
    if nbs > MAX_SELECTION_BLOCKS:
        raise ValueError(f"{nbs} selection blocks exceed the routing kernel's limit of {MAX_SELECTION_BLOCKS}")
    r, a = check_blocks(cfg)
    g = hq // hkv
    gp = pow2(g, 1)
    per = max(1, max_rows // gp)
    cr = min(pow2(n, 1), 1 << (per.bit_length() - 1))   # queries: a power of two, rows <= max_rows
    bm = max(16, cr * gp)                                 # tl.dot's smallest M
    cr = bm // gp
    n_groups = triton.cdiv(n, cr)
    bc = max(64, r)
    bj = pow2(max(nbs, cfg.n_select))
    tiles = triton.cdiv(max(nb_cap, 1), bc)
    if n_split is None:
        n_split = max(1, min(tiles, (2 * sms) // max(1, n_groups * hkv)))
    n_split = max(1, min(n_split, tiles))
    srt = bj <= SORTED_MAX_BLOCKS
    one = bj <= ONE_SWEEP_MAX_BLOCKS if one_sweep is None else one_sweep
    bt = 0
    if not srt and not one and topk_tail is not False:   # the one-sweep merge sums whole BJ rows
        half, over = bj // 2, nbs - bj // 2
        if half >= cfg.n_select and over > 0 and (pow2(over, TAIL_MIN) < half or topk_tail):
            bj, bt = half, pow2(over, TAIL_MIN)
    qc = 1 if srt else max(1, min(pow2(n, 1), TOPK_ELEMS // bj))
    # one warp for small bisection tiles, never with the tail: Triton 3.6 on sm_90 miscompiled the
    # tail at one warp (H100, session 38: the rank scan feeding the tail's indexed store came out one
    # low on a row, its first block written over the tile's last selected one; 2 and 4 warps right;
    # bench/NOTES.md). The product's tails (rows past 1,024 blocks, one query a tile) take 4 warps
    warps = 4 if srt else (1 if bt == 0 and qc * bj <= 1024 else 4)
    if topk_warps == 1 and bt:
        raise ValueError("plan_route: the top-n's tail tile needs at least 2 warps (one warp miscompiles "
                         "on Triton 3.6 / sm_90); pass topk_tail=False for a one-warp top-n")
    warps = topk_warps or warps
    return RouteLaunch(r, a, gp, cr, bm, n_groups, n_split, bc, bj, bt, qc, warps, srt, one,
                       pow2(cfg.n_select, 1), pow2(min(n_slots, SLOT_TILE)))
