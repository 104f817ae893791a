"""Prefill time, the host's chunks (`Runner.prefill`: 128-row chunks, each step's kernels launched
eagerly) against the engine's graphed chunks (`DeviceEngine.prefill`), without the checkpoint: the
default model's shape with random bf16 weights, NSA, a random prompt. Per context: median ms of 3
timed runs after a warm-up run (compiles, capture), the tokens per second, the logits' largest
difference and whether their argmax agrees; with the drafter's taps (a speculative generation's
prefill) and without (AR's).
Usage: python3 scripts/probe_prefill.py [contexts...]   (JSON to $OUT or bench/results)"""
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
from ssv.bench.e2e_steps import SMOLLM2, random_model  # noqa: E402
from ssv.bench.env import environment  # noqa: E402
from ssv.engine.device_round import DeviceEngine  # noqa: E402
from ssv.engine.runner import Runner  # noqa: E402

contexts = [int(c) for c in sys.argv[1:]] or [1024, 4096, 8192, 16384]
cuda = torch.cuda.is_available()
torch.manual_seed(0)
cfg = SMOLLM2
if cuda:
    model = random_model(cfg)
else:   # a syntax check of this script on the CPU: a small shape, fp32
    import dataclasses
    from ssv.model import Transformer
    cfg = dataclasses.replace(SMOLLM2, vocab_size=512, n_layers=4, hidden_size=128, n_heads=2, n_kv_heads=1,
                              intermediate_size=256)
    model, contexts = Transformer(cfg).eval(), [300]
TAPS = (1, cfg.n_layers // 2, cfg.n_layers - 2)   # where an EAGLE-3 head reads (3 layers)


def sync():
    if cuda:
        torch.cuda.synchronize()


rows = []
for L in contexts:
    runner = Runner(model, attention="nsa", max_len=L + 512)
    eng = DeviceEngine(runner, graphs=cuda)
    prompt = torch.randint(0, cfg.vocab_size, (L,), generator=torch.Generator().manual_seed(L)).tolist()
    for taps in ((), TAPS):
        out = {}
        for name, fn in (("host", runner.prefill), ("graphed", eng.prefill)):
            ms = []
            for rep in range(4):   # rep 0: compiles and capture
                runner.reset()
                sync()
                t = time.perf_counter()
                logits, _ = fn(prompt, taps=taps)
                sync()
                ms.append(1e3 * (time.perf_counter() - t))
            out[name] = (statistics.median(ms[1:]), ms[0], logits.float())
        (h, h0, hl), (g, g0, gl) = out["host"], out["graphed"]
        rows.append({"context": L, "taps": list(taps), "host_ms": h, "graphed_ms": g, "speedup": h / g,
                     "host_first_ms": h0, "graphed_first_ms": g0,
                     "host_tokens_per_second": L / h * 1e3, "graphed_tokens_per_second": L / g * 1e3,
                     "logits_max_abs_diff": float((hl - gl).abs().max()), "argmax_equal": int(hl.argmax()) == int(gl.argmax())})
        r = rows[-1]
        print(f"{L:6d} taps={len(taps)}  host {h:8.1f} ms  graphed {g:7.1f} ms  {h / g:5.1f}x  "
              f"(first runs {h0:.0f} / {g0:.0f} ms)  max|dlogit| {r['logits_max_abs_diff']:.3g}  argmax equal {r['argmax_equal']}",
              flush=True)
out_dir = os.environ.get("OUT", "bench/results")
os.makedirs(out_dir, exist_ok=True)
path = os.path.join(out_dir, f"probe-prefill-{os.environ.get('SSV_COMMIT', 'local')}.json")
with open(path, "w") as f:
    json.dump({"env": environment("cuda" if cuda else "cpu"), "shape": "SmolLM2-135M, random bf16 weights" if cuda
               else "a small fp32 shape (CPU syntax check)", "rows": rows}, f, indent=1)
print("wrote", path)
