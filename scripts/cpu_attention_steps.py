"""The CPU step with NSA's token branches over every slot against over the gathered blocks only
(ssv/ops/nsa/cpu.py, `GATHER_SKIPS`), at 2K, 4K and 8K: the default model's AR step (1 row) and
verify passes (4 and 6 rows, chains), the attention plan's share timed by wrapping its run. The two
forms alternate in every round; medians. Writes OUT.json with the environment.
    python scripts/cpu_attention_steps.py OUT.json [rounds] [contexts...]
"""
from __future__ import annotations

import json
import statistics
import sys

import torch

import ssv.ops.nsa.cpu as nsa_cpu
from ssv.bench.cpu import attention_timer, time_steps
from ssv.bench.env import environment
from ssv.cli import load_model
from ssv.engine.runner import Runner


@torch.no_grad()
def main(out: str, rounds: int = 5, contexts=(2048, 4096, 8000)) -> None:
    model, tok = load_model("default", "cpu", progress=False)
    ids = tok.encode(" ".join(json.load(open(".stage/e2e-prompts.json"))["prose"]))
    with attention_timer() as attn:   # the attention plan's seconds, reset per step
        default = nsa_cpu.GATHER_SKIPS
        forms = {"every slot": 10 ** 9, "gathered blocks": default}
        rows = []
        for P in contexts:
            r = Runner(model, attention="nsa", max_len=max(contexts) + 64)
            r.prefill(ids[:P])
            t = {(f, m): [] for f in forms for m in (1, 4, 6)}
            for _ in range(rounds):
                for f, gb in forms.items():
                    nsa_cpu.GATHER_SKIPS = gb
                    for m in (1, 4, 6):
                        t[f, m] += time_steps(r, m, attn)
            nsa_cpu.GATHER_SKIPS = default
            for (f, m), v in t.items():
                row = dict(context=P, form=f, rows=m, step_ms=statistics.median(x[0] for x in v) * 1e3,
                           attention_ms=statistics.median(x[1] for x in v) * 1e3)
                rows.append(row)
                print(f"{P:6d} {f:16s} rows {m}: step {row['step_ms']:6.1f} ms, attention {row['attention_ms']:5.1f} ms",
                      flush=True)
    json.dump(dict(env=environment("cpu"), threads=torch.get_num_threads(), gather_skips=default, rounds=rounds,
                   rows=rows), open(out, "w"), indent=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], int(a[1]) if len(a) > 1 else 5, tuple(int(x) for x in a[2:]) or (2048, 4096, 8000))
