"""The CPU's longer steps (a 2K prefill in 256-token chunks, a 48-row verify pass) with their GEMMs on
F.linear against the form the calibration picks for more than MAX_ROWS rows (ssv/ops/linear/cpu.py),
alternating; medians. Writes OUT.json with the environment.
    python scripts/cpu_prefill_forms.py OUT.json [repeats]
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

import ssv.ops.linear.cpu as cpu
from ssv.attention import StepMeta
from ssv.bench.env import environment
from ssv.cli import load_model
from ssv.engine.runner import Runner


@torch.no_grad()
def main(out: str, repeats: int = 3) -> None:
    model, tok = load_model("default", "cpu", progress=False)
    ids = tok.encode(json.load(open(".stage/e2e-prompts.json"))["code"][0])[:2048]
    r = Runner(model, attention="nsa")
    calibrated = cpu.cpu_forms()
    forms = {"linear": calibrated[:-1] + ("linear",), "calibrated": calibrated}
    real = cpu._calibrated
    t = {(f, k): [] for f in forms for k in ("prefill 2K", "verify 48 rows")}
    for _ in range(repeats):
        for f, table in forms.items():
            cpu._calibrated = lambda threads, table=table: table
            t0 = time.perf_counter()
            r.reset()
            r.prefill(ids)
            t[f, "prefill 2K"].append(time.perf_counter() - t0)
            toks = torch.tensor(ids[-48:])
            r.forward(toks, StepMeta.chain(r.length, 48))
            t0 = time.perf_counter()
            r.forward(toks, StepMeta.chain(r.length, 48))
            t[f, "verify 48 rows"].append(time.perf_counter() - t0)
    cpu._calibrated = real
    rows = [dict(form=f, step=k, seconds=statistics.median(v), runs=v) for (f, k), v in t.items()]
    for row in rows:
        print(f"{row['step']:16s} {row['form']:10s} {row['seconds']:.3f} s", flush=True)
    json.dump(dict(env=environment("cpu"), many_rows_form=calibrated[-1], repeats=repeats, rows=rows),
              open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
