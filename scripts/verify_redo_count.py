"""How many of a verify launch's programs redo their items with the online softmax (the lazy softmax's
fallback): the kernel's source with a store of each program's redo count inserted after its check, run on
`gpu_probe.case` under any backend (the interpreter too: no GPU needed).

  TRITON_INTERPRET=1 python3 scripts/verify_redo_count.py [package root ...]

Each package root (default: this checkout) is imported in turn in a subprocess; the default model's 4K / 48
case (PROBE_SHAPE / PROBE_T / PROBE_N as in gpu_probe.py), exact C = 4 at N_SPLIT KV splits (default 11, the
graphed strict pass's on an H200). Not a benchmark: it counts a code path.
"""
from __future__ import annotations

import os
import subprocess
import sys


def count(n_split: int) -> str:
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_probe as P
    import ssv.ops.nsa.verify as V
    from verify_source import WithArg, patched_module
    anchor = "        n_redo = tl.sum(tl.where(m_r & ~ok, 1, 0))\n"
    store = "        tl.store(redo + (i_g * tl.num_programs(1) + i_h) * tl.num_programs(2) + i_z, n_redo)\n"
    mod = patched_module("verify_kernels_redo", "redo", [(anchor, anchor + store)])
    dev = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") == "0" else "cpu"
    shape = os.environ.get("PROBE_SHAPE", "smollm2-135m")
    T, N = int(os.environ.get("PROBE_T", "4096")), int(os.environ.get("PROBE_N", "48"))
    c = P.case(shape, T=T, N=N, dev=dev, dtype=torch.bfloat16 if dev == "cuda" else torch.float32)
    redo = torch.full((1 << 14,), -1, device=dev, dtype=torch.int32)
    V.nsa_verify_fwd_kernel = counted = WithArg(mod.nsa_verify_fwd_kernel, redo)
    V.nsa_verify(c["q"], c["k"], c["v"], c["T"], c["pos"], c["tm"], c["idx"], c["cfg"].slc_block, c["cfg"].window,
                 group_size=4, n_split=n_split, lazy=True, fold=False)
    g = counted.grids[-1]
    r = redo[: g[0] * g[1] * g[2]].cpu()
    return (f"{shape} {T} / {N}, C = 4, grid {g}: {int((r > 0).sum())} of {r.numel()} programs redo "
            f"({int(r.clamp_min(0).sum())} rows)")


def main() -> int:
    n_split = int(os.environ.get("N_SPLIT", "11"))
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(count(n_split), flush=True)
        return 0
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for root in sys.argv[1:] or [here]:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one"], env=env, capture_output=True,
                             text=True)
        print(f"{root}: {out.stdout.strip() or out.stderr.strip()[-400:]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
