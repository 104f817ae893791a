"""The AR fall-back's policy (`ssv.spec.fallback.ArFallback`) on simulated texts: a round costs `be`
AR steps and emits 1 + L tokens, L the accepted draft length with P(L >= k) = a^k (k <= depth), so
a text is one acceptance rate a; tokens per AR-step time, relative to plain AR (1.0) and to
speculating every round (MAL / be). Prints a table, writes OUT.json (policy settings as JSON args).
    python3 scripts/sim_fallback.py OUT.json ['{"slack": 4}' ...]
"""
from __future__ import annotations

import json
import random
import statistics
import sys

from ssv.spec.fallback import ArFallback

DEPTH, TOKENS, RUNS = 6, 128, 400


def mal(a: float) -> float:
    return 1 + sum(a ** k for k in range(1, DEPTH + 1))


def run_text(policy: ArFallback, a: float, be: float, rng: random.Random) -> float:
    policy.reset()
    made = t = 0.0
    while made < TOKENS:
        if policy.use_ar():
            policy.observe_ar(1.0)
            made, t = made + 1, t + 1.0
            if policy.check_due:
                policy.burst_end(None, DEPTH)
            continue
        acc = 0
        while acc < DEPTH and rng.random() < a:
            acc += 1
        policy.observe_spec(1 + acc, be)
        made, t = made + 1 + acc, t + be
    return made / t


def main(out: str, settings: list) -> None:
    be = 1.78   # H200, default model, 1K-8K (bench/results/e2e-cuda.json's fall-back summaries)
    rates = [0.2, 0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8]
    rows = []
    for kw in settings:
        for a in rates:
            rng = random.Random(0)
            speed = statistics.fmean(run_text(ArFallback(**kw), a, be, rng) for _ in range(RUNS))
            best = max(1.0, mal(a) / be)
            rows.append(dict(settings=kw, accept_rate=a, mal=mal(a), break_even=be, vs_ar=speed,
                             vs_always_spec=speed / (mal(a) / be), vs_best=speed / best))
            print(f"{json.dumps(kw):28s} a {a:.2f} MAL {mal(a):.2f}  vs AR {speed:.3f}  vs always-spec "
                  f"{rows[-1]['vs_always_spec']:.3f}  vs best {rows[-1]['vs_best']:.3f}", flush=True)
    json.dump(dict(depth=DEPTH, tokens=TOKENS, runs=RUNS, rows=rows), open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], [json.loads(s) for s in sys.argv[2:]] or [{}])
