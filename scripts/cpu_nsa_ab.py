"""In-process A/B of the CPU NSA module (ssv/ops/nsa/cpu.py) against another version of that file (an
earlier commit's, e.g. from `git worktree add /tmp/base <commit>`): one prefill per context, then AR
steps (1 row) and 4-row chains with each module's CpuStep / nsa_cpu in turn, the attention plan's
share timed by wrapping its run; medians. The layers are the current ones for both. Writes OUT.json.
    python scripts/cpu_nsa_ab.py OUT.json OLD/ssv/ops/nsa/cpu.py [repeats] [contexts...]
"""
from __future__ import annotations

import importlib.util
import json
import statistics
import sys

import torch

import ssv.attention as attention
import ssv.ops.nsa.cpu as current
from ssv.bench.cpu import attention_timer, time_steps
from ssv.bench.env import environment
from ssv.cli import load_model
from ssv.engine.runner import Runner


@torch.no_grad()
def main(out: str, old_path: str, repeats: int = 6, contexts=(2048, 8000)) -> None:
    spec = importlib.util.spec_from_file_location("nsa_cpu_old", old_path)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    model, tok = load_model("default", "cpu", progress=False)
    ids = tok.encode(" ".join(json.load(open(".stage/e2e-prompts.json"))["prose"]))
    rows = []
    keep = attention.CpuStep, attention.nsa_cpu
    try:
        for P in contexts:
            r = Runner(model, attention="nsa", max_len=P + 64)
            r.prefill(ids[:P])
            res = {}
            with attention_timer() as at:
                for _ in range(repeats):
                    for name, mod in (("old", old), ("current", current)):
                        attention.CpuStep, attention.nsa_cpu = mod.CpuStep, mod.nsa_cpu
                        for m in (1, 4):
                            res.setdefault((name, m), []).extend(time_steps(r, m, at))
            for (name, m), v in sorted(res.items()):
                row = dict(context=P, module=name, rows=m, step_ms=statistics.median(x[0] for x in v) * 1e3,
                           attention_ms=statistics.median(x[1] for x in v) * 1e3)
                rows.append(row)
                print(f"{P:6d} {name:8s} rows {m}: step {row['step_ms']:6.1f} ms, attention {row['attention_ms']:5.1f} ms",
                      flush=True)
    finally:
        attention.CpuStep, attention.nsa_cpu = keep
    json.dump(dict(env=environment("cpu"), old=old_path, repeats=repeats, rows=rows), open(out, "w"), indent=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]) if len(a) > 2 else 6, [int(x) for x in a[3:]] or (2048, 8000))
