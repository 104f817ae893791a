"""The AR fall-back's policy (`ssv.spec.fallback.ArFallback`) on simulated texts: a round costs `be`
AR steps and emits 1 + L tokens, L the accepted draft length with P(L >= k) = a^k (k <= depth), so
a stretch of text is one acceptance rate a. A text is either one rate throughout or alternates
between two rates every `seg` tokens (`regime` texts: real texts mix stretches the head drafts well
and badly, e.g. the prose 4K e2e prompt). Each text stops at exactly TOKENS tokens (a last round's
surplus is dropped, as `ssv bench e2e` counts), and its speed (tokens per AR-step time) is compared
with plain AR (1.0) and with speculating every round, run through the same harness.
The engine's evidence is modelled as it reaches the policy: the prompt's prime (PRIME_PAIRS rows at
the text's first rate), and the ring's catch-up agreement every 32 AR steps and at a burst's end
(31 pairs; top-1 and top-k hits both Binomial(pairs, a), so `expected_length` is unbiased for this
text model). Prints a table, writes OUT.json.
    python3 scripts/sim_fallback.py OUT.json ['{"slack": 4}' '{"trust_agreement": false}' ...]
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

DEPTH, TOKENS, RUNS, BREAK_EVEN = 6, 128, 400, 1.78   # break-even: H200, default model, 1K-8K (e2e-cuda-e513856.json)
RING, PRIME_PAIRS = 32, 256
RATES = [0.2, 0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8]
REGIMES = [(0.3, 0.6, 24), (0.35, 0.7, 24), (0.3, 0.7, 48), (0.2, 0.8, 32)]   # (a, a', seg tokens)


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
    rule = kw.get("rule")
    kw = {k: v for k, v in kw.items() if k not in ("rule", "evidence")}
    return WindowMean(**kw) if rule == "mean" else ArFallback(**kw)


def mal(a: float) -> float:
    return 1 + sum(a ** k for k in range(1, DEPTH + 1))


def rate_at(text, made: int) -> float:
    if isinstance(text, tuple):
        lo, hi, seg = text
        return lo if (made // seg) % 2 == 0 else hi
    return text


def mean_mal(text) -> float:
    return statistics.fmean(mal(rate_at(text, i)) for i in range(TOKENS))


def run_text(p: ArFallback, text, be: float, rng: random.Random, evidence: bool) -> float:
    p.reset()
    made, t, ring = 0, 0.0, []

    def agreement(rows):
        pairs = len(rows) - 1
        h = sum(rng.random() < a for a in rows[1:])
        return h, h, pairs

    if evidence:
        a0 = rate_at(text, 0)
        h = sum(rng.random() < a0 for _ in range(PRIME_PAIRS))
        p.prime(h, h, PRIME_PAIRS, DEPTH)
    while made < TOKENS:
        if p.check_due:
            p.burst_end(agreement(ring) if evidence and len(ring) > 1 else None, DEPTH)
            ring = []
        if p.use_ar():
            if len(ring) == RING:                 # the ring flushes before the step that would overflow it
                got, ring = agreement(ring), []
            else:
                got = None
            ring.append(rate_at(text, made))
            p.observe_ar(1.0)
            made, t = made + 1, t + 1.0
            if evidence and got is not None:
                p.observe_agreement(*got, DEPTH)
            continue
        ring = []
        a = rate_at(text, made)
        acc = 0
        while acc < DEPTH and rng.random() < a:
            acc += 1
        p.observe_spec(1 + acc, be)
        made, t = made + 1 + acc, t + be
    return TOKENS / t


def speed(kw: dict, text) -> float:
    rng = random.Random(0)
    ev = kw.get("evidence", True)
    return statistics.fmean(run_text(policy(kw), text, BREAK_EVEN, rng, ev) for _ in range(RUNS))


def main(out: str, settings: list) -> None:
    rows = []
    for text in RATES + REGIMES:
        always = speed(dict(slack=1e9, evidence=False), text)   # never bursts: speculation every round
        for kw in settings:
            s = speed(kw, text)
            rows.append(dict(settings=kw, text=text, mal=mean_mal(text), vs_ar=s, always_spec_vs_ar=always,
                             vs_always_spec=s / always, vs_best=s / max(1.0, always)))
            print(f"{json.dumps(kw):44s} {str(text):16s} MAL {mean_mal(text):.2f}  vs AR {s:.3f}  always-spec "
                  f"{always:.3f}  vs best {rows[-1]['vs_best']:.3f}", flush=True)
    env = dict(device="cpu (simulation)", date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    json.dump(dict(env=env, depth=DEPTH, tokens=TOKENS, runs=RUNS, break_even=BREAK_EVEN, ring=RING,
                   prime_pairs=PRIME_PAIRS, rows=rows), open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], [json.loads(s) for s in sys.argv[2:]] or [{}])
