"""Where a sampled round's accept phase goes (#11's rounds; session 53): the pieces of `accept_sample_round`
at the default model's shape (T = 51 rows: 48 nodes + a 3-token lookup chain; V = 49,152), each captured
20 times in one CUDA graph, and an AR step's sampled token, `sample_row` against the tensor twin.
Random fp32 logits (the model's dtype for logits); prints a table and writes JSON (argv[1])."""
import json
import sys

import torch
import triton

from ssv.ops.accept.kernels import accept_sample_fwd_kernel, bonus_mass_fwd_kernel, \
    bonus_pick_fwd_kernel, probs_rows_fwd_kernel, row_mass_fwd_kernel
from ssv.ops.accept.ops import BONUS_CHUNK, accept_greedy_round, accept_sample_round, probs_rows, sample_logits_row, \
    sample_row
from ssv.ops.pdl import pdl_args
from ssv.ops.topk.ops import row_argmax
from ssv.spec.accept import SamplingParams, probs_unchecked
from ssv.spec.device_accept import sample_device

REPS = 20


def per_call_us(fn, outer: int = 15) -> float:
    fn()
    if not torch.cuda.is_available():   # a dry run of the launches (TRITON_INTERPRET=1 on the CPU)
        return float("nan")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(REPS):
            fn()
    ts = []
    for _ in range(outer):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / REPS)
    return sorted(ts)[len(ts) // 2]


def main(out):
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    T, V, D, K = (51, 49152, 8, 11) if dev.type == "cuda" else (51, 3000, 8, 11)
    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(T, V, device=dev, generator=g) * 3   # fp32, as the model's (Transformer.head)
    parents = torch.cat([torch.tensor([-1], device=dev), torch.randint(0, 8, (T - 1,), device=dev, generator=g)])
    parents = torch.minimum(parents, torch.arange(T, device=dev) - 1)
    tokens = torch.randint(0, V, (T,), device=dev, generator=g)
    scores = torch.randn(T, device=dev, generator=g)
    coins = torch.rand(T, K + 1, device=dev, generator=g)
    params = SamplingParams(temperature=0.7)
    n = torch.zeros(1, dtype=torch.long, device=dev)
    nxt = torch.zeros(D + 1, dtype=torch.long, device=dev)
    bonus = torch.zeros(1, dtype=torch.long, device=dev)
    probs = probs_unchecked(logits, params).contiguous()
    pk = pdl_args(dev)
    total = torch.empty(T, dtype=torch.float64, device=dev)
    path = torch.empty(D + 1, dtype=torch.long, device=dev)
    rows = torch.empty(D + 1, dtype=torch.long, device=dev)
    stop = torch.zeros(2, dtype=torch.long, device=dev)
    nc = triton.cdiv(V, BONUS_CHUNK)
    part = torch.empty(nc, dtype=torch.float64, device=dev)
    lastp = torch.empty(nc, dtype=torch.int32, device=dev)
    bt = max(16, triton.next_power_of_2(T))
    best = torch.zeros(T, dtype=torch.long, device=dev)
    inv = torch.full((1,), params.inv_temperature, device=dev)   # DeviceSampling's scalar, as the engine's
    pr, tr = torch.empty_like(probs), torch.empty_like(total)
    res = {
        "probs_unchecked (T=0.7)": per_call_us(lambda: probs_unchecked(logits, params)),
        "row_mass (1,024-token tiles, 4 warps)": per_call_us(lambda: row_mass_fwd_kernel[(T,)](
            probs, total, V, probs.stride(0), BV=1024, **pk, num_warps=4)),
        "row_mass (8,192-token tiles, 8 warps)": per_call_us(lambda: row_mass_fwd_kernel[(T,)](
            probs, total, V, probs.stride(0), BV=8192, **pk, num_warps=8)),
        "walk (1 warp)": per_call_us(lambda: accept_sample_fwd_kernel[(1,)](
            parents, tokens, scores, probs, total, coins, path, n, rows, nxt, stop, probs.stride(0),
            coins.stride(0), T=T, BT=bt, D=D, BD=16, K=K, BK=16, **pk, num_warps=1)),
        "bonus mass + pick": per_call_us(lambda: (
            bonus_mass_fwd_kernel[(nc,)](probs, stop, part, lastp, V, probs.stride(0), BV=BONUS_CHUNK, **pk,
                                         num_warps=4),
            bonus_pick_fwd_kernel[(1,)](probs, stop, stop, part, lastp, n, bonus, nxt, V, nc, probs.stride(0),
                                        BV=BONUS_CHUNK, NCP=64, **pk, num_warps=4))),
        "accept_sample_round (after probs)": per_call_us(lambda: accept_sample_round(
            parents, tokens, scores, probs, coins, D, K, n, nxt, bonus)),
        "sampled accept: probs + round": per_call_us(lambda: accept_sample_round(
            parents, tokens, scores, probs_unchecked(logits, params).contiguous(), coins, D, K, n, nxt, bonus)),
        "probs_rows (probabilities and masses, one launch)": per_call_us(lambda: probs_rows(logits, inv)),
        "sampled accept: probs_rows + round (3 launches)": per_call_us(lambda: accept_sample_round(
            parents, tokens, scores, *probs_rows(logits, inv, probs=pr, total=tr)[:1], coins, D, K, n, nxt, bonus,
            total=tr)),
        "greedy accept: row_argmax + walk": per_call_us(lambda: accept_greedy_round(
            parents, tokens, scores, row_argmax(logits, out=best), D, n, nxt, bonus)),
    }
    coin = torch.rand(1, device=dev)
    p1 = probs[:1].contiguous()
    o1, o2 = torch.zeros(1, dtype=torch.long, device=dev), torch.zeros(1, dtype=torch.long, device=dev)

    def twin():
        t = sample_device(p1[0], coin)
        o1.copy_(t)
        o2.copy_(t)
    res["AR token: sample_device + 2 copies (the twin)"] = per_call_us(twin)
    res["AR token: sample_row"] = per_call_us(lambda: sample_row(p1, coin, out=o1, out2=o2))
    res["AR token: probs_unchecked of one row"] = per_call_us(lambda: probs_unchecked(logits[:1], params))
    res["AR token: probs_rows of one row"] = per_call_us(lambda: probs_rows(logits[:1], inv))
    res["AR token: probs_rows + sample_row"] = per_call_us(lambda: sample_row(probs_rows(logits[:1], inv)[0], coin,
                                                                              out=o1, out2=o2))
    res["AR token: sample_logits_row (from the logits, 2 launches)"] = per_call_us(lambda: sample_logits_row(
        logits[:1], inv, coin, out=o1, out2=o2))
    for bv, w in ((2048, 4), (4096, 4), (4096, 8), (8192, 8), (16384, 16)):   # the launch's tile and warps
        res[f"probs_rows tile {bv}, {w} warps"] = per_call_us(lambda: probs_rows_fwd_kernel[(T,)](
            logits, inv, pr, tr, V, logits.stride(0), pr.stride(0), BV=bv, **pk, num_warps=w))
        res[f"probs_rows tile {bv}, {w} warps, one row"] = per_call_us(lambda: probs_rows_fwd_kernel[(1,)](
            logits, inv, pr, tr, V, logits.stride(0), pr.stride(0), BV=bv, **pk, num_warps=w))
    for k, v in res.items():
        print(f"{k:48s} {v:8.2f} us")
    from ssv.bench.env import environment
    with open(out, "w") as f:
        json.dump({"env": environment(dev.type), "shape": {"T": T, "V": V, "D": D, "K": K}, "us_per_call": res,
                   "method": f"each piece captured {REPS} times in one CUDA graph, median of 15 replays / {REPS}"},
                  f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "accept-sampled.json")
