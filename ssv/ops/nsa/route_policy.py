"""Launch policy of NSA routing: rows per program, fused or split, KV splits, tiles, top-n chunks.

Decided from shapes and the cache's capacity only (never the context length of a step), so a
captured graph replays the same launches at any length.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import triton

from ssv.config import NSAConfig
from ssv.ops.utils import pow2

# the fused launch sweeps the whole cache in one program per (query group, KV head): good while
# that sweep is short (measured on the H200: bench/NOTES.md, "routing v2")
FUSED_MAX_BLOCKS = 512
# elements of one top-n tile ([queries, selection blocks] packed keys) per program
TOPK_ELEMS = 2048
MAX_SELECTION_BLOCKS = 8192


@dataclass(frozen=True)
class RouteLaunch:
    fused: bool
    cr: int        # queries per program (rows = cr * G)
    bm: int        # rows, a power of two
    crp: int       # cr padded (the selector's rows)
    n_groups: int
    n_split: int   # KV splits of the split launches (1 when fused)
    bc: int        # compression blocks per tile
    jt: int        # whole selection blocks per importance tile
    jtp: int
    bj: int        # selection blocks per top-n row, a power of two
    nselp: int
    qc: int        # queries per top-n tile


def plan_route(n: int, hq: int, hkv: int, nb_cap: int, nbs: int, cfg: NSAConfig, sms: int, max_rows: int = 64,
               n_split: Optional[int] = None, fused: Optional[bool] = None) -> RouteLaunch:
    """n queries; nb_cap compression blocks the launch must cover (the capacity's when the length
    lives on the device); nbs selection blocks per query row."""
    if nbs > MAX_SELECTION_BLOCKS:
        raise ValueError(f"{nbs} selection blocks exceed the routing kernel's limit of {MAX_SELECTION_BLOCKS}")
    g = hq // hkv
    cr = max(1, min(n, max_rows // g)) if g <= max_rows else 1
    bm, crp = pow2(cr * g), pow2(cr)
    n_groups = triton.cdiv(n, cr)
    r = cfg.slc_block // cfg.cmp_stride
    a = -(-cfg.cmp_block // cfg.cmp_stride)
    bc = max(64, pow2(r + a - 1))
    jt = (bc - a + 1) // r
    bj = pow2(max(nbs, cfg.n_select))
    fused = nb_cap <= FUSED_MAX_BLOCKS if fused is None else fused
    if fused:
        n_split = 1
    else:
        tiles = triton.cdiv(max(nb_cap, 1), bc)
        if n_split is None:
            n_split = max(1, min(tiles, (2 * sms) // max(1, n_groups * hkv)))
        n_split = max(1, min(n_split, tiles))
    qc = max(1, min(crp if fused else pow2(n, 1), TOPK_ELEMS // bj))
    return RouteLaunch(fused, cr, bm, crp, n_groups, n_split, bc, jt, pow2(jt), bj, pow2(cfg.n_select, 1), qc)
