"""Routing's launch parameters swept on the H200 (exploration, not a benchmark of record): for each case
of probe_route.py, the policy's launch and variants of KV splits, rows per program, warps and
pipeline stages of each launch, CUDA-graph replays, each launch's device time, registers and
spills of the compiled kernels; selections checked equal to the policy's. Writes OUT.json.
    python3 scripts/sweep_route.py OUT.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import probe_route as pr  # noqa: E402

import ssv.ops.nsa.route as route  # noqa: E402
import ssv.ops.nsa.route_policy as policy  # noqa: E402

KERNELS = ("nsa_route_score_fwd_kernel", "nsa_route_imp_fwd_kernel", "nsa_route_topk_fwd_kernel",
           "nsa_route_merge_topk_fwd_kernel")
ORIG = {k: getattr(route, k) for k in KERNELS}
COMPILED = {}


class Override:
    """kernel[grid](...) with num_warps / num_stages replaced; keeps the compiled kernel's resources."""

    def __init__(self, name, **opts):
        self.name, self.opts = name, opts

    def __getitem__(self, grid):
        def launch(*a, **kw):
            kw.update(self.opts)
            ck = ORIG[self.name][grid](*a, **kw)
            COMPILED[self.name] = (getattr(ck, "n_regs", None), getattr(ck, "n_spills", None),
                                   list(grid) if isinstance(grid, tuple) else grid)
            return ck
        return launch


def variant(score=None, topk=None, topk_elems=None, slot_tile=None, imp=None):
    for name, o in (("nsa_route_score_fwd_kernel", score), ("nsa_route_imp_fwd_kernel", imp),
                    ("nsa_route_topk_fwd_kernel", topk), ("nsa_route_merge_topk_fwd_kernel", topk)):
        setattr(route, name, Override(name, **(o or {})))
    policy.TOPK_ELEMS = topk_elems or 512
    policy.SLOT_TILE = slot_tile or 128


LONG = [("llama3.1-8b", 65536, 64), ("llama3.1-8b", 65536, 48), ("llama3.1-8b", 16384, 64),
        ("smollm2-135m", 8192, 48)]
VARIANTS = [("policy", {}, {})] + [(f"topk {w} warps", {}, dict(topk=dict(num_warps=w))) for w in (1, 2, 4, 8)] + [
    (f"split{ns}", dict(n_split=ns), {}) for ns in (4, 16, 32, 64)] + [
    ("score 8 warps", {}, dict(score=dict(num_warps=8))), ("imp 8 warps", {}, dict(imp=dict(num_warps=8))),
    ("score+imp 3 stages", {}, dict(score=dict(num_stages=3), imp=dict(num_stages=3))),
    ("split32 score+imp 3 stages", dict(n_split=32), dict(score=dict(num_stages=3), imp=dict(num_stages=3))),
    ("split64 rows 32", dict(n_split=64, max_rows=32), {}), ("split32 rows 128", dict(n_split=32, max_rows=128), {}),
    ("two sweeps", dict(one_sweep=False), {}), ("two sweeps split32", dict(one_sweep=False, n_split=32), {})]
SHORT = [("smollm2-135m", 1024, 48), ("smollm2-135m", 2048, 48), ("smollm2-135m", 4096, 48),
         ("smollm2-135m", 1024, 1), ("smollm2-135m", 4096, 1), ("llama3.1-8b", 4096, 64),
         ("smollm2-135m", 4096, 16), ("smollm2-135m", 8192, 48), ("smollm2-135m", 8192, 1), ("llama3.1-8b", 8192, 64)]
FORMS = [("split", {}, {}), ("split sb64", {}, dict(slot_tile=64)), ("split sb32", {}, dict(slot_tile=32))]


def ncu_run(i=0):
    """Three eager policy calls at LONG[i], for `ncu --kernel-name regex:nsa_route`."""
    gen = torch.Generator().manual_seed(0)
    q, kc, vc, nb, k, w, s0, npath, pos, cfg, mp, plen = pr.case(*LONG[i], gen)
    for _ in range(3):
        route.nsa_route(q, kc, vc, nb, k, k, w, s0, npath, pos, cfg, max_pos=mp)
    torch.cuda.synchronize()


def main(out, long_only=False):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, commit=os.environ.get("SSV_COMMIT", "?"))
    rows = []
    for (shape, T, N), variants in [(c, VARIANTS) for c in LONG] + [(c, FORMS) for c in ([] if long_only else SHORT)]:
        q, kc, vc, nb, k, w, s0, npath, pos, cfg, mp, plen = pr.case(shape, T, N, gen)
        ref = None
        for name, kw, opts in variants:
            variant(**opts)

            def run():
                return route.nsa_route(q, kc, vc, nb, k, k, w, s0, npath, pos, cfg, max_pos=mp, **kw)
            try:
                us, per = pr.timed(run)
                idx = run()[0].cpu()
            except Exception as e:  # noqa: BLE001 - report and go on
                print(shape, T, N, name, "FAILED", repr(e)[:300], flush=True)
                continue
            ref = idx if ref is None else ref
            row = dict(shape=shape, context=T, tree=N, variant=name, us=round(us, 2), kernels_us=per,
                       same=bool(torch.equal(idx, ref)), compiled={k: v for k, v in COMPILED.items()})
            COMPILED.clear()
            rows.append(row)
            json.dump(dict(env=env, rows=rows), open(out, "w"), indent=1)
            print(f"{shape:13s} {T:6d} {N:3d} {name:22s} {us:7.1f} us same={row['same']} {per} {row['compiled']}",
                  flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--ncu", action="store_true", help="only three eager calls of a long case")
    ap.add_argument("--case", type=int, default=0, help="with --ncu: which LONG case")
    ap.add_argument("--long-only", action="store_true", help="the long cases' variants only")
    a = ap.parse_args()
    ncu_run(a.case) if a.ncu else main(a.out, a.long_only)
