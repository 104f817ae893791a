"""Prefill time on the CPU (default model, fp32, the runner's 256-token chunks) at the given prompt
lengths: wall seconds and the attention plan's share (its run wrapped), medians over repeats after one
warm-up chunk. Writes OUT.json with the environment.
    python scripts/cpu_prefill.py OUT.json [repeats] [lengths...]
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from ssv.bench.cpu import attention_timer
from ssv.bench.env import environment
from ssv.cli import load_model
from ssv.engine.runner import Runner


@torch.no_grad()
def main(out: str, repeats: int = 2, lengths=(2048, 8000)) -> None:
    model, tok = load_model("default", "cpu", progress=False)
    ids = tok.encode(" ".join(json.load(open(".stage/e2e-prompts.json"))["prose"]))
    rows = []
    with attention_timer() as attn:
        for n in lengths:
            r = Runner(model, attention="nsa", max_len=n + 64)
            r.prefill(ids[:256])          # warm-up: allocations, the GEMM forms' first calls
            wall, at = [], []
            for _ in range(repeats):
                r.reset()
                attn[0] = 0.0
                t = time.perf_counter()
                r.prefill(ids[:n])
                wall.append(time.perf_counter() - t)
                at.append(attn[0])
            row = dict(tokens=n, seconds=statistics.median(wall), attention_seconds=statistics.median(at),
                       runs=wall)
            rows.append(row)
            print(f"prefill {n:6d} tokens: {row['seconds']:6.2f} s, attention {row['attention_seconds']:6.2f} s",
                  flush=True)
    json.dump(dict(env=environment("cpu"), threads=torch.get_num_threads(), repeats=repeats, rows=rows),
              open(out, "w"), indent=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], int(a[1]) if len(a) > 1 else 2, [int(x) for x in a[2:]] or (2048, 8000))
