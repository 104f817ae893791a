"""The CPU's prefill and step costs (default model, fp32, this machine's threads), written to JSON with
the environment: `Runner.prefill` of the code prompt at each context (its last logits' argmax kept, to
compare builds); after a 2K prefill, one target step of 1..5 new tokens (a chain, not committed) and
the tied 49152 x 576 head's F.linear at 1..5 rows (medians). Run it in two checkouts back to back to
compare builds (SSV_COMMIT names a checkout without git).

    python scripts/cpu_prefill_rows.py OUT.json [--contexts 1024 2048 4096] [--no-rows]
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from ssv.attention import StepMeta
from ssv.bench.cpu import median_ms
from ssv.bench.env import environment
from ssv.cli import load_model
from ssv.engine.runner import Runner


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--contexts", nargs="+", type=int, default=[1024, 2048, 4096])
    p.add_argument("--prompts", default=".stage/e2e-prompts.json")
    p.add_argument("--no-rows", action="store_true")
    a = p.parse_args()
    model, tok = load_model("default", "cpu", progress=False)
    ids = tok.encode(json.load(open(a.prompts))["code"][0])
    doc = {"env": environment("cpu"), "threads": torch.get_num_threads(), "prefill": [], "step_rows": [],
           "head_rows": []}
    for L in a.contexts:
        r = Runner(model, attention="nsa")
        t0 = time.perf_counter()
        logits, _ = r.prefill(ids[:L])
        s = time.perf_counter() - t0
        doc["prefill"].append({"context": L, "seconds": s, "tokens_per_second": L / s, "argmax": int(logits.argmax())})
        print(f"prefill {L}: {s:.2f} s ({L / s:.0f} tok/s)", flush=True)
    if not a.no_rows:
        r = Runner(model, attention="nsa")
        r.prefill(ids[:2048])
        for n in range(1, 6):
            ms = median_ms(lambda: r.forward(torch.arange(n), StepMeta.chain(r.length, n)), 7)
            doc["step_rows"].append({"context": 2048, "rows": n, "ms": ms})
            print(f"step of {n} rows at 2K: {ms:.1f} ms", flush=True)
        w = model.embed_tokens.weight
        for n in range(1, 6):
            x = torch.randn(n, w.shape[1])
            ms = median_ms(lambda: F.linear(x, w), 9)
            doc["head_rows"].append({"rows": n, "ms": ms})
            print(f"head at {n} rows: {ms:.2f} ms", flush=True)
    json.dump(doc, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
