"""The CPU's target step (the default model, fp32, 2 cores, after a prefill of P tokens): one step of
N new tokens (a chain) for several N, with `ssv.model.layers.linear` (W @ x.T on the CPU) and with
plain F.linear, interleaved round by round so that both see the same machine; the median of each.
Before that, the two matrix products alone (x @ W.T as F.linear takes it, and (W @ x.T).T) for the
tied head and an MLP projection at a few row counts, interleaved the same way. Prints tables,
writes JSON.

    python scripts/cpu_step_costs.py [P] [out.json]
"""
from __future__ import annotations

import datetime
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import ssv.model.layers as layers
import ssv.model.llama as llama
from ssv.attention import StepMeta
from ssv.cli import load_model
from ssv.engine.runner import Runner

NS = (1, 2, 4, 8, 16, 48)


def matmuls(rounds=6, reps=5):
    rows = []
    for name, (o, i) in (("head 49152 x 576", (49152, 576)), ("gate 1536 x 576", (1536, 576))):
        w = torch.randn(o, i)
        for m in (1, 2, 4, 16):
            x = torch.randn(m, i)
            t = {"x @ W.T": [], "(W @ x.T).T": []}
            for _ in range(rounds):
                for f, fn in (("x @ W.T", lambda: F.linear(x, w)), ("(W @ x.T).T", lambda: torch.mm(w, x.t()).t())):
                    fn()
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        fn()
                    t[f].append((time.perf_counter() - t0) / reps * 1e3)
            a, b = statistics.median(t["x @ W.T"]), statistics.median(t["(W @ x.T).T"])
            rows.append(dict(matrix=name, rows=m, ms_linear=a, ms_wxt=b))
            print(f"{name:17s} rows {m:2d}  x @ W.T {a:7.3f} ms  (W @ x.T).T {b:7.3f} ms  x{a / b:.2f}", flush=True)
    return rows


def main(P=1024, out="cpu-step-costs.json", rounds=5):
    torch.manual_seed(0)
    mm = matmuls()
    model, _ = load_model("default", "cpu", progress=False)
    r = Runner(model, attention="nsa")
    t0 = time.perf_counter()
    r.prefill(torch.randint(100, 40000, (P,)).tolist())
    prefill_s = time.perf_counter() - t0
    forms = {"W @ x.T": layers.linear, "F.linear": lambda x, w, b=None: F.linear(x, w, b)}
    times = {(f, n): [] for f in forms for n in NS}
    logits = {}
    for _ in range(rounds):
        for n in NS:
            meta = StepMeta.chain(r.length, n)
            toks = torch.arange(100, 100 + n)
            for f, fn in forms.items():
                layers.linear = llama.linear = fn
                t = time.perf_counter()
                logits[f, n] = r.forward(toks, meta)[0]
                times[f, n].append((time.perf_counter() - t) * 1e3)
    layers.linear = llama.linear = forms["W @ x.T"]
    rows = []
    for n in NS:
        a, b = (statistics.median(times[f, n]) for f in forms)
        diff = float((logits["W @ x.T", n] - logits["F.linear", n]).abs().max())
        same = bool(torch.equal(logits["W @ x.T", n].argmax(-1), logits["F.linear", n].argmax(-1)))
        rows.append(dict(n=n, ms_wxt=a, ms_linear=b, speedup=b / a, max_logit_diff=diff, same_argmax=same))
        print(f"P={P} N={n:3d}  W@x.T {a:7.1f} ms  F.linear {b:7.1f} ms  x{b / a:.2f}  "
              f"(max |dlogit| {diff:.1e}, argmax same {same})", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    env = dict(device=f"cpu ({torch.get_num_threads()} threads)", torch=torch.__version__,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), commit=commit)
    json.dump(dict(env=env, context=P, prefill_s=prefill_s, rounds=rounds, matmuls=mm, rows=rows), open(out, "w"),
              indent=1)
    print(f"prefill {P}: {prefill_s:.1f} s; wrote {out}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1024, sys.argv[2] if len(sys.argv) > 2 else "cpu-step-costs.json")
