"""Launch policy of the grouped NSA verification: tile rows, warps and stages, KV splits, the folded
merge, and the sizes of the launch's scratch (work lists, counters, partial states), all from one
plan (`plan_launch`). The kernels are in `verify_kernels.py`, the launcher in `verify.py`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import triton

from ssv.ops.nsa.verify_kernels import nsa_verify_fwd_kernel
from ssv.ops.utils import ctas_per_sm, pow2, sm_limits

# The folded merge (the last KV split of a program group to finish merges them all, no second
# launch), measured side by side (H200; bench/results/probe-h200-542b8d1.txt at fixed launches, Llama
# 64K / 64 queries, exact C = 4, lazy; the matrix in kernels.json at 0989fd0): 29.0 us against 31.4
# with the combine kernel (same 2 splits); over the matrix, folding every split launch (0989fd0's
# default) was 0.92x the combine kernel (geometric mean of 36 cases): 1.03-1.09x where it needs 2
# splits (Llama, 64 queries), down to 0.65x where a program merges 8-16 splits alone (4-16 queries,
# nsa-1b). So by default it folds at most FOLD_MAX_SPLITS.
FOLD_MAX_SPLITS = 2
# KV splits bind only where a few programs stream a long prefix, as the dense AR step's 8 (Llama
# shape, one query, C = 1; H200, bench/results/probe-dense-bbf0ebe.json): 16 / 32 / 64 / 128
# splits 21.2 / 18.8 / 23.2 / 40.1 us at 8K, 81.4 / 80.4 / 92.5 / 125.6 at 64K, 147.3 / 149.1 /
# 166.0 / 214.8 at 128K
MAX_SPLITS = 32
# the new tokens' tiles (split 0's) count as this many work items when the KV splits share the items
# (`_item_range` in verify_kernels.py, `item_ranges` here)
TREE_COST = 4


def item_ranges(n_items: int, n_tree: int, n_split: int, tree_cost: int = TREE_COST) -> list:
    """The KV splits' runs [lo, hi) of a program group's n_items work items, as the kernel's `_item_range`
    takes them: split 0 also takes the n_tree tiles of the new tokens, worth tree_cost items each, so it
    takes that many items fewer than an even share of items + tree, and the other splits share the rest
    evenly (the launch lasts as long as its slowest split)."""
    a0 = min(max(-(-(n_items + tree_cost * n_tree) // n_split) - tree_cost * n_tree, 0), n_items)
    rest, others = n_items - a0, max(n_split - 1, 1)
    return [(0, a0)] + [(a0 + (k - 1) * rest // others, a0 + k * rest // others) for k in range(1, n_split)]


GROUP_SIZES = (1, 2, 4, 8, 16)


def pdl_pays(n: int, group_size: int) -> bool:
    """Whether the launch takes programmatic dependent launch on Hopper (ssv/ops/pdl.py): one query (the
    AR step) and grouped launches do; a per-query launch over many queries (sd-naive's) does not. The
    default model's graphed 48-node verify pass (H200, bench/results/pdl/probe-pdl-8515518.json), with
    and without PDL on this launch alone: C = 4 1.323 / 1.369 ms at 4K and 1.428 / 1.466 at 8K; C = 1
    1.542 / 1.449 and 1.720 / 1.542. The AR step: 0.945 / 0.995 at 4K. Why C = 1 loses is not known;
    approximate C = 16 was not timed apart."""
    return n == 1 or group_size > 1


# The launch configuration is a fixed table, what fixed-config probes measured best side by side (H200,
# Llama 64K / 64, bench/results/probe-h200-dcbd9d3.txt): 4 warps and 3 stages for 16- and 32-row tiles
# (2 stages 1.19x slower, 8 warps 1.14x), 8 warps for exact 64-row tiles (4 warps 1.43x slower), 4 for
# approximate ones (8 warps 1.23x slower). Autotuning inside a run was not reproducible (bench/NOTES.md).
def launch_config(bm: int, d: int, approx: bool) -> dict:
    """The launch (num_warps, num_stages) of the verify kernel for BM-row tiles of head dim d. Tiles
    larger than any measured (128 rows at d = 128: GQA groups of 8+) keep 2 stages for shared memory."""
    return dict(num_warps=8 if not approx and bm * d >= 8192 else 4, num_stages=3 if bm * d <= 8192 else 2)


def tile_rows(rows: int, max_rows: int = 128) -> int:
    """BM: the rows of one program's tile for a group of `rows` (query, head) rows; more rows are
    cut into ceil(rows / BM) row splits."""
    return min(pow2(rows), pow2(max_rows))


def program_grid(n: int, hq: int, hkv: int, group_size: int, max_rows: int = 128) -> tuple:
    """The programs of one KV split: (query groups of C, KV heads, row splits). The launch's grid is
    this with the row splits times the KV splits; a folded merge keeps one counter per program here."""
    rows = group_size * (hq // hkv)
    return triton.cdiv(n, group_size), hkv, triton.cdiv(rows, tile_rows(rows, max_rows))


def num_counters(n: int, hq: int, hkv: int, group_size: Optional[int] = None, max_rows: int = 128) -> int:
    """Arrival counters a folded split merge uses: one per (query group, KV head, row split), the
    programs of one KV split. group_size None: enough for a launch of any group size (a buffer that
    serves every C of a step)."""
    sizes = GROUP_SIZES if group_size is None else (group_size,)
    return max(a * b * c for a, b, c in (program_grid(n, hq, hkv, s, max_rows) for s in sizes))


@dataclass(frozen=True)
class Launch:
    """One verify launch: its grid, constexprs and (num_warps, num_stages), its KV splits and merge,
    and the int32 / fp32 element counts of its scratch (the only place they are sized)."""
    grid: tuple       # (query groups, KV heads, row splits x KV splits)
    consts: dict      # the kernel's constexprs
    cfg: dict         # num_warps, num_stages
    n_split: int
    fold: bool        # the last split of each program group merges (else the combine kernel, with n_split > 1)
    items: int        # work lists: (block, query bits) per item and the tree blocks' bits, per program
    counters: int     # arrival counters of the folded merge (0: not folded)
    states: int       # partial softmax states (max, sum; acc times D) of the splits, 2 per row (0: one split)


def plan_launch(n: int, hq: int, hkv: int, d: int, nsel: int, slc_block: int, window: int, prefix_len: int,
                group_size: int, approx: bool, gated: bool, tma: bool, lazy: bool, max_rows: int = 128,
                n_split: Optional[int] = None, fold: Optional[bool] = None, launch: Optional[dict] = None,
                fit: Optional[Callable] = None, sms: int = 4) -> Launch:
    """The launch of N queries over a prefix of prefix_len tokens (for a device-resident length: the
    largest the cache holds). fit(consts, cfg, folded): programs of that variant per SM (None: 3, as
    in the interpreter); sms: the device's SMs. n_split, fold, launch: overrides (probes, tests)."""
    C = group_size
    cq = 1 if approx else C
    bm = tile_rows(C * (hq // hkv), max_rows)
    nsp = pow2(nsel, 1)
    # the window region's tiles of a group (its scratch) and the blocks the new tokens fall in
    nwp = -(-(window + slc_block) // slc_block)
    ntb = pow2(-(-n // slc_block) + 1)
    cfg = launch_config(bm, d, approx) if launch is None else dict(launch)
    consts = dict(G=hq // hkv, C=C, CQ=cq, CE=cq * nsp, BM=bm, D=d, BS=slc_block, NSEL=nsel, NSELP=nsp,
                  BT=slc_block if tma else pow2(min(n, 64)), NWP=nwp, NTB=ntb, GATED=bool(gated),
                  APPROX=bool(approx), TMA=bool(tma), LAZY=bool(lazy), TREE_COST=TREE_COST)
    groups, heads, row_splits = program_grid(n, hq, hkv, C, max_rows)
    programs = groups * heads * row_splits
    # a program's items at most: its union below the window region, the window region's tiles
    work = min(cq * nsel, -(-prefix_len // slc_block)) + window // slc_block + 2

    def splits(folded: bool) -> int:
        # flash-decoding style: as many KV splits as fill one wave of the programs that fit on an SM
        # at once (read from the compiled kernel: with its ~180 registers the folded merge fits 2 per
        # SM where the combine kernel's variant fits 3; H200, Llama 64K / 64, C = 4: 2 splits 29.0 us,
        # 3 splits 37.8), at least ~2 tiles each
        if n_split is not None:
            return n_split
        per_sm = 3 if fit is None else fit(consts, cfg, folded)
        return max(1, min(MAX_SPLITS, (per_sm * sms) // programs, work // 2))
    if fold is None:  # folded unless the last split would merge too many: then a combine launch
        S = splits(True)
        folded = S <= FOLD_MAX_SPLITS
        if not folded:
            S = splits(False)
    else:
        folded = bool(fold)
        S = splits(folded)
    folded = folded and S > 1
    consts.update(SPLIT=S > 1, FOLD=folded)
    return Launch(grid=(groups, heads, row_splits * S), consts=consts, cfg=cfg, n_split=S, fold=folded,
                  items=programs * S * (2 * (cq * nsp + nwp) + ntb),
                  counters=programs if folded else 0, states=S * n * hq * 2 if S > 1 else 0)


_OCCUPANCY: dict = {}  # (device, constexprs, launch, folded) -> programs per SM, read once per compiled variant


def occupancy(args: tuple, consts: dict, cfg: dict, folded: bool, device: torch.device) -> int:
    """Programs of this verify variant that fit on an SM at once, from its compiled registers and
    shared memory (compiled here if needed). args: the kernel's positional arguments, with any
    placeholder scratch of the right dtypes (the code does not depend on it); consts: its constexprs
    (SPLIT and FOLD are set here: a variant with KV splits, folded or not)."""
    consts = {k: v for k, v in consts.items() if k not in ("SPLIT", "FOLD")}
    key = (device.index, tuple(sorted(consts.items())), tuple(sorted(cfg.items())), folded)
    if key not in _OCCUPANCY:
        ck = nsa_verify_fwd_kernel.warmup(*args, grid=(1,), **consts, SPLIT=True, FOLD=folded, **cfg)
        ck._init_handles()
        _OCCUPANCY[key] = ctas_per_sm(ck.n_regs, ck.metadata.shared, ck.metadata.num_warps, sm_limits(device))
    return _OCCUPANCY[key]
