"""Routing v2 against v1 (bench/results/route-v2/route_old.py) on the H200: each variant's time
replayed from a CUDA graph, each launch's device time (torch.profiler over eager calls), and the
selections compared. Prints a table, writes JSON."""
from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import json
import os
import sys
from collections import defaultdict

import torch
import triton
import triton.testing

from ssv.bench.kernels import SHAPES, eagle_tree
from ssv.config import NSAConfig
from ssv.ops.nsa.naive import num_cmp_blocks
import ssv.ops.nsa.route as route_mod
import ssv.ops.nsa.route_policy as policy
from ssv.ops.nsa.route import nsa_route, path_block_weights, path_blocks

spec = importlib.util.spec_from_file_location("route_old", "bench/results/route-v2/route_old.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)

CASES = [("llama3.1-8b", 65536, 64), ("llama3.1-8b", 8192, 64), ("smollm2-135m", 4096, 48),
         ("smollm2-135m", 8192, 48), ("smollm2-135m", 4096, 1), ("llama3.1-8b", 16384, 64),
         ("llama3.1-8b", 131072, 64)]


def case(shape, T, N, gen, dtype=torch.bfloat16):
    hq, hkv, d = SHAPES[shape]
    cfg = NSAConfig()
    depth, mask = eagle_tree(N, gen)
    pos = (T + depth).cuda()
    nb = num_cmp_blocks(T, cfg)
    q = torch.randn(N, hq, d, device="cuda", dtype=dtype)
    kc = torch.randn(hkv, nb, d, device="cuda", dtype=dtype)
    vc = torch.randn_like(kc)
    k = torch.randn(hkv, T + N, d, device="cuda", dtype=dtype)
    w, s0, npath = path_block_weights(T, pos, mask.cuda(), cfg)
    kp, vp = path_blocks(w, s0, k, k, T, N)
    return q, kc, vc, nb, kp, vp, npath, pos, cfg, int(pos.max())


def timed(fn):
    fn()
    ms = triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name.replace("nsa_route_", "").replace("_fwd_kernel", "")] += e.device_time_total / 20
    return ms * 1e3, {k: round(v, 2) for k, v in per.items()}


def main(out):
    gen = torch.Generator().manual_seed(0)
    rows = []
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               date=datetime.date.today().isoformat(), commit=os.environ.get("SSV_COMMIT", "?"))
    for shape, T, N in CASES:
        q, kc, vc, nb, kp, vp, npath, pos, cfg, mp = case(shape, T, N, gen)
        args = (q, kc, vc, nb, kp, vp, npath, pos, cfg)
        ref = old.nsa_route(*args, max_pos=mp)
        variants = [("v1", None, lambda: old.nsa_route(*args, max_pos=mp))]
        variants.append(("v2", None, lambda: nsa_route(*args, max_pos=mp)))
        if nb > 320:   # the other form beside the policy's choice
            variants.append(("v2 fused", None, lambda: nsa_route(*args, max_pos=mp, fused=True)))
        else:
            variants.append(("v2 split", None, lambda: nsa_route(*args, max_pos=mp, fused=False)))
        if T >= 65536:
            def four_warps(*a, _plan=policy.plan_route, **k):
                return dataclasses.replace(_plan(*a, **k), topk_warps=4)
            def fn4():
                route_mod.plan_route = four_warps
                try:
                    return nsa_route(*args, max_pos=mp)
                finally:
                    route_mod.plan_route = policy.plan_route
            variants.append(("v2 top-n 4 warps", None, fn4))
        for name, par, fn in variants:
            try:
                us, per = timed(fn)
            except Exception as e:  # noqa: BLE001 - report and go on
                print(shape, T, N, name, "FAILED", repr(e)[:200], flush=True)
                continue
            got = fn()
            same = torch.equal(got[0], ref[0])
            dimp = float((got[1] - ref[1]).nan_to_num(0, 0, 0).abs().max())
            rows.append(dict(shape=shape, context=T, tree=N, variant=name, us=us, kernels_us=per,
                             idx_equal_v1=same, idx_diff_rows=int((got[0] != ref[0]).any(-1).sum()),
                             max_imp_diff=dimp))
            json.dump(dict(env=env, rows=rows), open(out, "w"), indent=1)
            print(f"{shape:13s} {T:6d} {N:3d} {name:22s} {us:7.1f} us  same={same} "
                  f"diffrows={rows[-1]['idx_diff_rows']} dimp={dimp:.1e}  {per}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-route.json")
