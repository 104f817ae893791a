"""Whole graphed rounds on the GPU without a checkpoint: ssv strict and sd-naive rounds (48-node trees, the
draft phase included) and the AR step, random weights of the default model's shape and a random EAGLE-3
head (8,192 draft tokens), CTX (4K) of random cache; round ms (median of REPS blocks of 20 after a capture
and a warm block), GPU-busy fraction (torch profiler). Run once per package (PYTHONPATH) and interleave
the packages' runs: a machine's first run is slower (session 47's step tables). Writes OUT/round-TAG.json.
    TAG=head python3 scripts/probe_round.py"""
import json
import os
import sys

import torch

sys.path.insert(0, ".")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from round_timing import round_rows  # noqa: E402
from ssv.bench.e2e import mode_table  # noqa: E402
from ssv.bench.e2e_steps import SHAPES, fill_cache, random_model  # noqa: E402
from ssv.bench.env import environment  # noqa: E402
from ssv.draft import Eagle3Drafter  # noqa: E402
from ssv.draft.eagle3 import Eagle3Config, Eagle3Head  # noqa: E402
from ssv.engine.device_round import DeviceEngine  # noqa: E402
from ssv.engine.runner import Runner  # noqa: E402
from ssv.spec.tree import TreeSpec  # noqa: E402

CTX, REPS, N, TAG = int(os.environ.get("CTX", "4096")), int(os.environ.get("REPS", "5")), 20, os.environ.get("TAG", "x")
cfg = SHAPES["smollm2-135m"]
torch.manual_seed(0)
m = random_model(cfg)
modes = mode_table(cfg.n_layers, TreeSpec(6, 8, 48))
d = Eagle3Drafter(Eagle3Head(Eagle3Config.for_target(cfg, 8192)).cuda().to(torch.bfloat16), m)
d.commit([torch.randn(64, cfg.hidden_size, device="cuda", dtype=torch.bfloat16) for _ in range(3)],
         torch.randint(0, 8192, (64,), device="cuda"))
r = Runner(m, attention="nsa", max_len=8192 + 384)
fill_cache(r, CTX, torch.Generator(device="cuda").manual_seed(0))
eng = DeviceEngine(r, d)
eng.start(7)


steps = {k: (lambda o=modes[k][1]: eng.spec_round(o), r) for k in ("ssv strict", "sd-naive")}
steps["ar-nsa step"] = (eng.ar_step, r)
res = {"env": environment(), "tag": TAG, "context": CTX, "tree": "6x8x48", "rounds_per_block": N,
       "rows": round_rows(steps, N, REPS, CTX)}
for row in res["rows"]:
    print(f"{TAG:8s} {row['mode']:14s} {row['round_ms']:.3f} ms  busy {row['gpu_busy_fraction']:.2f}  "
          f"{[round(x, 3) for x in row['round_ms_all']]}")
with open(os.path.join(os.environ.get("OUT", "bench/results"), f"round-{TAG}.json"), "w") as f:
    json.dump(res, f, indent=1)
