"""When speculation does not pay, plain AR steps: an online switch on the observed acceptance.

A speculative round costs about `break_even` AR steps (round time / AR step time); it pays only when
it emits more tokens than that. `ArFallback` keeps a one-sided CUSUM of the rounds' shortfall,
`S = max(0, S + break_even - emitted)`, and the wall time of rounds and steps as the user sees them
(each ends with the round's one device read); when S exceeds `slack` tokens it runs a burst of AR
steps, then probes: the rounds after it start from S = slack / 2, so a text that still does not pay
bursts again after a few rounds and one that does returns to S = 0. (A mean over the last 4 rounds,
the rule before, burst on noise wherever the mean accepted length was near the break-even: on the H200
with a head at MAL 2.1-2.3 against a break-even of 1.78 it burst 2-4 times in 128 tokens and ran 9-22%
below speculating every round; `scripts/sim_fallback.py`.) Bursts
double while probes keep failing (up to `max_ar`) and shrink back once a probe pays, so a text the
head drafts badly costs a probe every few hundred tokens and a text it drafts well never leaves
speculation. Strict rounds and AR steps emit the same tokens, so switching never changes the output;
the drafter is kept in step by committing the AR steps' rows before the next round. Committing
them in batches also tells, for free, how often the head's drafts named the next token, which
estimates a round's accepted length (`expected_length`): a burst ends early when a round would
pay, and is extended without a probe round when it would not. A burst whose rows say a round pays
also clears the failure that started it: the next rounds start from S = 0 and a later burst from
`min_ar` (the H200's prose 4K prompt, at 41c211a, had bursts doubled to 64 steps and probes begun
half-way to the threshold right after its agreement estimated 3.1 and 2.8 tokens a round against a
break-even of 1.75, and ran 0.95x AR with the text at MAL 2.08).
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass


@dataclass
class ArFallback:
    # tokens a run of rounds may fall short of the break-even before a burst (the CUSUM's threshold;
    # 0: a burst after any round below the break-even), the first burst's length and the pairs an
    # agreement needs: chosen by simulation with the agreement and the prime modelled, on texts of one
    # acceptance rate and on texts alternating between two (scripts/sim_fallback.py, bench/NOTES.md
    # "Session 17": slack 4 with 32-step bursts lost 3-4% on texts that pay at MAL 2.0-2.4 and 8% on
    # alternating ones; 6 / 16 / 15 lose <= 1.2% and <= 4.5%, for 1-2% more on texts that never pay)
    slack: float = 6.0
    min_ar: int = 16             # AR steps of the first burst (the engine's ring: its catch-up tells the agreement)
    max_ar: int = 256            # bursts double up to this
    # round / AR-step cost ratio until both are timed (H200 4K, 48 nodes: 1.82 at e513856, 2.05 with
    # PDL, bench/results/pdl/e2e-4k-93548e5.json: its AR step gained more than the round; 1.81 with
    # the tree finish and the accept record in one launch each, bench/results/round-ops/e2e-4k-cecf51d.json)
    prior_break_even: float = 1.8
    samples: int = 8             # timings kept (medians of the last few; the first of each is dropped: capture)
    min_pairs: int = 15          # caught-up rows an agreement rate needs (a first burst's 16 rows give 15)
    prime_rows: int = 256        # the prompt's last rows whose agreement decides the first step (0: off)
    prime_scale: float = 1.25    # the prompt's estimate times this is compared with the break-even
    trust_agreement: bool = True  # a burst's agreement that says rounds pay also clears its failure
    # the head's agreement estimates a round (prime, burst ends); off where a round drafts more than
    # the head (a context lookup, SpecOptions.lookup: on prose it accepts 1.6x the head's MAL)
    use_agreement: bool = True

    def __post_init__(self):
        if (not self.slack >= 0 or self.min_ar < 1 or self.max_ar < self.min_ar or self.samples < 1 or self.min_pairs < 1
                or self.prime_rows < 0 or not self.prime_scale > 0):
            raise ValueError("ArFallback: slack >= 0, min_ar, samples, min_pairs >= 1, max_ar >= min_ar, "
                             "prime_rows >= 0 and prime_scale > 0 are required")
        if not self.prior_break_even >= 1.0:
            raise ValueError(f"ArFallback: prior_break_even must be >= 1, got {self.prior_break_even}")
        self.reset()

    def reset(self) -> None:
        self._seen = [0, 0]        # tokens and rounds since the last burst (a burst's observed mean)
        self._deficit = 0.0        # the CUSUM S
        self._t_ar: deque = deque(maxlen=self.samples)
        self._t_spec: deque = deque(maxlen=self.samples)
        self._first = {"ar": True, "spec": True}
        self.ar_left = 0
        self.check_due = False
        self.backoff = self.min_ar
        self.bursts: list = []   # (spec round index, burst length, observed mean, break-even)
        self.rounds = self.ar_steps = 0
        self.agreements: list = []   # (AR steps so far, hits, pairs, predicted chain length)

    def use_ar(self) -> bool:
        return self.ar_left > 0

    def _burst(self, after_round: int, observed, be: float) -> None:
        """Start a burst of `backoff` AR steps (doubled for the next); the probe rounds after it start
        from S = slack / 2: the rounds before it are forgotten (they already failed)."""
        self.ar_left = self.backoff
        self.bursts.append((after_round, self.backoff, observed, be))
        self.backoff = min(2 * self.backoff, self.max_ar)
        self._probe()

    def _probe(self) -> None:
        self._seen = [0, 0]
        self._deficit = self.slack / 2

    def _cleared(self) -> None:
        """The burst's own rows say a round pays: the next rounds are judged from S = 0 with the
        first burst's length, not as a failed probe's (the doubled backoff, S = slack / 2)."""
        self._deficit = 0.0
        self.backoff = self.min_ar

    def _time(self, kind: str, seconds: float, into: deque) -> None:
        if self._first[kind]:
            self._first[kind] = False
        else:
            into.append(seconds)

    def break_even(self) -> float:
        if self._t_ar and self._t_spec:
            return max(1.0, statistics.median(self._t_spec) / statistics.median(self._t_ar))
        return self.prior_break_even

    def observe_ar(self, seconds: float) -> None:
        self.check_due = self.ar_left == 1      # the burst's last step: `burst_end` may extend it
        self.ar_left = max(0, self.ar_left - 1)
        self.ar_steps += 1
        self._time("ar", seconds, self._t_ar)

    def expected_length(self, top1: int, topk: int, pairs: int, depth: int) -> float:
        """The tokens a round would emit, from the depth-1 drafts of `pairs` committed rows: `topk`
        had the next token among the tree's first-level children, `top1` as the head's first choice.
        The first level accepts at a_k, each deeper one about at a_1: 1 + a_k (1 - a_1^D) / (1 - a_1).
        (The default head on the CPU, 6 texts of 3 families at 1K, 48-node trees: 1.50-2.52 estimated
        against 1.57-2.62 measured, mean |error| 0.08; a top-1 chain alone misses by 0.15-0.64:
        bench/results/fallback-estimate-cpu.json.)"""
        a1, ak = min(top1 / pairs, 0.999), topk / pairs
        est = 1.0 + ak * (1 - a1 ** depth) / (1 - a1)
        self.agreements.append((self.ar_steps, top1, topk, pairs, est))
        return est

    def burst_end(self, agreement, depth: int) -> None:
        """At a burst's end, with the burst's agreement (top-1 hits, top-k hits, pairs) or None: if
        the head's drafts would not pay, the burst is extended (doubled) without a probe round; else
        the next round runs (and is judged as a probe)."""
        self.check_due = False
        if not self.use_agreement or agreement is None or agreement[2] < self.min_pairs:
            return
        if self.expected_length(*agreement, depth) < self.break_even():
            self._burst(self.rounds, None, self.break_even())
        elif self.trust_agreement:
            self._cleared()

    def prime(self, top1: int, topk: int, pairs: int, depth: int) -> None:
        """Before the first round, the head's agreement with the prompt's own last rows (the
        drafter's prefill commit counts it, `Eagle3Drafter.commit(agree=...)`): when even that text
        would not pay a round, decoding starts with a burst, so no round is spent to learn it.
        The target's own continuation is more predictable than most prompts: on the H200 e2e
        prompts (default head, 3 families at 1K-8K) the measured MAL was 0.90-1.60x the prompt's
        estimate, median 1.33x (bench/results/e2e-cuda-ab2f480.json, `agreements[0]` beside the
        no-fall-back rows). A burst on a text that pays costs far more (up to `min_ar` slow steps)
        than two rounds on one that does not, so the estimate is scaled up (`prime_scale`)."""
        if not self.use_agreement or pairs < self.min_pairs or self.rounds or self.ar_steps:
            return
        be = self.break_even()
        if self.prime_scale * self.expected_length(top1, topk, pairs, depth) < be:   # as a failed probe
            self._burst(0, None, be)

    def observe_spec(self, emitted: int, seconds: float) -> None:
        self.rounds += 1
        self._time("spec", seconds, self._t_spec)
        self._seen = [self._seen[0] + emitted, self._seen[1] + 1]
        be = self.break_even()
        self._deficit = max(0.0, self._deficit + be - emitted)
        if self._deficit > self.slack:
            self._burst(self.rounds, self._seen[0] / self._seen[1], be)
        elif self._deficit == 0.0:
            self.backoff = self.min_ar      # the probe paid

    def observe_agreement(self, top1: int, topk: int, pairs: int, depth: int) -> None:
        """Evidence from the AR steps themselves, at no round's cost (a mid-burst catch-up's
        agreement, see `expected_length`): when a round would pay, the burst ends now."""
        if pairs < self.min_pairs or not self.use_ar():
            return
        if self.expected_length(top1, topk, pairs, depth) >= self.break_even():
            self.ar_left = 0
            self.backoff = self.min_ar
            self._probe()
            if self.trust_agreement:
                self._cleared()

    def summary(self) -> dict:
        """`observed_length` of a burst: the mean of the rounds since the previous burst (or the start),
        which may exceed the break-even when a run of short rounds ends a longer good stretch."""
        return {"ar_steps": self.ar_steps, "spec_rounds": self.rounds, "break_even": self.break_even(),
                "bursts": [{"after_round": r, "steps": n, "observed_length": m, "break_even": b}
                           for r, n, m, b in self.bursts],
                "agreements": [{"ar_steps": s, "top1": h1, "topk": hk, "pairs": p, "expected_length": e}
                               for s, h1, hk, p, e in self.agreements]}
