"""The decode step's GEMMs on the GPU: cuBLAS as the fused layer ran them before ssv/ops/linear (F.linear /
addmm_, and the SwiGLU launch after the gate|up GEMM) against the small-M Triton kernel at a grid of
tiles. Each variant runs as a CUDA graph of one call per layer over distinct weights (so the weights
stream from memory as in a step, not from L2). Prints a table, writes OUT.json.

    python3 scripts/probe_linear.py bench/results/linear/probe-linear-COMMIT.json [--quick]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os

import torch
import triton.testing
from torch.nn import functional as F

from ssv.bench.kernels import environment
from ssv.ops.glue.ops import swiglu
from ssv.ops.linear.ops import linear
from ssv.ops.linear.policy import LinearLaunch, plan_linear, use_kernel

# (gemm, N, K, glu, norm, accumulate) of one layer; N is the gate's width for glu
LAYER = {"smollm2-135m": (576, 1536, 960), "llama3.1-8b": (4096, 14336, 6144)}


def gemms(shape):
    h, i, qkv = LAYER[shape]
    return [("qkv", qkv, h, False, True, False), ("o", h, h, False, False, True), ("gate_up", i, h, True, True, False),
            ("down", h, i, False, False, True)]


def configs(m: int, quick: bool):
    bm = max(16, 1 << (m - 1).bit_length())
    bks = (64, 128, 256) if m == 1 else (64, 128)
    out = [LinearLaunch(bm, bn, bk, 4, s) for bn, bk, s in itertools.product((16, 32, 64), bks, (2, 3, 4))]
    return out[:4] if quick else out


def run(shape, m, layers, quick, rows):
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    for name, n, k, glu, norm, acc in gemms(shape):
        ws = [torch.randn(2 * n if glu else n, k, device=dev, generator=gen).mul_(k ** -0.5).bfloat16()
              for _ in range(layers)]
        x = torch.randn(m, k, device=dev, generator=gen).bfloat16()
        out = torch.zeros(m, n, device=dev, dtype=torch.bfloat16)
        eps = 1e-5 if norm else None

        def cublas():
            for w in ws:
                if acc:
                    out.addmm_(x, w.t())
                elif glu:
                    swiglu(F.linear(x, w), norm=(x, 1e-5))
                else:
                    F.linear(x, w)

        def triton_fn(lp):
            def f():
                for w in ws:
                    linear(x, w, out=out if acc else None, accumulate=acc, norm_eps=eps, glu=glu, launch=lp)
            return f

        base = triton.testing.do_bench_cudagraph(cublas, rep=100, return_mode="median") * 1e3 / layers
        rows.append(dict(shape=shape, gemm=name, m=m, impl="cublas", config=None, us=base,
                         weight_mb=ws[0].numel() * 2 / 1e6))
        policy = plan_linear(m, n, k, 2, glu)
        best = None
        for lp in [policy] + [c for c in configs(m, quick) if c != policy]:
            try:
                us = triton.testing.do_bench_cudagraph(triton_fn(lp), rep=100, return_mode="median") * 1e3 / layers
            except Exception as e:   # a tile that does not compile (shared memory): recorded, skipped
                rows.append(dict(shape=shape, gemm=name, m=m, impl="triton", config=lp.__dict__, error=str(e)[:200]))
                continue
            rows.append(dict(shape=shape, gemm=name, m=m, impl="triton", config=lp.__dict__, us=us,
                             policy=lp == policy))
            if best is None or us < best[1]:
                best = (lp, us)
        pol = [r["us"] for r in rows if r.get("policy") and r["gemm"] == name and r["m"] == m and r["shape"] == shape]
        print(f"{shape:14s} {name:8s} m={m:3d} cublas {base:7.2f} us  policy {pol[0]:7.2f}  best {best[1]:7.2f} "
              f"{best[0].__dict__}  kernel used: {use_kernel(m, 2 * n if glu else n, k)}", flush=True)
        del ws


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--quick", action="store_true", help="4 tiles a case (a smoke run)")
    p.add_argument("--shapes", nargs="+", default=list(LAYER))
    a = p.parse_args()
    rows = []
    for shape in a.shapes:
        for m in (1, 48):
            run(shape, m, 30 if shape == "smollm2-135m" else 4, a.quick or shape != "smollm2-135m", rows)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"env": environment(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
