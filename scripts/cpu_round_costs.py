"""Where a CPU ssv strict round's time goes at 2K (default model and head, fp32): one AR step against
one round of the CPU's default tree (`ssv.cli.cpu_tree()`: draft, verify, accept, commit), interleaved; the attention plan's share of each
forward timed by wrapping the plan's run. Prints ms medians, writes JSON.

    python scripts/cpu_round_costs.py [P] [rounds] [out.json] [D,K,N]   (a tree other than the default)
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from ssv.attention import StepMeta
from ssv.bench.cpu import attention_timer
from ssv.cli import cpu_tree, load_model
from ssv.draft import load_drafter
from ssv.engine import spec
from ssv.engine.runner import Runner
from ssv.spec.accept import SamplingParams
from ssv.spec.tree import TreeSpec


def main(P=2048, rounds=12, out=None, shape=None):
    shape = tuple(shape) if shape else cpu_tree()
    model, tok = load_model("default", "cpu", progress=False)
    drafter = load_drafter("default", model)
    text = json.load(open(".stage/e2e-prompts.json"))["code"][0]
    ids = tok.encode(text)[:P]
    r = Runner(model, attention="nsa")
    opts = spec.SpecOptions(tree=TreeSpec(*shape))
    params, gen = SamplingParams(temperature=0.0), torch.Generator().manual_seed(0)
    with attention_timer() as attn:   # the attention plan's seconds, reset per step
        logits, chunks = r.prefill(ids, taps=drafter.taps)
        root = int(logits.argmax())
        taps = [torch.cat([c[i] for c in chunks]) for i in range(len(drafter.taps))]
        root_logp = drafter.commit(taps, torch.tensor(ids[1:] + [root]))
        t = {k: [] for k in ("ar", "ar_attn", "draft", "verify", "verify_attn", "accept", "commit", "round")}
        mal = []
        for _ in range(rounds):
            attn[0] = 0.0
            t0 = time.perf_counter()
            r.forward(torch.tensor([root]), StepMeta.chain(r.length, 1), taps=drafter.taps)   # not committed
            t["ar"].append(time.perf_counter() - t0)
            t["ar_attn"].append(attn[0])
            attn[0] = 0.0
            t0 = time.perf_counter()
            tree, _ = spec.draft(drafter, root, root_logp, opts)
            t1 = time.perf_counter()
            logits, vt = spec.verify(r, tree, opts, taps=drafter.taps)
            t2 = time.perf_counter()
            res = spec.accept(tree, logits, params, gen)
            t3 = time.perf_counter()
            root_logp = spec.commit(r, drafter, res, vt)
            t4 = time.perf_counter()
            root = res.bonus
            mal.append(len(res.tokens) + 1)
            for k, v in (("draft", t1 - t0), ("verify", t2 - t1), ("verify_attn", attn[0]), ("accept", t3 - t2),
                         ("commit", t4 - t3), ("round", t4 - t0)):
                t[k].append(v)
    med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
    for k, v in med.items():
        print(f"{k:12s} {v:8.1f} ms")
    print(f"round / AR step {med['round'] / med['ar']:.2f}; MAL {statistics.mean(mal):.2f}")
    if out:
        commit = os.environ.get("SSV_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                                 capture_output=True, text=True).stdout.strip()
        from ssv.ops.linear.cpu import cpu_forms
        env = dict(device="cpu", torch=torch.__version__, date=datetime.date.today().isoformat(), commit=commit,
                   cpu_gemm=list(cpu_forms()))
        json.dump(dict(env=env, context=P, rounds=rounds, tree=shape, threads=torch.get_num_threads(), ms=med,
                       mal=statistics.mean(mal)),
                  open(out, "w"), indent=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]) if a else 2048, int(a[1]) if len(a) > 1 else 12, a[2] if len(a) > 2 else None,
         [int(v) for v in a[3].split(",")] if len(a) > 3 else None)
