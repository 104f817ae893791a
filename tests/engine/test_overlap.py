"""The overlapped device loops (`generate_ar` and `generate_spec` on a DeviceEngine launch step r + 1
before they finish step r): the same tokens as the sequential host loops; a step launched past a
stop token is discarded and leaves the engine's lengths where the text ended; a step is launched
ahead only when the text needs it, so a length limit discards nothing."""
import pytest
import torch

from ssv.draft import Eagle3Drafter
from ssv.engine.device_round import DeviceEngine
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.engine.spec import SpecOptions, generate_spec
from ssv.spec.fallback import ArFallback
from ssv.spec.tree import TreeSpec

from ..conftest import make_tiny_model
from ..draft.helpers import tiny_head
from .test_device_round import GREEDY, NSA

OPTS = SpecOptions(tree=TreeSpec(3, 2, 6))


def _setup(max_len=300):
    target = make_tiny_model(1, vocab=64, n_layers=4)     # a varied greedy text (no early fixed point)
    prompt = torch.randint(0, 64, (53,), generator=torch.Generator().manual_seed(2)).tolist()
    r = Runner(target, attention="nsa", nsa=NSA, max_len=max_len)
    d = Eagle3Drafter(tiny_head(target, draft_vocab=40, window=64), target)
    return target, prompt, r, d


def _stop_token(text, lo=10):
    """A token whose first place in the text is at lo or later: generation must stop there."""
    tok = next(t for i, t in enumerate(text) if i >= lo and t not in text[:i])
    return tok, text.index(tok)


class Counting(DeviceEngine):
    def __init__(self, *a, overlap=True, **k):   # the CPU runs the overlapped loops too (not its default)
        super().__init__(*a, overlap=overlap, **k)
        self.launched = self.discarded = 0

    def _record(self, *a):
        self.launched += 1
        return super()._record(*a)

    def discard(self, t):
        self.discarded += 1
        super().discard(t)


def _consistent(r, d=None):
    assert int(r.cache.dlen) == r.length
    if d is not None:
        assert int(d.dlen) == d.length


def test_ar_overlap_stops_at_eos_and_discards_the_step_after_it():
    target, prompt, r, _ = _setup()
    ar = generate_ar(r, prompt, GREEDY, 40).token_ids
    stop, first = _stop_token(ar)
    eng = Counting(r)
    res = generate_ar(r, prompt, GREEDY, 40, stop_ids=(stop,), engine=eng)
    assert res.token_ids == ar[:first + 1] and res.stats["stop"] == "eos"
    assert eng.discarded == 1 and eng.launched == first + 1    # the one launched past the stop
    _consistent(r)
    assert r.length == len(prompt) + first           # the stop token itself is not in the cache
    # a length limit is known ahead: nothing launched past it
    eng.launched = 0
    res = generate_ar(r, prompt, GREEDY, 12, engine=eng)
    assert res.token_ids == ar[:12] and eng.launched == 11 and eng.discarded == 1   # still the first one
    _consistent(r)


@pytest.mark.parametrize("fallback", [False, True])
def test_spec_overlap_stops_at_eos_and_leaves_the_engine_as_a_fresh_one(fallback):
    target, prompt, r, d = _setup()
    ar = generate_ar(Runner(target, attention="nsa", nsa=NSA, max_len=300), prompt, GREEDY, 48).token_ids
    stop, first = _stop_token(ar, 20)

    def fb():
        if not fallback:
            return None
        f = ArFallback(slack=0, min_ar=3, max_ar=6, prior_break_even=50.0)
        f.break_even = lambda: 50.0          # bursts after every round: AR steps and rounds interleave
        return f
    eng = Counting(r, d)
    res = generate_spec(r, d, prompt, GREEDY, 48, opts=OPTS, engine=eng, stop_ids=(stop,), fallback=fb())
    assert res.token_ids == ar[:first + 1] and res.stats["stop"] == "eos"
    assert eng.discarded == 1                         # the step launched past the stop
    eng.catch_up()
    _consistent(r, d)
    # the next generation on this engine equals one on a fresh engine
    again = generate_spec(r, d, prompt[:30], GREEDY, 20, opts=OPTS, engine=eng, fallback=fb())
    t2, _, r2, d2 = _setup()
    fresh = generate_spec(r2, d2, prompt[:30], GREEDY, 20, opts=OPTS, engine=Counting(r2, d2), fallback=fb())
    assert again.token_ids == fresh.token_ids
    assert again.stats["rounds"] == fresh.stats["rounds"] and again.stats["ar_steps"] == fresh.stats["ar_steps"]
    torch.testing.assert_close(d.dlogp_buf, d2.dlogp_buf)


def test_spec_overlap_launches_nothing_past_a_length_limit():
    target, prompt, r, d = _setup()
    eng = Counting(r, d)
    res = generate_spec(r, d, prompt, GREEDY, 25, opts=OPTS, engine=eng)
    assert eng.discarded == 0 and eng.launched == res.stats["rounds"] and len(res.token_ids) == 25
    _consistent(r, d)


def test_spec_overlap_stops_at_the_context_limit_as_the_host_loop():
    target, prompt, _, _ = _setup()
    got = []
    for fast in (False, True):
        _, _, r, d = _setup(max_len=80)
        res = generate_spec(r, d, prompt, GREEDY, 100, opts=OPTS, engine=Counting(r, d) if fast else None)
        got.append((res.token_ids, res.stats["stop"]))
        _consistent(r, d) if fast else None
    assert got[0] == got[1] and got[0][1] == "context"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the pinned record and its events need a GPU")
def test_cuda_graphed_overlap_stops_where_the_whole_text_says():
    """On CUDA (graphs, records copied to pinned slots behind them): a generation stopped by a token
    equals the unstopped one cut there, and the discarded step leaves the lengths consistent."""
    target = make_tiny_model(1, vocab=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16).cuda().to(torch.bfloat16)
    prompt = torch.randint(0, 64, (53,), generator=torch.Generator().manual_seed(2)).tolist()
    r = Runner(target, attention="nsa", nsa=NSA, max_len=300)
    d = Eagle3Drafter(tiny_head(target, draft_vocab=40, window=64).cuda().to(torch.bfloat16), target)
    eng = Counting(r, d)
    whole = generate_spec(r, d, prompt, GREEDY, 48, opts=OPTS, engine=eng).token_ids
    ar = generate_ar(r, prompt, GREEDY, 48, engine=eng).token_ids
    for text, run in ((whole, lambda s: generate_spec(r, d, prompt, GREEDY, 48, opts=OPTS, engine=eng, stop_ids=s)),
                      (ar, lambda s: generate_ar(r, prompt, GREEDY, 48, engine=eng, stop_ids=s))):
        stop, first = _stop_token(text, 20)
        eng.discarded = 0
        res = run((stop,))
        assert res.token_ids == text[:first + 1] and eng.discarded == 1
        eng.catch_up()
        _consistent(r, d)
    assert not eng._eager


@pytest.mark.parametrize("spec_mode", [False, True])
def test_without_overlap_a_step_is_finished_before_the_next_and_none_is_discarded(spec_mode):
    """The CPU's default: each step runs as it is launched, so nothing is launched ahead of a stop."""
    target, prompt, r, d = _setup()
    ar = generate_ar(Runner(target, attention="nsa", nsa=NSA, max_len=300), prompt, GREEDY, 40).token_ids
    stop, first = _stop_token(ar, 15)
    eng = Counting(r, d, overlap=False)
    assert DeviceEngine(r, d).overlap is False                    # the CPU default
    res = (generate_spec(r, d, prompt, GREEDY, 40, opts=OPTS, engine=eng, stop_ids=(stop,)) if spec_mode
           else generate_ar(r, prompt, GREEDY, 40, engine=eng, stop_ids=(stop,)))
    assert res.token_ids == ar[:first + 1] and eng.discarded == 0
    assert eng.launched == (res.stats["rounds"] if spec_mode else first)
