"""cuBLAS's decode GEMMs of the Llama-3.1-8B shape by row count (1, 48, and 48 padded to 64 / split 2 x 24), bf16,
CUDA-graph timed: whether a verify pass's 48-row GEMMs stream the weights as fast as the AR step's one row (the
session-51 profile read +392 us a pass). Run on a GPU from the repository root: python3 scripts/probe_gemm_rows.py OUT.json"""
import json, sys, torch
import torch.nn.functional as F
sys.path.insert(0, ".")
from ssv.bench.kernels import copy_bandwidth, environment

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def timed(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    out = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / reps)
    return sorted(out)[2]


bw = copy_bandwidth()
rows = []
for name, (n, k) in SHAPES.items():
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    floor = n * k * 2 / bw / 1e6   # us: bytes over TB/s
    for label, m, form in (("1 row", 1, "plain"), ("48 rows", 48, "plain"), ("48 padded to 64", 48, "pad64"),
                           ("48 as 2 x 24", 48, "split"), ("64 rows", 64, "plain")):
        x = torch.randn(64 if form == "pad64" else m, k, device="cuda", dtype=torch.bfloat16)
        if form == "split":
            fn = lambda x=x, w=w: (F.linear(x[:24], w), F.linear(x[24:], w))  # noqa: E731
        else:
            fn = lambda x=x, w=w: F.linear(x, w)  # noqa: E731
        us = timed(fn)
        rows.append({"gemm": name, "n": n, "k": k, "form": label, "us": us, "floor_us": floor})
        print(f"{name:8s} {label:18s} {us:8.1f} us  ({us / floor:.2f}x the weights' floor {floor:.1f})", flush=True)
json.dump({"env": environment(), "copy_tbps": bw, "rows": rows}, open(sys.argv[1], "w"), indent=1)
