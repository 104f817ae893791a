"""The GEMM-form calibration's 4-row question on two sets of weight shapes, side by side in one process:
q, k, v, gate, up apart (what `ssv.ops.linear.cpu._calibrate` timed before session 36) against q|k|v,
o, gate|up, down (what the CPU step multiplies, `layer_shapes` since). 8 layers of the default model's
shapes a set (113 MB, read from memory), each form's fastest of 4 reps, at 1-6 rows, REPEATS times
alternating. Writes OUT.json with the environment.
    python3 scripts/cpu_calib_shapes.py OUT.json [repeats]
"""
from __future__ import annotations

import json
import sys

import torch

import ssv.ops.linear.cpu as cpu
from ssv.bench.env import environment

H, I, KV = 576, 1536, 192
SETS = {"apart": [(H, H), (KV, H), (KV, H), (H, H), (I, H), (I, H), (H, I)],
        "step": cpu.layer_shapes(H, I, KV)}


@torch.no_grad()
def main(out: str, repeats: int = 3) -> None:
    ws = {k: [torch.full(s, 0.01 * (i + 1)) for i in range(8) for s in v] for k, v in SETS.items()}
    forms = cpu.available_forms()
    for w in ws.values():
        for f in forms:
            [cpu.cpu_linear(torch.zeros(1, x.shape[1]), x, form=f) for x in w]
    rows = []
    for rep in range(repeats):
        for name, w in ws.items():
            for m in (1, 3, 4, 6):
                xs = {k: torch.full((m, k), 0.5) for k in (H, I)}
                t = {f: cpu._time(lambda f=f: [cpu.cpu_linear(xs[x.shape[1]], x, form=f) for x in w], 4) * 1e3
                     for f in forms}
                rows.append(dict(rep=rep, shapes=name, rows=m, ms=t, chosen=cpu._choose({k: v for k, v in t.items()})))
                print(rep, name, m, {k: round(v, 2) for k, v in t.items()}, rows[-1]["chosen"], flush=True)
    json.dump(dict(env=environment("cpu"), sets=SETS, rows=rows), open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
