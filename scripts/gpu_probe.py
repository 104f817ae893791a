"""Probe the verify kernel on one shape (default: Llama-3.1-8B, 64K context, 64 tree queries).

  python3 scripts/gpu_probe.py time            # graph-replay timings of launch-config variants
  ncu ... python3 scripts/gpu_probe.py once    # each variant launched twice, for Nsight Compute
  TRITON_INTERPRET=1 python3 scripts/gpu_probe.py cpu   # smoke run on a small case, no GPU
  (a second argument, comma-separated names, picks variants)

Not a benchmark (no JSON, no baselines): it answers "where does the time go" between bench runs.
"""
from __future__ import annotations

import sys

import torch

from ssv.bench.kernels import SHAPES, bench_graph, eagle_tree, synthetic_selection, unique_bytes
from ssv.config import NSAConfig
from ssv.ops.nsa.verify import nsa_verify


def case(shape="llama3.1-8b", T=65536, N=64, overlap=0.75, seed=0, dev="cuda", dtype=torch.bfloat16):
    hq, hkv, d = SHAPES[shape]
    cfg = NSAConfig()
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(hkv, T + N, d, device=dev, dtype=dtype)
    v = torch.randn_like(k)
    q = torch.randn(N, hq, d, device=dev, dtype=dtype)
    depth, mask = eagle_tree(N, gen)
    pos = (T + depth).to(dev)
    idx = synthetic_selection(pos.cpu(), hkv, cfg, overlap, gen).to(device=dev, dtype=torch.int32)
    return dict(q=q, k=k, v=v, T=T, pos=pos, tm=mask.to(dev, torch.uint8), idx=idx, cfg=cfg)


PTR = dict(tma=False)
VARIANTS = [  # name, C, approx, n_split (None: heuristic), num_warps, num_stages, extra nsa_verify kwargs
    ("naive", 1, False, 1, 4, 3, {}),
    ("naive s2", 1, False, 1, 4, 2, {}),
    ("naive split2", 1, False, 2, 4, 3, {}),
    ("exact4 pointers", 4, False, 2, 4, 3, PTR),
    ("exact4", 4, False, 2, 4, 3, {}),
    ("exact4 split1", 4, False, 1, 4, 3, {}),
    ("exact4 split3", 4, False, 3, 4, 3, {}),
    ("exact4 split4", 4, False, 4, 4, 3, {}),
    ("exact4 s2", 4, False, 2, 4, 2, {}),
    ("exact4 s4", 4, False, 2, 4, 4, {}),
    ("exact4 w8", 4, False, 2, 8, 3, {}),
    ("exact2", 2, False, None, 4, 3, {}),
    ("exact8", 8, False, None, 4, 3, {}),
    ("exact8 w8", 8, False, None, 8, 3, {}),
    ("exact8 split4", 8, False, 4, 4, 3, {}),
    ("exact16 s8 w8", 16, False, 8, 8, 3, {}),
    ("exact16 s4 w8", 16, False, 4, 8, 3, {}),
    ("exact16 s8 w4", 16, False, 8, 4, 3, {}),
    ("exact16 s8 w8 st2", 16, False, 8, 8, 2, {}),
    ("naive lazy", 1, False, 1, 4, 3, dict(lazy=True)),
    ("exact4 lazy", 4, False, 2, 4, 3, dict(lazy=True)),
    ("exact4 lazy split3", 4, False, 3, 4, 3, dict(lazy=True)),
    ("exact8 lazy", 8, False, None, 4, 3, dict(lazy=True)),
    ("approx16 lazy", 16, True, None, 4, 3, dict(lazy=True)),
    ("exact4 block-major", 4, False, None, 4, 3, dict(block_major=True)),
    ("exact16 block-major", 16, False, None, 8, 3, dict(block_major=True)),
    ("exact4 block-major lazy", 4, False, None, 4, 3, dict(block_major=True, lazy=True)),
    ("exact4 block-major plan reused", 4, False, None, 4, 3, dict(block_major=True, bm_plan="reuse")),
    ("block-major plan only", 4, False, None, 4, 3, dict(block_major=True, bm_plan="only")),
    ("approx4", 4, True, None, 4, 3, {}),
    ("approx16", 16, True, None, 4, 3, {}),
    ("approx16 w8", 16, True, None, 8, 3, {}),
]


def launcher(c, C, approx, n_split, warps, stages, extra):
    import ssv.ops.nsa.verify as V
    out = torch.empty_like(c["q"])
    extra = {"lazy": False, **extra}  # variant names say "lazy" where it is on, whatever the default
    if extra.get("bm_plan") in ("reuse", "only"):  # a refresh layer's plan, built once here
        from ssv.ops.nsa.verify_bm import block_major_plan
        g = c["q"].shape[1] // c["k"].shape[0]

        def plan():
            return block_major_plan(c["idx"], c["pos"], c["T"], c["cfg"].window, c["cfg"].slc_block, g)
        if extra["bm_plan"] == "only":  # the plan alone: nothing to check (`out` unwritten)
            return plan, None
        extra = {**extra, "bm_plan": plan()}

    def f():
        V.nsa_verify(c["q"], c["k"], c["v"], c["T"], c["pos"], c["tm"], c["idx"], c["cfg"].slc_block,
                     c["cfg"].window, group_size=C, approx=approx, out=out, n_split=n_split, tune=False,
                     launch=dict(num_warps=warps, num_stages=stages), **extra)
    return f, out


def check(c, fn, C, approx):
    """Relative error of one variant against the per-query launch with pointer loads."""
    import ssv.ops.nsa.verify as V
    ref = V.nsa_verify(c["q"], c["k"], c["v"], c["T"], c["pos"], c["tm"], c["idx"], c["cfg"].slc_block,
                       c["cfg"].window, group_size=C if approx else 1, approx=approx, tune=False,
                       tma=False, lazy=False)[0].float()
    fn()
    got = fn.out.float()
    return ((got - ref).norm() / ref.norm()).item()


def main(mode: str) -> int:
    c = case() if mode != "cpu" else case("smollm2-135m", T=700, N=9, dev="cpu", dtype=torch.float32)
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else None
    if mode != "cpu":
        from ssv.bench.kernels import environment
        print("#", " ".join(f"{k} {v}" for k, v in environment().items()), flush=True)
        d = c["k"].shape[-1]
        ub = unique_bytes(c["idx"].cpu(), c["pos"].cpu(), c["T"], c["q"].shape[0], c["cfg"], d, c["k"].element_size())
        print(f"# unique K/V bytes of the step {ub / 1e6:.1f} MB (the floor at the copy bandwidth: bytes / TB/s)")
    for name, *cfg in VARIANTS:
        if only and name not in only:
            continue
        f, out = launcher(c, *cfg)
        f.out = out

        def err():  # after a timing or a smoke run; the plan-only variant writes no output
            return "" if out is None else f"  rel.err vs per-query {check(c, f, cfg[0], cfg[1]):.1e}"
        if mode == "cpu":  # a smoke run of the variants' arguments under TRITON_INTERPRET=1
            f()
            print(f"{name:20s} ran{err()}", flush=True)
        elif mode == "once":
            f(); f()
            torch.cuda.synchronize()
        else:
            ms, how = bench_graph(f, reps=50)
            print(f"{name:20s} {ms * 1e3:8.1f} us ({how}){err()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "time"))
