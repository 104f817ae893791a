"""The draft phase's serial kernels on the GPU at the default head's shapes, each captured as one CUDA
graph of `--reps` back-to-back calls and replayed, CUDA-event timed (median of `--trials`): the level's
attention (`draft_attn`: 8 frontier rows, 9 / 3 heads of 64, a full 512-key ring, level 4) and the
commit rows' (`draft_attn_rows`, 7 rows) at each number of window splits the package takes (a package
from before the splits: its one form), and the vocabulary top-k of a level (8 rows of 8,192 logits,
k = 8, with the folded norm), and the tree finish of the default 6 x 8 / 48 tree at 8 / 16 / 32 warps
(its outputs checked against the tensor form). Run it with PYTHONPATH at the package to time.
Usage: python scripts/probe_draft_ops.py OUT.json [--reps 20] [--trials 15] [--tag NAME]"""
import datetime
import inspect
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from round_timing import graph_us as timed, op_probe_args  # noqa: E402
from ssv.ops.draft_attn.naive import draft_attn_naive  # noqa: E402
from ssv.ops.draft_attn.ops import draft_attn, draft_attn_rows  # noqa: E402
from ssv.ops.topk.naive import vocab_topk_naive  # noqa: E402
from ssv.ops.topk.ops import vocab_topk  # noqa: E402


def main():
    ap = op_probe_args()
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    dev, bf = torch.device("cuda"), torch.bfloat16
    g = torch.Generator().manual_seed(0)
    F, HQ, HKV, D, W, DEPTH, LEVEL, R = 8, 9, 3, 64, 512, 6, 4, 7
    q = torch.randn(F, HQ, D, generator=g).to(dev, bf)
    kr, vr = (torch.randn(W + 1, HKV, D, generator=g).to(dev, bf) for _ in range(2))
    ks, vs = (torch.randn((DEPTH - 1) * F, HKV, D, generator=g).to(dev, bf) for _ in range(2))
    dlen = torch.tensor([4100], device=dev)
    ring = torch.full((W + 1,), -1, dtype=torch.long)
    p = torch.arange(4100 - W, 4100)
    ring[p % W] = p
    ring = ring.to(dev)
    path = torch.full((F, DEPTH), -1, dtype=torch.long)
    for j in range(LEVEL - 2):
        path[:, j] = j * F + torch.randint(0, F, (F,), generator=g)
    path[:, LEVEL - 2] = (LEVEL - 2) * F + torch.arange(F)
    path = path.to(dev)
    qr, kn, vn = q[:R], ks[:R], vs[:R]
    n = torch.tensor([3], device=dev)
    want = draft_attn_naive(q.float(), kr.float(), vr.float(), ring, ks.float(), vs.float(), path, dlen, LEVEL, W)
    has_splits = "splits" in inspect.signature(draft_attn).parameters
    rows = []
    for s in ((1, 2, 4, 8) if has_splits else (None,)):
        kw = {} if s is None else {"splits": s}
        err = (draft_attn(q, kr, vr, ring, ks, vs, path, dlen, LEVEL, W, **kw).float() - want).abs().max().item()
        rows.append({"op": "draft_attn level", "splits": s, "max_err": err,
                     "us": timed(lambda: draft_attn(q, kr, vr, ring, ks, vs, path, dlen, LEVEL, W, **kw),
                                 a.reps, a.trials)})
        rows.append({"op": "draft_attn_rows commit", "splits": s,
                     "us": timed(lambda: draft_attn_rows(qr, kr, vr, ring, kn, vn, dlen, n, W, **kw), a.reps,
                                 a.trials)})
    V, K, DM = 8192, 8, 576
    x = (torch.randn(F, V, generator=g) * 3).to(dev)
    xn = torch.randn(F, DM, generator=g).to(dev, bf)
    wv, wi = vocab_topk_naive(x, K, logits=True, norm=(xn, 1e-5))
    gv, gi = vocab_topk(x, K, logits=True, norm=(xn, 1e-5))
    rows.append({"op": "vocab_topk level", "same_ids": bool(torch.equal(gi, wi)),
                 "max_err": (gv - wv).abs().max().item(),
                 "us": timed(lambda: vocab_topk(x, K, logits=True, norm=(xn, 1e-5)), a.reps, a.trials)})
    from ssv.spec.device import _kept, flatten_device_masked, grow_pool
    from ssv.spec.tree import TreeSpec
    from ssv.ops.tree.ops import tree_finish
    spec = TreeSpec(6, 8, 48)
    tab = torch.log_softmax(torch.randn(spec.depth, 64, V, generator=g) * 3, -1).double().to(dev)
    pool = grow_pool(lambda lv, t, p, r: tab[lv - 1][t % 64].float(), torch.tensor(5, device=dev),
                     tab[0, 5].float(), spec)
    dl32 = torch.tensor([4096], dtype=torch.int32, device=dev)
    T, DEP = spec.total_tokens, spec.depth
    flat, _, tmask = flatten_device_masked(_kept(*pool, T, K), "bfs", spec)
    for w in (8, 16, 32):
        got = tree_finish(*pool, dl32, T, K, DEP, "bfs", num_warps=w)
        same = all(torch.equal(x, y) for x, y in zip((got[0], got[1], got[3], got[5], got[4]),
                                                      (flat.tokens, flat.parents, flat.depth, tmask, 4096 + flat.depth)))
        rows.append({"op": f"tree_finish warps {w}", "same": same,
                     "us": timed(lambda: tree_finish(*pool, dl32, T, K, DEP, "bfs", num_warps=w), a.reps, a.trials)})
    for r in rows:
        print(f"{a.tag:10s} {r['op']:24s} splits {str(r.get('splits')):5s} {r['us']:7.2f} us"
              + (f"  err {r['max_err']:.2e}" if "max_err" in r else "") + (f"  same {r['same']}" if "same" in r else ""))
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tag": a.tag,
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "rows": rows},
              open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
