"""Launch policy of the small-M linear: which GEMMs take the Triton kernel, and its tiles.

The fused layer takes the kernel only for a GEMM that `tiles.json` lists for the device it runs on:
`ssv bench linear --tiles` (ssv/bench/linear.py) times every GEMM of a decode step as cuBLAS ran it before (F.linear
/ addmm_, and the SwiGLU launch after the gate|up GEMM) and the kernel over a grid of tiles, each in
a CUDA graph of one call per layer over distinct weights, and lists the kernel's best tiles where
they beat cuBLAS (vLLM's tuned-config files are the model). Anything unlisted stays on cuBLAS.
M is fixed per captured graph (1 for an AR step, the tree's size for a verify pass); the table is
keyed by its row tile.
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import triton

TILES = Path(__file__).with_name("tiles.json")
MAX_ROWS = 64   # a verify pass's tree (48 nodes) fits one row tile


@dataclass(frozen=True)
class LinearLaunch:
    bm: int       # rows per program, a power of two >= 16 (tl.dot's smallest M)
    bn: int       # output columns per program
    bk: int       # reduction chunk
    warps: int
    stages: int   # the weights' tiles in flight: the loop is bound by their latency


def row_tile(m: int) -> int:
    return max(16, triton.next_power_of_2(m))


def default_launch(m: int, k: int) -> LinearLaunch:
    """Tiles for a call without a tuned entry (tests, the interpreter, a probe's baseline)."""
    return LinearLaunch(row_tile(m), 16, max(16, min(64, triton.next_power_of_2(k))), 4, 4)


def gemm_key(m: int, n: int, k: int, glu: bool, norm: bool, acc: bool, rope: bool = False) -> str:
    """n: output columns (the gate's for glu); rope: a q|k|v projection ending in RoPE and the cache
    writes (`linear_rope`)."""
    return f"bm{row_tile(m)}-n{n}-k{k}" + "-glu" * glu + "-norm" * norm + "-acc" * acc + "-rope" * rope


def user_tiles_path() -> Path:
    """This machine's own table (`ssv bench linear --save`), read over the shipped one."""
    from ssv.loaders.gguf import cache_root
    return cache_root() / "linear-tiles.json"


@functools.lru_cache(maxsize=None)
def _read_tables(path: Optional[str], shipped: Path, cache_env: Optional[str]) -> dict:
    # keyed by what names the files, not by their resolved paths: an eager step asks per GEMM
    paths = [path] if path else [str(shipped), str(user_tiles_path())]
    out: dict = {}
    for p in paths:   # later tables' devices replace earlier ones' whole
        if os.path.exists(p):
            out.update(json.loads(Path(p).read_text()))
    return out


def _table(path: Optional[str]) -> dict:
    """The table at path, or (None) the shipped table with this machine's over it. Each file is read
    once per process; `_read_tables.cache_clear()` reads them again."""
    return _read_tables(path, TILES, os.environ.get("SSV_CACHE"))


def tuned_launch(device_name: str, m: int, n: int, k: int, glu: bool = False, norm: bool = False,
                 acc: bool = False, path: Optional[Path] = None, rope: bool = False) -> Optional[LinearLaunch]:
    """The kernel's tiles for this GEMM on this device (path: the table; by default the shipped TILES
    with this machine's $SSV_CACHE/linear-tiles.json over it), or None: cuBLAS."""
    if not 1 <= m <= MAX_ROWS:
        return None
    e = _table(path and str(path)).get(device_name, {}).get(gemm_key(m, n, k, glu, norm, acc, rope))
    if e is None:
        return None
    # an entry may run a wider row tile's rows in narrower programs: "bm": 16 for a verify pass
    # gives its every row the AR step's tiles, so each row's product is bitwise the AR step's
    return LinearLaunch(e.get("bm", row_tile(m)), e["bn"], e["bk"], e["warps"], e["stages"])


def tiles_measured(device_name: str, path: Optional[Path] = None) -> Optional[str]:
    """When and at which commit the table's entry for this device was measured, or None: the device
    has no entry and every decode GEMM runs on cuBLAS (benchmarks record it beside the device)."""
    e = _table(path and str(path)).get(device_name)
    return None if e is None else str(e.get("_measured", "unrecorded"))


def table_entry(lp: LinearLaunch, us: float, cublas_us: float) -> dict:
    return dict(asdict(lp), us=round(us, 3), cublas_us=round(cublas_us, 3))
