"""Timing helpers for the CPU scripts (scripts/cpu_*.py): a warmed median, and the attention plan's
share of a forward."""
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
