"""Probe: the dense AR step's attention (one query over the whole prefix on the verify kernel, as
`KernelDensePlan` runs it) at the Llama-3.1-8B shape, against its K/V bytes at the copy bandwidth:
group sizes and KV split counts side by side, CUDA-graph replays. Usage: python3 scripts/probe_dense.py OUT.json
(env PROBE_NS, PROBE_CS, PROBE_SPLITS narrow the sweep: "48", "8 4 2", "None 16")"""
import json, os, sys, torch
sys.path.insert(0, ".")
from ssv.bench.e2e_steps import time_graph
from ssv.bench.kernels import copy_bandwidth
from ssv.ops.nsa.verify import nsa_verify, num_counters

hq, hkv, d = 32, 8, 128
bw = copy_bandwidth()
rows = []
for ctx in (8192, 65536, 131072):
    cap = ctx + 256
    k = torch.randn(hkv, cap, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    plen = torch.tensor([ctx], device="cuda", dtype=torch.int32)
    ns = [int(x) for x in os.environ.get("PROBE_NS", "1 48").split()]
    cs = [int(x) for x in os.environ["PROBE_CS"].split()] if "PROBE_CS" in os.environ else None
    splits = [None if x == "None" else int(x) for x in os.environ.get("PROBE_SPLITS", "None 16 32 64 128").split()]
    for n in ns:
        q = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16)
        pos = torch.arange(ctx, ctx + n, device="cuda")
        tm = torch.tril(torch.ones(n, n, device="cuda", dtype=torch.uint8))
        none = torch.full((n, hkv, 1), -1, device="cuda", dtype=torch.int32)
        floor = 2 * hkv * ctx * d * 2 / bw / 1e9 * 1e3
        for C in (cs or ((16, 4, 1) if n == 1 else (16, 8))):
            for S in splits:
                cnt = torch.zeros(num_counters(n, hq, hkv, C), device="cuda", dtype=torch.int32)
                try:
                    f = lambda: nsa_verify(q, k, v, plen, pos, tm, none, 64, cap, group_size=C, n_split=S, counters=cnt)
                    o = f()[0]
                    us = time_graph(f, reps=30) * 1e3
                except Exception as e:  # noqa: BLE001
                    print(ctx, n, C, S, type(e).__name__, str(e)[:200], flush=True)
                    continue
                row = {"context": ctx, "n": n, "group_size": C, "n_split": S, "us": us, "floor_us": floor,
                       "tbps": 2 * hkv * ctx * d * 2 / (us * 1e-6) / 1e12}
                rows.append(row)
                print(f"ctx {ctx:6d} n {n:2d} C {C:2d} S {str(S):4s} {us:8.1f} us  floor {floor:6.1f}  {row['tbps']:.2f} TB/s", flush=True)
                json.dump({"copy_tbps": bw, "rows": rows}, open(sys.argv[1], "w"), indent=1)
