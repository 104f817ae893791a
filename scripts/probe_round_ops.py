"""The speculative round's small ops, fused launches against the tensor forms they replace, on the GPU:
each form captured as one CUDA graph of `--reps` back-to-back calls and replayed, CUDA-event timed
(median of `--trials`), so a row is per call with the graph's launch overhead spread out.

Rows: the grown tree's finish (kept set, order, mask, positions; `tree_finish` at several launches
against `_kept` + `flatten_device_masked`), the greedy accept with its record (`accept_greedy_round`
against the walk and the record's tensor ops), the drafter's commit attention (`draft_attn_rows`
against the mask, concatenations and SDPA it replaced). Default tree 6 x 8 / 48, the default head's
shapes. Usage: python scripts/probe_round_ops.py OUT.json [--reps 20] [--trials 15]"""
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, ".")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from round_timing import graph_us as timed, op_probe_args  # noqa: E402
from ssv.bench.env import commit  # noqa: E402
from ssv.ops.accept.naive import round_record_naive  # noqa: E402
from ssv.ops.accept.ops import accept_greedy_round, accept_greedy_walk  # noqa: E402
from ssv.ops.draft_attn.ops import draft_attn_rows  # noqa: E402
from ssv.ops.tree.ops import tree_finish  # noqa: E402
from ssv.spec.device import _kept, flatten_device_masked, grow_pool  # noqa: E402
from ssv.spec.tree import TreeSpec  # noqa: E402
from ssv.draft.eagle3 import masked_attention_fused  # noqa: E402


def main():
    ap = op_probe_args()
    a = ap.parse_args()
    dev = torch.device("cuda")
    spec = TreeSpec(6, 8, 48)
    g = torch.Generator().manual_seed(0)
    V = 8192
    tab = torch.log_softmax(torch.randn(spec.depth, 64, V, generator=g) * 3, -1).double().to(dev)
    pool = grow_pool(lambda lv, t, p, r: tab[lv - 1][t % 64].float(), torch.tensor(5, device=dev),
                     tab[0, 5].float(), spec)
    dlen = torch.tensor([4096], dtype=torch.int32, device=dev)
    T, K, D = spec.total_tokens, spec.top_k, spec.depth
    rows = []

    def torch_finish():
        flat, _, mask = flatten_device_masked(_kept(*pool, T, K), "bfs", spec)
        return flat, mask, dlen.long() + flat.depth
    want = torch_finish()
    rows.append({"op": "tree finish", "form": "tensor ops (_kept + flatten)", "us": timed(torch_finish, a.reps, a.trials)})
    for w, bj in ((8, 32), (16, 32), (16, 64), (32, 32)):
        got = tree_finish(*pool, dlen, T, K, D, "bfs", num_warps=w, bj=bj)
        same = all(torch.equal(x, y) for x, y in zip((got[0], got[1], got[3], got[5], got[4]),
                                                      (want[0].tokens, want[0].parents, want[0].depth, want[1], want[2])))
        rows.append({"op": "tree finish", "form": f"tree_finish warps {w} bj {bj}", "same": same,
                     "us": timed(lambda: tree_finish(*pool, dlen, T, K, D, "bfs", num_warps=w, bj=bj), a.reps, a.trials)})
    # a tree level (level 3: 8 x 8 candidates) and the level's vocabulary top-k over 8 rows of 8192
    from ssv.ops.topk.ops import vocab_topk
    from ssv.ops.tree.ops import tree_level
    lp = tab[2, :8].float().contiguous()
    for w in (4, 8, 16):
        rows.append({"op": "vocab top-k 8 x 8192", "form": f"vocab_topk warps {w}",
                     "us": timed(lambda: vocab_topk(lp, K, clamp=True, num_warps=w), a.reps, a.trials)})
    vals, toks = vocab_topk(lp, K, clamp=True)
    tk, pr, sc = (x.clone() for x in pool)
    fr = [torch.arange(K, device=dev) + 1 + K, torch.zeros(K, dtype=torch.long, device=dev),
          torch.zeros(K, dtype=torch.long, device=dev), torch.full((K, D), -1, dtype=torch.long, device=dev)]
    outs = [torch.empty(K, dtype=torch.long, device=dev) for _ in range(3)] + [torch.empty(K, D, dtype=torch.long,
                                                                                          device=dev)]
    for w in (4, 8, 16):
        rows.append({"op": "tree level 8 x 8", "form": f"tree_level warps {w}",
                     "us": timed(lambda: tree_level(vals, toks, 3, 1 + K + K * K, None, fr[0], fr[3], tk, pr, sc, *outs,
                                                    num_warps=w), a.reps, a.trials)})
    # accept: a random tree (the flattened one above) and target argmaxes that follow a few levels
    flat = want[0]
    logits = torch.randn(T, 49152, device=dev)
    logits[torch.arange(T, device=dev), flat.tokens] += 10 * (torch.rand(T, device=dev) < 0.6)
    best = logits.argmax(-1)
    rec = torch.zeros(64, dtype=torch.long, device=dev)
    tok = torch.zeros(1, dtype=torch.long, device=dev)

    def old_accept():
        path, n, bonus = accept_greedy_walk(flat.parents, flat.tokens, flat.scores, best, D)
        r, nxt = round_record_naive(flat.tokens, path, n, bonus)
        rec[0:1] = n
        rec[1:D + 2] = nxt
        tok.copy_(bonus)
        return r
    rows.append({"op": "accept + record", "form": "walk + tensor ops", "us": timed(old_accept, a.reps, a.trials)})
    rows.append({"op": "accept + record", "form": "accept_greedy_round",
                 "us": timed(lambda: accept_greedy_round(flat.parents, flat.tokens, flat.scores, best, D, rec[0:1],
                                                         rec[1:D + 2], tok), a.reps, a.trials)})
    # the drafter's commit attention: R = 7 rows, the default head's 9 / 3 heads of 64, a full ring
    R, W, hq, hkv, d = D + 1, 512, 9, 3, 64
    q = torch.randn(R, hq, d, device=dev, dtype=torch.bfloat16)
    kr, vr = (torch.randn(W, hkv, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
    kn, vn = (torch.randn(R, hkv, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
    ring = torch.arange(4096 - W, 4096, device=dev)
    n = torch.tensor([3], device=dev)
    ar = torch.arange(R, device=dev)
    eye = torch.eye(R, dtype=torch.bool, device=dev)

    def old_attn():
        pos = dlen + ar
        vis_ring = (ring[None] >= 0) & (ring[None] > pos[:, None] - W)
        vis_new = ((pos[None] <= pos[:, None]) & (ar < n)[None]) | eye
        return masked_attention_fused(q, torch.cat([kr, kn]), torch.cat([vr, vn]), torch.cat([vis_ring, vis_new], 1))
    rows.append({"op": "commit attention", "form": "mask + cat + SDPA", "us": timed(old_attn, a.reps, a.trials)})
    rows.append({"op": "commit attention", "form": "draft_attn_rows",
                 "us": timed(lambda: draft_attn_rows(q, kr, vr, ring, kn, vn, dlen, n, W), a.reps, a.trials)})
    for r in rows:
        print(f"{r['op']:18s} {r['form']:34s} {r['us']:8.2f} us" + ("" if r.get("same", True) else "  DIFFERS"))
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "commit": os.environ.get("SSV_COMMIT") or commit(), "reps": a.reps, "trials": a.trials}
    with open(a.out, "w") as f:
        json.dump({"env": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
