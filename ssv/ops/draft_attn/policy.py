"""How the draft attention's window is split over programs."""
from __future__ import annotations

from typing import Optional, Tuple

# the window's splits when the caller names none: each program then streams two 64-key tiles of the
# default head's 512-key window (H100, bench/results/gpu-s48/d/: 4.9 us a level against 5.4-5.7 at 8 splits)
SPLITS = 4


def window_splits(window: int, bk: int, splits: Optional[int] = None) -> Tuple[int, int]:
    """(NS, TPS): NS programs of TPS bk-key tiles each cover the window's ceil(window / bk) tiles,
    none of them empty; at most `splits` (default SPLITS) programs."""
    splits = SPLITS if splits is None else int(splits)
    if splits < 1 or window < 1 or bk < 1:
        raise ValueError(f"window_splits: needs splits, window and tile >= 1, got {splits}, {window}, {bk}")
    tiles = -(-window // bk)
    tps = -(-tiles // min(splits, tiles))
    return -(-tiles // tps), tps
