"""Launch policy of the small-M linear: which GEMMs take the Triton kernel, and its tiles.

Decided from shapes only (M is fixed per captured graph: 1 for an AR step, the tree's size for a
verify pass). cuBLAS keeps the rest: its GEMV-like kernels for M <= 64 take ~3.7-4.1 us at the
135M model's shapes on the H200, where the weights' bytes need 0.2-0.9 us (bench/NOTES.md, "Linear").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import triton

MAX_ROWS = 64                  # a verify pass's tree (48 nodes) fits one row tile
MAX_WEIGHT_BYTES = 8 << 20     # larger weights stream near copy bandwidth in cuBLAS already


@dataclass(frozen=True)
class LinearLaunch:
    bm: int       # rows per program, a power of two >= 16 (tl.dot's smallest M)
    bn: int       # output columns per program
    bk: int       # reduction chunk
    warps: int
    stages: int


def plan_linear(m: int, n: int, k: int, elem: int = 2, glu: bool = False, bn: Optional[int] = None,
                bk: Optional[int] = None, warps: Optional[int] = None, stages: Optional[int] = None) -> LinearLaunch:
    """m rows, n output columns (of the gate for glu), k the reduction; explicit tiles override."""
    bm = max(16, triton.next_power_of_2(m))
    if bn is None:
        bn = 32
    if bk is None:
        bk = min(128 if m == 1 else 64, triton.next_power_of_2(k))
    return LinearLaunch(bm, bn, bk, 4 if warps is None else warps, 3 if stages is None else stages)


def use_kernel(m: int, n: int, k: int, elem: int = 2) -> bool:
    """Whether a GEMM of these shapes takes the Triton kernel (else cuBLAS)."""
    return 1 <= m <= MAX_ROWS and n * k * elem <= MAX_WEIGHT_BYTES
