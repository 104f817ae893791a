"""The CPU's inference linear forms side by side (fp32, this machine's threads): F.linear (x @ W.T, what
the model runs), (W @ x.T).T (ssv's CPU form before 2026-12-03) and x @ W.T-contiguous (a transposed
copy of the weight), for the default model's matrices at 1 / 4 / 8 rows; hot (one weight, repeated)
and cold (60 distinct weights in turn, as a step streams its layers). Medians in us.

    python scripts/cpu_linear_forms.py
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F


def timed(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        ts.append((time.perf_counter() - t0) / reps * 1e6)
    return statistics.median(ts)


def main():
    torch.manual_seed(0)
    for o, i in ((1536, 576), (576, 1536), (576, 576), (192, 576), (49152, 576)):
        ws = [torch.randn(o, i) for _ in range(1 if o > 4096 else 60)]
        wts = [w.t().contiguous() for w in ws]
        for m in (1, 4, 8):
            x = torch.randn(m, i)
            for name, sub in (("hot", slice(0, 1)), ("cold", slice(None))):
                if name == "cold" and len(ws) == 1:
                    continue
                w_, wt_ = ws[sub], wts[sub]
                r = {f: timed(fn, 20 if name == "hot" else 3) / len(w_) for f, fn in (
                    ("x @ W.T", lambda: [F.linear(x, w) for w in w_]),
                    ("(W @ x.T).T", lambda: [torch.mm(w, x.t()) for w in w_]),
                    ("x @ Wt", lambda: [torch.mm(x, wt) for wt in wt_]))}
                print(f"{o:5d} x {i:4d} rows {m} {name:4s} " + "  ".join(f"{k} {v:8.1f}" for k, v in r.items()),
                      flush=True)


if __name__ == "__main__":
    main()
