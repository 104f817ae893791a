"""Probe: dense attention on the NSA verify kernel's window form (what `KernelDensePlan` ran before
`ssv/ops/dense`) against `dense_verify`, CUDA-graph replays, one process. Per (shape, context, N): us,
the K/V bytes floor at the copy bandwidth, achieved TB/s and TFLOP/s, and the largest relative error of
the new output against the old. Then whole steps at the Llama shape (random weights, the step table's
helpers): the dense AR step and the dense 48-node verify pass with each kernel.
Usage: python3 scripts/probe_dense.py OUT.json  (env PROBE_ATTENTION="" skips the attention rows, PROBE_STEPS=""
the steps; PROBE_SPLITS "None 16"; PROBE_STEP_SHAPES "llama3.1-8b smollm2-135m"; PROBE_STEP_REPS 2)"""
import json, os, sys, torch
sys.path.insert(0, ".")
from ssv.bench.e2e_steps import time_graph
from ssv.bench.env import copy_bandwidth
from ssv.ops.dense import dense_verify
from ssv.ops.nsa.verify import nsa_verify, num_counters

bw = copy_bandwidth()
out = {"copy_tbps": bw, "device": torch.cuda.get_device_name(), "rows": [], "steps": []}
save = lambda: json.dump(out, open(sys.argv[1], "w"), indent=1)  # noqa: E731
SHAPES = {"llama3.1-8b": (32, 8, 128, (8192, 65536, 131072)), "smollm2-135m": (9, 3, 64, (4096, 8192))}
splits = [None if x == "None" else int(x) for x in os.environ.get("PROBE_SPLITS", "None 16 32 64").split()]
for shape, (hq, hkv, d, ctxs) in (SHAPES.items() if os.environ.get("PROBE_ATTENTION", "1") else ()):
    for ctx in ctxs:
        cap = ctx + 256
        k = torch.randn(hkv, cap, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        plen = torch.tensor([ctx], device="cuda", dtype=torch.int32)
        for n in (1, 48):
            q = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16)
            pos = torch.arange(ctx, ctx + n, device="cuda")
            tm = torch.tril(torch.ones(n, n, device="cuda", dtype=torch.uint8))
            none = torch.full((n, hkv, 1), -1, device="cuda", dtype=torch.int32)
            kv = 2 * hkv * (ctx + n) * d * 2
            flop = 4 * n * hq * (ctx + n) * d
            C = 1 if n == 1 else 8
            cnt = torch.zeros(num_counters(n, hq, hkv, C), device="cuda", dtype=torch.int32)
            old = lambda: nsa_verify(q, k, v, plen, pos, tm, none, 64, cap, group_size=C, counters=cnt)[0]  # noqa: E731
            o_old = old().float()
            forms = [("nsa verify window C%d" % C, old, None)]
            forms += [("dense_verify S=%s" % S, (lambda S=S: dense_verify(q, k, v, plen, tm, n_split=S)), S)
                      for S in splits]
            for name, f, S in forms:
                try:
                    err = ((f().float() - o_old).norm() / o_old.norm()).item()
                    us = time_graph(f, reps=30) * 1e3
                except Exception as e:  # noqa: BLE001
                    print(shape, ctx, n, name, type(e).__name__, str(e)[:200], flush=True)
                    continue
                row = dict(shape=shape, context=ctx, n=n, form=name, us=us, floor_us=kv / bw / 1e6,
                           tbps=kv / us / 1e6, tflops=flop / us / 1e6, rel_err_vs_old=err)
                out["rows"].append(row)
                print(f"{shape:12s} {ctx:6d} n {n:2d} {name:24s} {us:8.1f} us  floor {row['floor_us']:7.1f}  "
                      f"{row['tbps']:.2f} TB/s  {row['tflops']:6.1f} TFLOP/s  err {err:.1e}", flush=True)
                save()
if os.environ.get("PROBE_STEPS", "1"):
    from ssv.bench.e2e_steps import SHAPES as STEP_SHAPES, fill_cache, random_model, synthetic_tree
    from ssv.attention import VerifyOptions
    from ssv.attention_device import device_plan
    from ssv.engine.device_round import DeviceEngine
    from ssv.engine.runner import Runner
    # the window form, the dense kernel without and with its L2 prefetch and for the AR step too were variants
    # here at 98ae585 (bench/results/gpu-s50/b/); since then the plan runs the dense kernel alone
    VARIANTS = ((None, "dense_verify"),)
    step_ctx = {"llama3.1-8b": (8192, 65536, 131072), "smollm2-135m": (4096, 8192)}
    for shape in os.environ.get("PROBE_STEP_SHAPES", "llama3.1-8b").split():
        cfg = STEP_SHAPES[shape]
        model = random_model(cfg)
        gen = torch.Generator(device="cuda").manual_seed(0)
        with torch.no_grad():
            for ctx in step_ctx[shape]:
                depth, mask = synthetic_tree(48, torch.Generator().manual_seed(ctx), "cuda")
                tokens = torch.randint(0, cfg.vocab_size, (48,), device="cuda")
                runner = Runner(model, attention="dense", max_len=ctx + 256)
                fill_cache(runner, ctx, gen)
                dlen0 = runner.cache.dlen.clone()
                for rep in range(int(os.environ.get("PROBE_STEP_REPS", "1"))):
                    for _, label in VARIANTS:
                        eng = DeviceEngine(runner)
                        reset = lambda: runner.cache.dlen.copy_(dlen0)  # noqa: E731
                        ar = time_graph(eng._ar_body, before=reset)
                        reset()
                        plan = device_plan("dense", runner.nsa, VerifyOptions(), 48, runner.cache, cfg.n_heads, True)

                        def verify(plan=plan):
                            p = runner.cache.dlen.long() + depth
                            plan.plan(runner.cache.dlen, p, mask)
                            model(tokens, p, plan, runner.cache)
                        vf = time_graph(verify)
                        out["steps"].append(dict(shape=shape, context=ctx, kernel=label, rep=rep, ar_dense_ms=ar,
                                                 verify_dense_ms=vf))
                        print(f"{shape:12s} {ctx:6d} {label:26s} ar dense {ar:7.3f} ms  verify dense {vf:7.3f} ms",
                              flush=True)
                        save()
                        del eng
                del runner
                torch.cuda.empty_cache()
        del model
        torch.cuda.empty_cache()
