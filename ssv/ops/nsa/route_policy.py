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
TOPK_ELEMS = 512
MAX_SELECTION_BLOCKS = 8192


@dataclass(frozen=True)
class RouteLaunch:
    fused: bool
    gp: int        # the GQA group's heads padded to a power of two
    cr: int        # queries per program, a power of two (rows = cr * gp)
    bm: int
    n_groups: int
    n_split: int   # KV splits of the split launches (1 when fused)
    bc: int        # compression blocks per tile (a whole number of selection blocks)
    bj: int        # selection blocks per top-n row, a power of two
    qc: int        # queries per top-n tile
    topk_warps: int


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


def plan_route(n: int, hq: int, hkv: int, nb_cap: int, nbs: int, cfg: NSAConfig, sms: int, max_rows: int = 64,
               n_split: Optional[int] = None, fused: Optional[bool] = None) -> RouteLaunch:
    """n queries; nb_cap compression blocks the launch must cover (the capacity's when the length
    lives on the device); nbs selection blocks per query row."""
    if nbs > MAX_SELECTION_BLOCKS:
        raise ValueError(f"{nbs} selection blocks exceed the routing kernel's limit of {MAX_SELECTION_BLOCKS}")
    r, _ = check_blocks(cfg)
    g = hq // hkv
    gp = pow2(g, 1)
    cr = max(1, min(pow2(n, 1), max(1, max_rows // gp)))
    cr = 1 << (cr.bit_length() - 1)                                  # a power of two, at most max_rows // gp
    bm = max(16, cr * gp)
    cr = bm // gp
    n_groups = triton.cdiv(n, cr)
    bc = max(64, r)
    bj = pow2(max(nbs, cfg.n_select))
    fused = nb_cap <= FUSED_MAX_BLOCKS if fused is None else fused
    if fused:
        n_split = 1
    else:
        tiles = triton.cdiv(max(nb_cap, 1), bc)
        if n_split is None:
            n_split = max(1, min(tiles, (2 * sms) // max(1, n_groups * hkv)))
        n_split = max(1, min(n_split, tiles))
    qc = max(1, min(cr if fused else pow2(n, 1), TOPK_ELEMS // bj))
    return RouteLaunch(fused, gp, cr, bm, n_groups, n_split, bc, bj, qc, 1 if qc * bj <= 1024 else 4)
