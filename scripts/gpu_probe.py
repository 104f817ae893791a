"""Probe the verify kernel on one shape (default: Llama-3.1-8B, 64K context, 64 tree queries).

  python3 scripts/gpu_probe.py time            # graph-replay timings of launch-config variants
  ncu ... python3 scripts/gpu_probe.py once    # each variant launched twice, for Nsight Compute
  TRITON_INTERPRET=1 python3 scripts/gpu_probe.py cpu   # smoke run on a small case, no GPU
  (a second argument, comma-separated names, picks variants; PROBE_SHAPE=nsa-1b etc. another shape)

Not a benchmark (no JSON, no baselines): it answers "where does the time go" between bench runs.
"""
from __future__ import annotations

import os
import sys

import torch

from ssv.bench.env import bench_graph
from ssv.bench.synthetic import SHAPES, eagle_tree, synthetic_selection, unique_bytes, work_list_bytes
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
    # the folded split merge (no second launch)
    ("exact4 lazy fold", 4, False, 2, 4, 3, dict(lazy=True, fold=True)),
    ("exact4 lazy fold split3", 4, False, 3, 4, 3, dict(lazy=True, fold=True)),
    ("exact4 lazy fold split4", 4, False, 4, 4, 3, dict(lazy=True, fold=True)),
    ("exact8 lazy fold", 8, False, None, 4, 3, dict(lazy=True, fold=True)),
    ("exact16 lazy fold s8 w8", 16, False, 8, 8, 3, dict(lazy=True, fold=True)),
    ("approx4 fold", 4, True, None, 4, 3, dict(fold=True)),
    # at the default launch table and split heuristic (None)
    ("exact4 lazy defaults", 4, False, None, None, None, dict(lazy=True)),
    ("naive defaults", 1, False, None, None, None, {}),
    ("exact4 defaults", 4, False, None, None, None, {}),
    ("approx4 defaults", 4, True, None, None, None, {}),
    ("exact8 lazy split4", 8, False, 4, 4, 3, dict(lazy=True)),
    ("approx4", 4, True, None, 4, 3, {}),
    ("approx16", 16, True, None, 4, 3, {}),
    ("approx16 w8", 16, True, None, 8, 3, {}),
]


def launcher(c, C, approx, n_split, warps, stages, extra):
    import ssv.ops.nsa.verify as V
    out = torch.empty_like(c["q"])
    # variant names say "lazy" and "fold" where they are on, whatever the defaults; "defaults" variants
    # (no warps given) take the defaults
    extra = {**({} if warps is None else {"lazy": False, "fold": False}), **extra}
    q = c["q"]  # the plan's counters for folded merges, zeroed once (a zeroing per call would be timed)
    extra = {**extra, "counters": torch.zeros(V.num_counters(q.shape[0], q.shape[1], c["k"].shape[0], C),
                                              device=q.device, dtype=torch.int32)}

    launch = None if warps is None else dict(num_warps=warps, num_stages=stages)  # None: the default table

    def f():
        V.nsa_verify(c["q"], c["k"], c["v"], c["T"], c["pos"], c["tm"], c["idx"], c["cfg"].slc_block,
                     c["cfg"].window, group_size=C, approx=approx, out=out, n_split=n_split, launch=launch,
                     **extra)
    return f, out


def loaded(c, C, approx):
    """K/V bytes the variant's programs load (its work lists; `tile_bytes`), row splits included."""
    n, hq, d = c["q"].shape
    return work_list_bytes(c["idx"].cpu(), c["pos"].cpu(), c["T"], n, c["cfg"], hq, d, c["k"].element_size(), C,
                           approx)


def check(c, fn, C, approx):
    """Relative error of one variant against the per-query launch with pointer loads."""
    import ssv.ops.nsa.verify as V
    ref = V.nsa_verify(c["q"], c["k"], c["v"], c["T"], c["pos"], c["tm"], c["idx"], c["cfg"].slc_block,
                       c["cfg"].window, group_size=C if approx else 1, approx=approx, tma=False, lazy=False,
                       fold=False)[0].float()
    fn()
    got = fn.out.float()
    return ((got - ref).norm() / ref.norm()).item()


def main(mode: str) -> int:
    shape = os.environ.get("PROBE_SHAPE", "llama3.1-8b")  # another SHAPES key: the same variants there
    # PROBE_T / PROBE_N: the context and tree queries (default Llama's 64K / 64)
    T, N = int(os.environ.get("PROBE_T", "65536")), int(os.environ.get("PROBE_N", "64"))
    c = case(shape, T=T, N=N) if mode != "cpu" else case("smollm2-135m", T=700, N=9, dev="cpu", dtype=torch.float32)
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else None
    if mode != "cpu":
        from ssv.bench.env import environment
        print("#", " ".join(f"{k} {v}" for k, v in environment().items()), flush=True)
        print(f"# shape {shape}, context {c['T']}, {c['q'].shape[0]} tree queries", flush=True)
        d = c["k"].shape[-1]
        ub = unique_bytes(c["idx"].cpu(), c["pos"].cpu(), c["T"], c["q"].shape[0], c["cfg"], d, c["k"].element_size())
        print(f"# unique K/V bytes of the step {ub / 1e6:.1f} MB (the floor at the copy bandwidth: bytes / TB/s)")
    for name, *cfg in VARIANTS:
        if only and name not in only:
            continue
        try:
            f, out = launcher(c, *cfg)
            if mode != "cpu":
                f()  # an option this shape does not support raises here, before any timing
        except ValueError as e:
            print(f"{name:20s} not run: {e}", flush=True)
            continue
        f.out = out

        C, approx = cfg[0], cfg[1]
        lb = loaded(c, C, approx)

        def err():  # after a timing or a smoke run
            return f"  rel.err vs per-query {check(c, f, C, approx):.1e}"
        if mode == "cpu":  # a smoke run of the variants' arguments under TRITON_INTERPRET=1
            f()
            print(f"{name:20s} ran{err()}", flush=True)
        elif mode == "once":
            f(); f()
            torch.cuda.synchronize()
        else:
            ms, how = bench_graph(f, reps=50)
            tiles = f"  loaded {lb / 1e6:6.1f} MB, {lb / ms / 1e9:4.2f} TB/s"
            print(f"{name:20s} {ms * 1e3:8.1f} us ({how}){tiles}{err()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "time"))
