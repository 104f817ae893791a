"""The CPU decode step's GEMM forms timed side by side (ssv/ops/linear/cpu.py): F.linear, (w @ x.T).T
(one row padded to two) and oneDNN's packed weights at 1-256 rows over a SmolLM2-135M step's layer weights (30 layers of
q|k|v, o, gate|up and down, distinct random weights: 425 MB, read from memory) and over its 49152 x 576
head; the calibration's own time and choice; and a torch.profiler split of the default model's AR step
and 3-, 4- and 6-row verify passes at 2K in each form (the GEMMs' ops, aten::bmm). Medians; writes OUT.json with the environment.
    python scripts/cpu_gemm_forms.py OUT.json
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

from ssv.bench.cpu import median_ms
from ssv.bench.env import environment
from ssv.ops.linear import cpu

LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]   # q|k|v, o, gate|up, down
HEAD = (49152, 576)


def gemms(ws, m: int, form: str) -> float:
    xs = {w.shape[1]: torch.randn(m, w.shape[1]) for w in ws}
    return median_ms(lambda: [cpu.cpu_linear(xs[w.shape[1]], w, form=form) for w in ws])


def profile_steps() -> dict:
    from torch.profiler import ProfilerActivity, profile

    from ssv.attention import StepMeta
    from ssv.cli import load_model
    from ssv.engine.runner import Runner
    model, tok = load_model("default", "cpu", progress=False)
    ids = tok.encode(json.load(open(".stage/e2e-prompts.json"))["code"][0])[:2048]
    r = Runner(model, attention="nsa")
    r.prefill(ids)
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    steps = {"ar": lambda: r.forward(torch.tensor(ids[-1:]), StepMeta.chain(r.length, 1)),
             "verify 3 rows": lambda: r.forward(torch.tensor(ids[-3:]),
                                                StepMeta(r.length, torch.tensor([r.length, r.length + 1, r.length + 1]), mask)),
             "verify 4 rows": lambda: r.forward(torch.tensor(ids[-4:]), StepMeta.chain(r.length, 4)),
             "verify 6 rows": lambda: r.forward(torch.tensor(ids[-6:]), StepMeta.chain(r.length, 6))}
    out = {}
    for form in cpu.FORMS:   # dense() reads the env at every call
        os.environ[cpu.ENV] = form
        for name, f in steps.items():
            ms = median_ms(f, 5)
            with profile(activities=[ProfilerActivity.CPU]) as p:
                for _ in range(3):
                    f()
            ops = {e.key: e.self_cpu_time_total / 3e3 for e in p.key_averages() 
                   if e.key in ("aten::mm", "aten::bmm", "mkldnn::_linear_pointwise")}
            out[f"{name}, {form}"] = dict(ms=ms, **{k + " ms": v for k, v in ops.items()})
    del os.environ[cpu.ENV]
    return out


@torch.no_grad()
def main(out: str) -> None:
    torch.manual_seed(0)
    layer = [torch.randn(*s) for _ in range(30) for s in LAYER]
    head = [torch.randn(*HEAD)]
    rows = []
    for m in (1, 2, 3, 4, 5, 6, 8, 12, 16, 48, 256):
        row = {"rows": m}
        for f in cpu.FORMS:
            row[f"layers {f} ms"] = gemms(layer, m, f)
            row[f"head {f} ms"] = gemms(head, m, f)
        rows.append(row)
        print(row, flush=True)
    cpu._calibrated.cache_clear()
    t = time.perf_counter()
    forms, costs = cpu._calibrated(torch.get_num_threads())
    calib_s = time.perf_counter() - t
    doc = dict(env=environment("cpu"), threads=torch.get_num_threads(), weights_mb=sum(w.numel() for w in layer) * 4 / 1e6,
               rows=rows, calibration_seconds=calib_s, calibrated_forms=list(forms),
               calibrated_ms={m: t * 1e3 for m, t in costs.items()}, steps_2k=profile_steps())
    print(doc["calibration_seconds"], doc["calibrated_forms"], doc["steps_2k"])
    json.dump(doc, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
