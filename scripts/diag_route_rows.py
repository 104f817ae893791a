"""Which two-sweep top-n launches disagree with the tie-broken top-n of their own importance, on the
routing test's cases (test_route_matches_reference), across the top-n's tail and warps: prints one
line a variant and the first disagreeing row's keys. GPU diagnosis of session 38's case-7 failure.
    python scripts/diag_route_rows.py [case ...]
"""
import sys

import torch

sys.path.insert(0, "tests/ops")
import test_nsa_kernels as T  # noqa: E402
import ssv.ops.nsa.route_policy as policy  # noqa: E402
from ssv.config import NSAConfig  # noqa: E402
from ssv.ops.nsa.naive import compress_mean, nsa_naive, num_cmp_blocks, select_blocks  # noqa: E402
from ssv.ops.nsa.route import nsa_route, path_block_weights  # noqa: E402

CASES = {5: (5, 517, 40, 2, 8, 64, None, dict(n_select=5)), 7: (7, 1100, 5, 1, 2, 16, 2, {}),
         1: (1, 301, 9, 1, 4, 32, 3, {})}
dev = "cuda" if torch.cuda.is_available() else "cpu"
policy.SORTED_MAX_BLOCKS, policy.ONE_SWEEP_MAX_BLOCKS = 0, 0
for c in [int(a) for a in sys.argv[1:]] or [7]:
    seed, P, N, hkv, G, D, split, over = CASES[c]
    for dtype in T.DTYPES if dev == "cuda" else [torch.float16, torch.float32]:
        cfg = NSAConfig(**{**T.CFG, **over})
        q, k, v, pos, mask, _ = T.make_case(seed, P, N, hkv, G, D, dtype, cfg)
        nbpre = num_cmp_blocks(P, cfg)
        kc, vc = compress_mean(k.float(), nbpre, cfg), compress_mean(v.float(), nbpre, cfg)
        w, s0, npath = path_block_weights(P, pos, mask, cfg)
        import inspect
        knobs = "topk_tail" in inspect.signature(nsa_route).parameters   # a base commit before them
        for tail in (False, True) if knobs else (None,):
            for warps in (1, 2, 4) if knobs else (None,):
                for tma in (False, True):
                    try:
                        idx, imp, _, _ = nsa_route(q.to(dev), kc.to(dtype).to(dev), vc.to(dtype).to(dev), nbpre,
                                                   k.to(dev), v.to(dev), w.to(dev), s0, npath.to(dev), pos.to(dev),
                                                   cfg, n_split=split, tma=tma,
                                                   **(dict(topk_tail=tail, topk_warps=warps) if knobs else {}))
                    except Exception as e:  # noqa: BLE001
                        print(c, dtype, f"tail={tail} warps={warps} tma={tma}", "FAILED", repr(e)[:160])
                        continue
                    idx, imp = idx.cpu().long(), imp.cpu()
                    ref = select_blocks(imp, pos, cfg)
                    bad = (idx != ref).any(-1)
                    print(c, dtype, f"tail={tail} warps={warps} tma={tma}", "nbs", imp.shape[-1],
                          "bad rows", int(bad.sum()), "of", bad.numel(), flush=True)
                    if bad.any():
                        i, h = [int(x) for x in bad.nonzero()[0]]
                        row = imp[i, h]
                        print("   row", i, h, "pos", int(pos[i]), "kernel", idx[i, h].tolist(),
                              "ref", ref[i, h].tolist())
                        top = torch.sort(-row, stable=True)
                        print("   keys", [(int(j), float(row[j])) for j in top.indices[:8]])
                        print("   kernel's", [(int(j), float(row[j])) for j in idx[i, h] if j >= 0])
