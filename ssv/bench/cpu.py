"""Timing helpers for the CPU scripts (scripts/cpu_*.py): a warmed median, the attention plan's
share of a forward, and uncommitted steps timed with it."""
from __future__ import annotations

import contextlib
import statistics
import time


def median_ms(fn, reps: int = 7) -> float:
    """fn's median wall time in ms over `reps` calls, after one untimed call."""
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


@contextlib.contextmanager
def attention_timer():
    """Within the block, every `NSAPlan.run` (the CPU's attention) adds its seconds to the yielded
    one-element list, which the caller may reset; the plan is restored on exit."""
    from ssv.attention import NSAPlan
    spent = [0.0]
    run0 = NSAPlan.run

    def timed_run(self, *a, **k):
        t = time.perf_counter()
        o = run0(self, *a, **k)
        spent[0] += time.perf_counter() - t
        return o
    NSAPlan.run = timed_run
    try:
        yield spent
    finally:
        NSAPlan.run = run0


def time_steps(runner, rows: int, spent: list, reps: int = 3) -> list:
    """`reps` timings (step seconds, attention seconds) of one uncommitted forward of `rows` chain tokens
    after the runner's committed prefix (the same step each time, after one untimed call); `spent` is
    `attention_timer`'s list."""
    import torch

    from ssv.attention import StepMeta
    vocab = min(1000, runner.model.cfg.vocab_size)
    toks = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(rows))
    runner.forward(toks, StepMeta.chain(runner.length, rows))
    out = []
    for _ in range(reps):
        spent[0] = 0.0
        t = time.perf_counter()
        runner.forward(toks, StepMeta.chain(runner.length, rows))
        out.append((time.perf_counter() - t, spent[0]))
    return out
