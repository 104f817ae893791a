"""The AR fall-back's policy (`ssv.spec.fallback.ArFallback`) on simulated texts: a round costs `be`
AR steps and emits 1 + L tokens, L the accepted draft length with P(L >= k) = a^k (k <= depth), so
a text is one acceptance rate a. Each text stops at exactly TOKENS tokens (a last round's surplus is
dropped, as `ssv bench e2e` counts), and its speed (tokens per AR-step time) is compared with plain AR
(1.0) and with speculating every round, run through the same harness. Not modelled: the agreement
estimate at a burst's end and the prompt's prime (both shorten bursts on texts that pay and lengthen
them on texts that do not) and the ring's catch-up commit. Prints a table, writes OUT.json.
    python3 scripts/sim_fallback.py OUT.json ['{"slack": 4}' '{"rule": "mean", "window": 4}' ...]
`{"rule": "mean", "window": 4}` is the rule before bd51d76 (a burst when the mean of the last 4 rounds
is below the break-even; probes judged on their own window).
"""
from __future__ import annotations

import datetime
import json
import random
import statistics
import sys
from collections import deque
from dataclasses import dataclass

from ssv.spec.fallback import ArFallback

DEPTH, TOKENS, RUNS, BREAK_EVEN = 6, 128, 400, 1.78   # break-even: H200, default model, 1K-8K (e2e-cuda.json)
RATES = [0.2, 0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8]


@dataclass
class WindowMean(ArFallback):
    window: int = 4

    def reset(self) -> None:
        super().reset()
        self._win: deque = deque(maxlen=self.window)

    def _probe(self) -> None:
        super()._probe()
        self._win.clear()

    def observe_spec(self, emitted: int, seconds: float) -> None:
        self.rounds += 1
        self._time("spec", seconds, self._t_spec)
        self._win.append(emitted)
        if len(self._win) < self.window:
            return
        mean, be = sum(self._win) / len(self._win), self.break_even()
        if mean < be:
            self._burst(self.rounds, mean, be)
        else:
            self.backoff = self.min_ar


def policy(kw: dict) -> ArFallback:
    kw = dict(kw)
    return WindowMean(**{k: v for k, v in kw.items() if k != "rule"}) if kw.get("rule") == "mean" else ArFallback(**kw)


def mal(a: float) -> float:
    return 1 + sum(a ** k for k in range(1, DEPTH + 1))


def run_text(p: ArFallback, a: float, be: float, rng: random.Random) -> float:
    p.reset()
    made, t = 0, 0.0
    while made < TOKENS:
        if p.use_ar():
            p.observe_ar(1.0)
            made, t = made + 1, t + 1.0
            if p.check_due:
                p.burst_end(None, DEPTH)
            continue
        acc = 0
        while acc < DEPTH and rng.random() < a:
            acc += 1
        p.observe_spec(1 + acc, be)
        made, t = made + 1 + acc, t + be
    return TOKENS / t


def speed(kw: dict, a: float) -> float:
    rng = random.Random(0)
    return statistics.fmean(run_text(policy(kw), a, BREAK_EVEN, rng) for _ in range(RUNS))


def main(out: str, settings: list) -> None:
    rows = []
    for a in RATES:
        always = speed(dict(slack=1e9), a)   # never bursts: speculation every round, same harness
        for kw in settings:
            s = speed(kw, a)
            rows.append(dict(settings=kw, accept_rate=a, mal=mal(a), vs_ar=s, always_spec_vs_ar=always,
                             vs_always_spec=s / always, vs_best=s / max(1.0, always)))
            print(f"{json.dumps(kw):32s} a {a:.2f} MAL {mal(a):.2f}  vs AR {s:.3f}  vs always-spec "
                  f"{s / always:.3f}  vs best {rows[-1]['vs_best']:.3f}", flush=True)
    env = dict(device="cpu (simulation)", date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    json.dump(dict(env=env, depth=DEPTH, tokens=TOKENS, runs=RUNS, break_even=BREAK_EVEN, rows=rows),
              open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], [json.loads(s) for s in sys.argv[2:]] or [{}])
