"""The CPU scripts' timing helpers (ssv/bench/cpu.py)."""
import time

import torch

from ssv.attention import NSAPlan, StepMeta
from ssv.bench.cpu import attention_timer, median_ms, time_steps


def test_median_ms_warms_up_then_takes_the_median():
    calls = []
    sleeps = iter([0.0, 0.001, 0.030, 0.002])    # the first call is untimed; then the median of three

    def fn():
        calls.append(1)
        time.sleep(next(sleeps))
    ms = median_ms(fn, 3)
    assert len(calls) == 4 and 1.5 < ms < 25


def test_attention_timer_counts_the_plan_and_restores_it():
    from .conftest import make_tiny_model

    from ssv.engine.runner import Runner
    run0 = NSAPlan.run
    r = Runner(make_tiny_model(0, n_layers=2), attention="nsa")
    r.prefill(list(range(20)))
    with attention_timer() as spent:
        assert NSAPlan.run is not run0
        r.forward(torch.tensor([3]), StepMeta.chain(r.length, 1))
        assert spent[0] > 0
    assert NSAPlan.run is run0
    try:
        with attention_timer():
            raise RuntimeError("cut")
    except RuntimeError:
        pass
    assert NSAPlan.run is run0


def test_time_steps_leaves_the_prefix_uncommitted():
    # one untimed call, then `reps` timings of the same uncommitted step, each with its attention share
    from .conftest import make_tiny_model

    from ssv.engine.runner import Runner
    r = Runner(make_tiny_model(0, n_layers=2), attention="nsa")
    r.prefill(list(range(20)))
    calls = []
    fwd = r.forward
    r.forward = lambda toks, meta, **kw: calls.append((toks.numel(), meta.prefix_len)) or fwd(toks, meta, **kw)
    with attention_timer() as spent:
        t = time_steps(r, 3, spent, reps=2)
    assert len(t) == 2 and all(step >= att > 0 for step, att in t)
    assert calls == [(3, 20)] * 3 and r.length == 20
