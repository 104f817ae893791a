"""Kept as run (2026-12-01, CPU interpreter): the old launcher is verify.py at 6ddc899, checked out with
`git worktree add /tmp/oldrepo 6ddc899`. Output of `python compare.py run`: run.txt."""
import importlib.util, os, sys, itertools, random
os.environ["TRITON_INTERPRET"] = "1"
import torch
sys.path.insert(0, "/work/main")
sys.path.insert(0, "/work/main/tests/ops")
spec = importlib.util.spec_from_file_location("old_verify", "/tmp/oldrepo/ssv/ops/nsa/verify.py")
OV = importlib.util.module_from_spec(spec); spec.loader.exec_module(OV)
import ssv.ops.nsa.verify as NV
from ssv.config import NSAConfig
from test_nsa_kernels import make_case, CFG

RUN = len(sys.argv) > 1 and sys.argv[1] == "run"
LOG = []
REAL = {(m, n): getattr(m, n) for m in (OV, NV) for n in ("nsa_verify_fwd_kernel", "nsa_verify_combine_kernel")}

def install(mod, name):
    real = REAL[mod, name]
    old = mod is OV
    class S:
        def __getitem__(self, grid):
            def call(*a, **kw):
                kw2 = {k: v for k, v in kw.items() if k not in ("BMERGE", "NP", "KW", "PART")}
                if name == "nsa_verify_fwd_kernel":
                    ws = tuple(t.numel() for t in a[13:17])            # ws_m, ws_l, ws_a, items
                    nsplit = a[24] if old else a[22]
                    if old:
                        assert a[25] == 0                              # NU
                    LOG.append((name, tuple(grid), ws, nsplit, kw2))
                else:
                    LOG.append((name, tuple(grid), tuple(x for x in a if not isinstance(x, torch.Tensor)), kw2))
                if RUN:
                    return real[grid](*a, **kw)
            return call
    setattr(mod, name, S())
for m, n in REAL:
    install(m, n)

rng = random.Random(0)
space = list(itertools.product([0, 37, 150, 700], [1, 7, 33, 128] if not RUN else [1, 7, 33], [1, 2], [1, 3, 16], [16, 64], [1, 4, 16],
                               [False, True], [16, 64], [0, 20, 64]))
rng.shuffle(space)
space = space[:8] if RUN else space[:600]
bad = 0
for seed, (P, N, hkv, G, D, C, approx, slc, W) in enumerate(space):
    for gated in (False, True):
        for n_split, fold, lazy, tma in ((None, None, None, False), (2, None, None, True), (3, None, True, False),
                                         (3, True, False, True), (None, False, None, True)):
            cfg = NSAConfig(**{**CFG, "slc_block": slc, "cmp_block": 16, "cmp_stride": 8, "window": W, "n_select": 4})
            q, k, v, pos, mask, gates = make_case(seed, P, N, hkv, G, D, torch.float32, cfg)
            g = torch.Generator().manual_seed(seed)
            idx = torch.randint(-1, max(1, -(-P // slc) + 1), (N, hkv, 4), generator=g).sort(-1).values.int()
            oc = torch.randn(N, hkv * G, D, generator=g)
            res = []
            for mod in (OV, NV):
                LOG.clear()
                extra = {"tune": False} if mod is OV else {}
                o = mod.nsa_verify(q, k, v, P, pos, mask, idx, slc, W, group_size=C, approx=approx,
                                   gates=gates if gated else None, o_cmp=oc if gated else None,
                                   out=torch.full_like(q, float("nan")), n_split=n_split, fold=fold, lazy=lazy,
                                   tma=tma, **extra)
                res.append((list(LOG), [t.clone() for t in o]))
            (l0, o0), (l1, o1) = res
            same = l0 == l1
            if RUN:
                # lse_b is written only for gated NSA (union: left as allocated)
                same = same and all(torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(), b.nan_to_num())
                                    for a, b in list(zip(o0, o1))[:3 if gated else 2])
            if not same:
                bad += 1
                print("DIFF", (seed, P, N, hkv, G, D, C, approx, slc, W, gated, n_split, fold, lazy, tma), l0, l1, flush=True)
    if RUN:
        print("case", seed, (P, N, hkv, G, D, C, approx, slc, W), "bad so far", bad, flush=True)
print("cases", len(space), "x 10 calls; differing:", bad)
