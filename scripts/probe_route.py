"""Routing's time on the H200 for the shapes of a graphed round (the device plan's path weights, N // d + 1
path blocks), the policy's form and the others (one sweep or two; fused or split before session 35): each variant
replayed from a CUDA graph, each launch's device time (torch.profiler over eager calls). Prints a
table, writes OUT.json and the selections to OUT.pt.

An A/B against an earlier commit runs the same script over that commit's package, back to back on
one machine (the inputs are seeded), then compares selections:
    git archive REV ssv | tar -x -C /tmp/base          # here; carry it
    PYTHONPATH=/tmp/base python3 scripts/probe_route.py base.json
    python3 scripts/probe_route.py new.json --against base.pt
Packages up to da9c90d take the path blocks' keys (`path_blocks`, then `nsa_route`
over them); the script forms them for those.
"""
from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
from collections import defaultdict

import torch
import triton
import triton.testing

import ssv.ops.nsa.route as route
from ssv.bench.synthetic import SHAPES, eagle_tree
from ssv.config import NSAConfig
from ssv.ops.nsa.naive import num_cmp_blocks
import ssv.ops.nsa.route_policy as pol
from ssv.ops.nsa.route_policy import plan_route
from ssv.ops.utils import sm_count

PATH_KEYS = "k_path" in inspect.signature(route.nsa_route).parameters   # the package predates the fold

CASES = [("llama3.1-8b", 65536, 64), ("llama3.1-8b", 8192, 64), ("smollm2-135m", 4096, 48),
         ("smollm2-135m", 8192, 48), ("smollm2-135m", 4096, 1), ("llama3.1-8b", 16384, 64),
         ("llama3.1-8b", 131072, 64), ("smollm2-135m", 1024, 1), ("smollm2-135m", 2048, 1),
         ("smollm2-135m", 1024, 48), ("smollm2-135m", 2048, 48), ("smollm2-135m", 256, 1),
         ("smollm2-135m", 512, 1), ("smollm2-135m", 256, 4), ("smollm2-135m", 1024, 4),
         ("llama3.1-8b", 65536, 1), ("llama3.1-8b", 65536, 48), ("llama3.1-8b", 131072, 1)]


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
    w, s0, npath = route.path_block_weights_device(plen, pos, mask.cuda(), cfg)
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


def main(out, against=None, slot_tiles=(), cases=None):
    slot0 = pol.SLOT_TILE
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)   # the CUDA inputs too: an A/B compares selections over the same tensors
    rows, sel = [], {}
    base = torch.load(against) if against else {}
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               date=datetime.date.today().isoformat(), commit=os.environ.get("SSV_COMMIT", "?"),
               package=os.path.dirname(route.__file__), path_block_launch=PATH_KEYS)
    for shape, T, N in (CASES if cases is None else [CASES[i] for i in cases]):
        q, kc, vc, nb, k, w, s0, npath, pos, cfg, mp, plen = case(shape, T, N, gen)

        def run(**kw):
            if PATH_KEYS:
                kp, vp = route.path_blocks(w, s0, k, k, plen, N, kernel=True, values=False)
                return route.nsa_route(q, kc, vc, nb, kp, vp, npath, pos, cfg, max_pos=mp, **kw)
            return route.nsa_route(q, kc, vc, nb, k, k, w, s0, npath, pos, cfg, max_pos=mp, **kw)
        hq, hkv = SHAPES[shape][:2]
        lp = plan_route(N, hq, hkv, nb, mp // cfg.slc_block + 1, cfg, sm_count(q.device))
        fused, one = getattr(lp, "fused", False), getattr(lp, "one_sweep", False)
        forms = [("policy", {})]
        if hasattr(lp, "fused"):   # packages before session 35 held a fused form too
            forms.append(("split" if fused else "fused", dict(fused=not fused)))
        if hasattr(lp, "one_sweep"):   # packages from routing v5 on: the other split form too
            forms.append(("two sweeps" if one else "one sweep", dict(one_sweep=not one, **(
                {"fused": False} if hasattr(lp, "fused") else {}))))
        if "tma" in inspect.signature(route.nsa_route).parameters:   # key tiles through pointers, not descriptors
            forms.append(("pointers", dict(tma=False)))
        if getattr(lp, "bt", 0):   # packages from session 37 on: rows past a power of two as a tile and a tail
            forms.append(("no tail", dict(topk_tail=False)))
            forms += [(f"tail, top-n {nw} warps", dict(topk_warps=nw)) for nw in (1, 2, 8) if nw != lp.topk_warps]
        if not fused:   # the path blocks' slot tiles (route_policy.SLOT_TILE) of other sizes
            forms += [(f"slots {sb}", dict(slot_tile=sb)) for sb in slot_tiles]
        for name, kw in forms:
            kw = dict(kw)
            pol.SLOT_TILE = kw.pop("slot_tile", slot0)
            key = f"{shape} {T} {N} {name}"
            try:
                us, per = timed(lambda: run(**kw))
            except Exception as e:  # noqa: BLE001 - report and go on
                print(key, "FAILED", repr(e)[:200], flush=True)
                continue
            idx, imp = (x.cpu() for x in run(**kw)[:2])
            sel[key] = idx
            pol = sel.get(f"{shape} {T} {N} policy")   # None where the policy's launch failed
            same = None if name == "policy" or pol is None else torch.equal(idx, pol)
            policy_form = "fused" if fused else ("split, one sweep" if one else "split")
            row = dict(shape=shape, context=T, tree=N, variant=name, us=us, kernels_us=per,
                       form=policy_form if name == "policy" else name, idx_equal_policy=same)
            if key in base:
                row.update(idx_equal_base=torch.equal(idx, base[key]),
                           idx_diff_rows=int((idx != base[key]).any(-1).sum()))
            rows.append(row)
            json.dump(dict(env=env, rows=rows), open(out, "w"), indent=1)
            torch.save(sel, os.path.splitext(out)[0] + ".pt")
            print(f"{shape:13s} {T:6d} {N:3d} {name:13s} {us:7.1f} us  same as policy {same}  "
                  f"{'' if key not in base else 'same as base ' + str(row['idx_equal_base'])}  {per}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="probe-route.json")
    ap.add_argument("--against", help="another run's OUT.pt: compare selections with it")
    ap.add_argument("--slot-tiles", type=int, nargs="*", default=[], help="also these path-block slot tiles")
    ap.add_argument("--cases", type=int, nargs="*", help="indices into CASES (default: all)")
    a = ap.parse_args()
    main(a.out, a.against, a.slot_tiles, a.cases)
