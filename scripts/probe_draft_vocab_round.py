"""What the grown draft vocabulary costs a graphed round on the GPU: ssv strict rounds (48-node trees,
4K context, random weights of the default model's shape) with heads of 8,192 and 12,288 draft tokens
side by side in one process, alternating, and the AR step beside them; round ms (median of REPS blocks
of 20) and GPU-busy fraction (kernel time over wall time, torch profiler). Writes OUT/draft-vocab-round-COMMIT.json.
    python3 scripts/probe_draft_vocab_round.py
"""
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

CTX, REPS, N = int(os.environ.get("CTX", "4096")), int(os.environ.get("REPS", "5")), 20
cfg = SHAPES["smollm2-135m"]
m = random_model(cfg)
opts = mode_table(cfg.n_layers, TreeSpec(6, 8, 48))["ssv strict"][1]
runs = {}
for vocab in (8192, 12288):
    d = Eagle3Drafter(Eagle3Head(Eagle3Config.for_target(cfg, vocab)).cuda().to(torch.bfloat16), m)
    d.commit([torch.randn(64, cfg.hidden_size, device="cuda", dtype=torch.bfloat16) for _ in range(3)],
             torch.randint(0, vocab, (64,), device="cuda"))
    r = Runner(m, attention="nsa", max_len=8192 + 384)
    fill_cache(r, CTX, torch.Generator(device="cuda").manual_seed(0))
    eng = DeviceEngine(r, d)
    eng.start(7)
    runs[vocab] = (r, eng)


steps = {}
for vocab, (r, eng) in runs.items():
    steps[f"ssv strict, draft vocab {vocab}"] = (lambda e=eng: e.spec_round(opts), r)
steps["ar-nsa step"] = (lambda e=runs[8192][1]: e.ar_step(), runs[8192][0])
res = {"env": environment(), "context": CTX, "tree": "6x8x48", "rounds_per_block": N,
       "rows": round_rows(steps, N, REPS, CTX, warm=1)}
for row in res["rows"]:
    print(f"{row['mode']:32s} {row['round_ms']:.3f} ms  busy {row['gpu_busy_fraction']:.2f}  "
          f"{[round(x, 3) for x in row['round_ms_all']]}")
out = os.path.join(os.environ.get("OUT", "bench/results"), f"draft-vocab-round-{res['env']['commit']}.json")
with open(out, "w") as f:
    json.dump(res, f, indent=1)
print("wrote", out)
