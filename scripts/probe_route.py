"""Routing's three forms of the path-specific blocks side by side on the H200, on the device plan's
weights (N // d + 1 path blocks, as a graphed round has them): a path-block launch and then routing
over its output (da9c90d, bench/results/route-v3/route_prev.py), their scores summed from the slots'
scores in fp32 inside routing (dc8f866, route_dc8f866.py), and the current library's, formed in
registers and rounded to the cache's dtype. Each variant's time replayed from a CUDA graph, each
launch's device time (torch.profiler over eager calls), the selections compared with the first's.
Prints a table, writes JSON."""
from __future__ import annotations

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
from ssv.ops.nsa.route import nsa_route, path_block_weights_device


def _frozen(name):
    spec = importlib.util.spec_from_file_location(name, f"bench/results/route-v3/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


old, slot = _frozen("route_prev"), _frozen("route_dc8f866")

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
    plen = torch.tensor([T], device="cuda", dtype=torch.int32)
    w, s0, npath = path_block_weights_device(plen, pos, mask.cuda(), cfg)
    return q, kc, vc, nb, k, w, s0, npath, pos, cfg, int(pos.max()), plen


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
        q, kc, vc, nb, k, w, s0, npath, pos, cfg, mp, plen = case(shape, T, N, gen)
        args = (q, kc, vc, nb, k, k, w, s0, npath, pos, cfg)

        def prev(**kw):
            kp, vp = old.path_blocks(w, s0, k, k, plen, N, kernel=True, values=False)
            return old.nsa_route(q, kc, vc, nb, kp, vp, npath, pos, cfg, max_pos=mp, **kw)
        ref = prev()
        other = dict(fused=nb > 320)   # the other form beside the policy's choice
        tag = "fused" if nb > 320 else "split"
        variants = [("path launch + route", None, prev),
                    ("slot scores (dc8f866)", None, lambda: slot.nsa_route(*args, max_pos=mp)),
                    ("formed, rounded", None, lambda: nsa_route(*args, max_pos=mp)),
                    (f"path launch + route {tag}", None, lambda: prev(**other)),
                    (f"slot scores (dc8f866) {tag}", None, lambda: slot.nsa_route(*args, max_pos=mp, **other)),
                    (f"formed, rounded {tag}", None, lambda: nsa_route(*args, max_pos=mp, **other))]
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
                             idx_equal_prev=same, idx_diff_rows=int((got[0] != ref[0]).any(-1).sum()),
                             max_imp_diff=dimp))
            json.dump(dict(env=env, rows=rows), open(out, "w"), indent=1)
            print(f"{shape:13s} {T:6d} {N:3d} {name:22s} {us:7.1f} us  same={same} "
                  f"diffrows={rows[-1]['idx_diff_rows']} dimp={dimp:.1e}  {per}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-route.json")
