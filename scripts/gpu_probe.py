"""Probe the verify kernel on one shape (default: Llama-3.1-8B, 64K context, 64 tree queries).

  python3 scripts/gpu_probe.py time            # graph-replay timings of launch-config variants
  ncu ... python3 scripts/gpu_probe.py once    # each variant launched twice, for Nsight Compute

Not a benchmark (no JSON, no baselines): it answers "where does the time go" between bench runs.
"""
from __future__ import annotations

import sys

import torch

from ssv.bench.kernels import SHAPES, bench_graph, eagle_tree, synthetic_selection
from ssv.config import NSAConfig
from ssv.ops.nsa.verify import nsa_verify


def case(shape="llama3.1-8b", T=65536, N=64, overlap=0.75, seed=0):
    hq, hkv, d = SHAPES[shape]
    cfg = NSAConfig()
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(hkv, T + N, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(N, hq, d, device="cuda", dtype=torch.bfloat16)
    depth, mask = eagle_tree(N, gen)
    pos = (T + depth).to("cuda")
    idx = synthetic_selection(pos.cpu(), hkv, cfg, overlap, gen).to(device="cuda", dtype=torch.int32)
    return dict(q=q, k=k, v=v, T=T, pos=pos, tm=mask.to("cuda", torch.uint8), idx=idx, cfg=cfg)


VARIANTS = [  # name, C, approx, n_split, num_warps, num_stages
    ("naive", 1, False, 1, 4, 3),
    ("exact4", 4, False, 2, 4, 3),
    ("exact4-nosplit", 4, False, 1, 4, 3),
    ("exact4-s4", 4, False, 4, 4, 3),
    ("exact4-st2", 4, False, 2, 4, 2),
    ("exact4-w8", 4, False, 2, 8, 3),
    ("exact16-s8", 16, False, 8, 4, 3),
    ("exact16-s8-w8", 16, False, 8, 8, 3),
    ("approx16", 16, True, None, 4, 3),
]


def launcher(c, C, approx, n_split, warps, stages):
    import ssv.ops.nsa.verify as V
    out = torch.empty_like(c["q"])

    def f():
        V.nsa_verify(c["q"], c["k"], c["v"], c["T"], c["pos"], c["tm"], c["idx"], c["cfg"].slc_block,
                     c["cfg"].window, group_size=C, approx=approx, out=out, n_split=n_split, tune=False,
                     launch=dict(num_warps=warps, num_stages=stages))
    return f


def main(mode: str) -> int:
    c = case()
    for name, *cfg in VARIANTS:
        f = launcher(c, *cfg)
        if mode == "once":
            f(); f()
            torch.cuda.synchronize()
        else:
            ms, how = bench_graph(f, reps=50)
            print(f"{name:16s} {ms * 1e3:8.1f} us ({how})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "time"))
