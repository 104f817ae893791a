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
import time

import torch

import ssv.ops.nsa.cpu as nsa_cpu
from ssv.attention import StepMeta
from ssv.bench.cpu import attention_timer
from ssv.bench.kernels import environment
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
            t = {(f, m): ([], []) for f in forms for m in (1, 4, 6)}
            for _ in range(rounds):
                for f, gb in forms.items():
                    nsa_cpu.GATHER_SKIPS = gb
                    for m in (1, 4, 6):
                        toks = torch.randint(0, 1000, (m,), generator=torch.Generator().manual_seed(m))
                        r.forward(toks, StepMeta.chain(r.length, m))          # not committed: the same step
                        for _ in range(3):
                            attn[0] = 0.0
                            t0 = time.perf_counter()
                            r.forward(toks, StepMeta.chain(r.length, m))
                            t[f, m][0].append(time.perf_counter() - t0)
                            t[f, m][1].append(attn[0])
            nsa_cpu.GATHER_SKIPS = default
            for (f, m), (step, at) in t.items():
                row = dict(context=P, form=f, rows=m, step_ms=statistics.median(step) * 1e3,
                           attention_ms=statistics.median(at) * 1e3)
                rows.append(row)
                print(f"{P:6d} {f:16s} rows {m}: step {row['step_ms']:6.1f} ms, attention {row['attention_ms']:5.1f} ms",
                      flush=True)
    json.dump(dict(env=environment("cpu"), threads=torch.get_num_threads(), gather_skips=default, rounds=rounds,
                   rows=rows), open(out, "w"), indent=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], int(a[1]) if len(a) > 1 else 5, tuple(int(x) for x in a[2:]) or (2048, 4096, 8000))
