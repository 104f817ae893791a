"""The AR fall-back: its policy, and that rounds interleaved with AR steps emit AR's tokens and leave the
drafter where committing every token would have (the device ring caught up, the host rows committed)."""
import pytest
import torch

from ssv.draft import Eagle3Drafter
from ssv.engine.device_round import DeviceEngine
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.engine.spec import SpecOptions, generate_spec
from ssv.spec.fallback import ArFallback
from ssv.spec.tree import TreeSpec

from ..draft.helpers import tiny_head
from ..draft.helpers import tiny_target as draft_target
from .test_device_round import GREEDY, NSA


def test_policy_bursts_double_and_reset_when_a_probe_pays():
    f = ArFallback(slack=2, min_ar=4, max_ar=16, prior_break_even=2.5)
    f.observe_spec(1, 1.0)                    # S = 1.5 <= 2: within the slack
    assert not f.use_ar()
    f.observe_spec(1, 1.0)                    # S = 3 > 2: a burst
    assert f.ar_left == 4
    for _ in range(4):
        assert f.use_ar()
        f.observe_ar(0.5)
    assert not f.use_ar()
    f.observe_spec(1, 1.0)                    # the probe starts at S = 1 (break-even now timed: 2): S = 2
    assert not f.use_ar()
    f.observe_spec(1, 1.0)                    # S = 3: the probe fails, a doubled burst
    assert f.ar_left == 8
    for _ in range(8):
        f.observe_ar(0.5)
    f.observe_spec(1, 1.0)
    assert not f.use_ar()
    f.observe_spec(7, 1.0)                    # S = max(0, 2 + 2 - 7) = 0: the probe paid, speculation resumes
    assert not f.use_ar() and f.backoff == 4
    # timed: the first sample of each kind is dropped (a capture), then medians
    assert f.break_even() == pytest.approx(1.0 / 0.5)
    s = f.summary()
    assert s["ar_steps"] == 12 and s["spec_rounds"] == 6 and [b["steps"] for b in s["bursts"]] == [4, 8]
    assert [b["observed_length"] for b in s["bursts"]] == [1.0, 1.0]


def test_policy_rides_out_short_rounds_on_a_text_that_pays_and_not_a_run_of_them():
    """Accepted lengths vary round to round: runs of three 1-token rounds between longer ones (the first
    10 rounds' mean 2.0 > 1.78) stay within the slack, where a mean over the last 4 rounds (1.75) burst
    at the 4th round; six 1-token rounds in a row do not."""
    f = ArFallback(slack=4, prior_break_even=1.78)
    for e in (1, 1, 1, 4, 3, 1, 1, 1, 5, 2, 1, 1, 1, 1):
        f.observe_spec(e, 1.0)
    assert not f.bursts and not f.use_ar()    # the last four 1s: S = 3.12
    f.observe_spec(1, 1.0)                    # a fifth: S = 3.90 <= 4
    assert not f.bursts
    f.observe_spec(1, 1.0)                    # a sixth: S = 4.68 > 4, a burst
    assert len(f.bursts) == 1 and f.use_ar()


def test_policy_caps_bursts_and_uses_the_prior_until_timed():
    f = ArFallback(slack=0, min_ar=2, max_ar=5, prior_break_even=3.0)
    assert f.break_even() == 3.0
    sizes = []
    for _ in range(4):
        f.observe_spec(1, 2.0)
        sizes.append(f.ar_left)
        while f.use_ar():
            f.observe_ar(1.0)
    assert sizes == [2, 4, 5, 5]
    assert f.break_even() == pytest.approx(2.0)


@pytest.mark.parametrize("bad", [dict(slack=-1.0), dict(min_ar=0), dict(min_ar=8, max_ar=4), dict(prior_break_even=0.5)])
def test_policy_refuses_bad_settings(bad):
    with pytest.raises(ValueError, match="ArFallback"):
        ArFallback(**bad)


@pytest.mark.parametrize("engine", [False, True])
def test_rounds_and_ar_steps_interleaved_keep_ar_tokens_and_the_drafter_in_step(engine):
    target = draft_target()
    r = Runner(target, attention="nsa", nsa=NSA, max_len=300)
    prompt = torch.randint(3, target.cfg.vocab_size, (41,), generator=torch.Generator().manual_seed(3)).tolist()
    ar = generate_ar(r, prompt, GREEDY, 50)
    d = Eagle3Drafter(tiny_head(target, draft_vocab=40, window=9), target)
    eng = DeviceEngine(r, d, check_sync=True) if engine else None
    # a break-even no round reaches: bursts after every probe (6 steps: the ring of 9 fills and flushes)
    fb = ArFallback(slack=0, min_ar=6, max_ar=12, prior_break_even=50.0)
    fb.break_even = lambda: 50.0
    res = generate_spec(r, d, prompt, GREEDY, 50, opts=SpecOptions(tree=TreeSpec(3, 2, 6)), engine=eng, fallback=fb)
    assert res.token_ids == ar.token_ids
    assert res.stats["ar_steps"] >= 30 and res.stats["rounds"] >= 3
    bursts = res.stats["fallback"]["bursts"]
    assert [b["steps"] for b in bursts][:3] == [6, 12, 12]
    assert bursts[0]["after_round"] == 0      # the prompt's agreement: no round spent to learn it
    if engine:
        eng.catch_up()
        assert int(d.dlen) == d.length == r.length
    # the drafter's state equals a drafter that committed every token on the host (the host
    # fall-back commits the rows it holds at the next round: compare up to what it committed)
    seq = (prompt + res.token_ids[:-1])[:d.length]
    ref = Eagle3Drafter(tiny_head(target, draft_vocab=40, window=9), target)
    r2 = Runner(target, attention="nsa", nsa=NSA, max_len=300)
    _, chunks = r2.prefill(seq, taps=ref.taps)
    taps = [torch.cat([c[i] for c in chunks]) for i in range(len(ref.taps))]
    nxt = (prompt + res.token_ids)[1:len(seq) + 1]
    for c in range(0, len(seq), 8):   # in chunks within the window
        ref.commit([t[c:c + 8] for t in taps], torch.tensor(nxt[c:c + 8]))
    torch.testing.assert_close(d.dlogp_buf, ref.dlogp_buf, rtol=1e-4, atol=1e-4)
    assert torch.equal(d.slot_pos, ref.slot_pos)


def test_a_generation_ending_inside_a_burst_leaves_nothing_for_the_next():
    """The engine's ring rows of a generation cut short inside an AR burst are dropped at the next
    start: the next generation's drafter holds exactly its own rows, and it drafts as a fresh one."""
    target = draft_target()
    r = Runner(target, attention="nsa", nsa=NSA, max_len=300)
    prompt = torch.randint(3, target.cfg.vocab_size, (41,), generator=torch.Generator().manual_seed(3)).tolist()
    d = Eagle3Drafter(tiny_head(target, draft_vocab=40, window=64), target)
    eng = DeviceEngine(r, d)
    opts = SpecOptions(tree=TreeSpec(3, 2, 6))

    def bursts():
        fb = ArFallback(slack=0, min_ar=30, max_ar=30, prior_break_even=50.0)
        fb.break_even = lambda: 50.0
        return fb
    generate_spec(r, d, prompt, GREEDY, 12, opts=opts, engine=eng, fallback=bursts())   # ends mid-burst
    assert eng.ring.pending > 0
    res = generate_spec(r, d, prompt[:30], GREEDY, 20, opts=opts, engine=eng, fallback=bursts())
    eng.catch_up()
    assert int(d.dlen) == d.length == r.length
    fresh_d = Eagle3Drafter(tiny_head(target, draft_vocab=40, window=64), target)
    r2 = Runner(target, attention="nsa", nsa=NSA, max_len=300)
    fresh_eng = DeviceEngine(r2, fresh_d)
    fresh = generate_spec(r2, fresh_d, prompt[:30], GREEDY, 20, opts=opts, engine=fresh_eng, fallback=bursts())
    fresh_eng.catch_up()
    assert res.token_ids == fresh.token_ids
    assert res.stats["fallback"]["agreements"] == fresh.stats["fallback"]["agreements"]
    torch.testing.assert_close(d.dlogp_buf, fresh_d.dlogp_buf)


def test_policy_agreement_ends_a_burst_without_a_probe():
    f = ArFallback(slack=0, min_ar=64, max_ar=64, prior_break_even=2.5, min_pairs=16)
    f.observe_agreement(30, 31, 31, depth=6)      # not in a burst: no effect
    assert not f.use_ar() and not f.agreements
    f.observe_spec(1, 1.0)
    assert f.ar_left == 64
    f.observe_agreement(9, 10, 10, depth=6)       # too few pairs
    f.observe_agreement(6, 12, 31, depth=6)       # 1 + (12/31)(1 - a1^6)/(1 - a1) = 1.48 < 2.5: on
    assert f.use_ar()
    f.observe_agreement(15, 26, 31, depth=6)      # a1 0.48, a8 0.84: 2.61 >= 2.5: speculation resumes
    assert not f.use_ar() and f.backoff == 64
    ag = f.summary()["agreements"]
    assert [a["top1"] for a in ag] == [6, 15]
    a1, ak = 15 / 31, 26 / 31
    assert ag[1]["expected_length"] == pytest.approx(1 + ak * (1 - a1 ** 6) / (1 - a1))


def test_engine_agreement_counts_the_heads_depth1_hits():
    """The catch-up's hits: the head's greedy draft at each caught-up row against the next token, as
    committing the same rows one by one on the host predicts them."""
    target = draft_target()
    r = Runner(target, attention="nsa", nsa=NSA, max_len=300)
    prompt = torch.randint(3, target.cfg.vocab_size, (37,), generator=torch.Generator().manual_seed(5)).tolist()
    head = tiny_head(target, draft_vocab=40, window=64)
    d, ref = Eagle3Drafter(head, target), Eagle3Drafter(head, target)
    logits, chunks = r.prefill(prompt, taps=d.taps)
    root = int(logits.argmax())
    taps = [torch.cat([c[i] for c in chunks]) for i in range(len(d.taps))]
    d.commit(taps, torch.tensor(prompt[1:] + [root]))
    eng = DeviceEngine(r, d)
    eng.start(root)
    toks = [root]
    for _ in range(20):
        toks += eng.ar_step(keep_taps=True)
    assert eng.take_agreement() is None           # nothing caught up yet: no read
    seen = []
    real = d.commit_rows

    def spy(*a, **k):
        seen.append(real(*a, **k))
        return seen[-1]
    d.commit_rows = spy
    eng.catch_up()
    top1, topk, pairs = eng.take_agreement()
    assert pairs == 19 and eng.take_agreement() is None
    # the reference: the same rows committed one at a time by a host drafter
    r2 = Runner(target, attention="nsa", nsa=NSA, max_len=300)
    _, chunks = r2.prefill(prompt + toks[:-1], taps=ref.taps)
    allt = [torch.cat([c[i] for c in chunks]) for i in range(len(ref.taps))]
    ref.commit([t[:len(prompt)] for t in allt], torch.tensor(prompt[1:] + [root]))
    preds = []
    for i in range(20):
        lp = ref.commit([t[len(prompt) + i:len(prompt) + i + 1] for t in allt], torch.tensor([toks[i + 1]]))
        preds.append(lp.topk(8).indices.tolist())
    assert seen[0][:20].tolist() == preds
    assert top1 == sum(preds[i][0] == toks[i + 2] for i in range(19))
    assert topk == sum(toks[i + 2] in preds[i] for i in range(19))   # (0 for this random head: the planted test counts hits)


def test_engine_agreement_counts_hits_of_known_predictions(monkeypatch):
    """Planted predictions (every third one wrong): the count is exactly the planted hits, padded
    rows and the last row (no next token yet) not counted."""
    target = draft_target()
    r = Runner(target, attention="nsa", nsa=NSA, max_len=300)
    d = Eagle3Drafter(tiny_head(target, draft_vocab=40, window=64), target)
    prompt = list(range(3, 30))
    logits, chunks = r.prefill(prompt, taps=d.taps)
    d.commit([torch.cat([c[i] for c in chunks]) for i in range(3)], torch.tensor(prompt[1:] + [5]))
    eng = DeviceEngine(r, d)
    eng.start(5)
    toks = [5] + [eng.ar_step(keep_taps=True)[0] for _ in range(13)]
    ring = eng.ring.toks.clone()

    def planted(taps, tokens, n, predict=0):
        nxt = torch.roll(tokens, -1)
        pred = torch.stack([nxt + 1 + j for j in range(predict)], -1)   # top-1 misses everywhere ...
        pred[1::3, 0] = nxt[1::3]                        # ... but at rows 1, 4, 7, ...
        pred[::2, 3] = nxt[::2]                          # the 4th choice hits at even rows
        return pred
    monkeypatch.setattr(d, "commit_rows", planted)
    eng.catch_up()
    top1, topk, pairs = eng.take_agreement()
    assert torch.equal(ring[:13], torch.tensor(toks[1:]))
    assert pairs == 12 and top1 == sum(1 for i in range(12) if i % 3 == 1)
    assert topk == sum(1 for i in range(12) if i % 3 == 1 or i % 2 == 0)


@pytest.mark.parametrize("trust", [True, False])
def test_policy_burst_end_extends_without_a_probe_or_lets_the_round_run(trust):
    f = ArFallback(slack=0, min_ar=2, max_ar=8, prior_break_even=2.5, min_pairs=4, trust_agreement=trust)
    f.observe_spec(1, 1.0)
    for _ in range(2):
        f.observe_ar(0.5)
    assert f.check_due and not f.use_ar()
    f.burst_end((1, 2, 10), depth=6)               # poor drafts: a doubled burst, no round
    assert not f.check_due and f.ar_left == 4 and [b[1] for b in f.bursts] == [2, 4]
    for _ in range(4):
        f.observe_ar(0.5)
    f.burst_end((9, 10, 10), depth=6)              # good drafts: the next round runs
    assert not f.use_ar() and len(f.bursts) == 2
    # trusted, the drafts clear the failure (the first burst's length, S = 0); else the round is a
    # failed probe's successor (the doubled burst)
    assert f.backoff == (2 if trust else 8)
    f.observe_spec(1, 1.0)                         # the round falls short after all
    assert f.ar_left == (2 if trust else 8)
    for _ in range(f.ar_left):
        f.observe_ar(0.5)
    f.burst_end(None, depth=6)                     # no evidence (host rounds): the probe decides
    assert not f.use_ar() and not f.check_due


def test_policy_trusted_agreement_judges_the_next_rounds_from_zero():
    """After a burst whose rows say rounds pay, a shortfall of up to `slack` tokens runs no burst;
    untrusted, the rounds start from slack / 2 as a probe's."""
    for trust, bursts_after in ((True, 3), (False, 2)):
        f = ArFallback(slack=2, min_ar=4, max_ar=16, prior_break_even=2.0, min_pairs=4, trust_agreement=trust)
        for _ in range(3):
            f.observe_spec(1, 1.0)                 # S = 1, 2, 3 > 2: a burst
        assert f.ar_left == 4
        for _ in range(4):
            f.observe_ar(0.5)
        f.burst_end((9, 10, 10), depth=6)
        n = 0
        while not f.use_ar():
            f.observe_spec(1, 1.0)                 # one token short each (the break-even is 2)
            n += 1
        assert n == bursts_after


def test_policy_prime_starts_with_a_burst_only_when_the_prompt_would_not_pay():
    f = ArFallback(slack=4, min_ar=4, max_ar=16, prior_break_even=2.5, min_pairs=16, prime_scale=1.0)
    f.prime(6, 12, 31, depth=6)                    # 1.48 < 2.5: a burst first, as after a failed probe
    assert f.ar_left == 4 and f.backoff == 8 and f.bursts[0][:3] == (0, 4, None)
    h = ArFallback(slack=4, min_ar=4, max_ar=16, prior_break_even=2.5, min_pairs=16, prime_scale=1.75)
    h.prime(6, 12, 31, depth=6)                    # 1.75 x 1.48 >= 2.5: the prompt's estimate scaled up pays
    assert not h.use_ar()
    g = ArFallback(slack=4, min_ar=4, max_ar=16, prior_break_even=2.5, min_pairs=16)
    g.prime(15, 26, 31, depth=6)                   # 2.61 >= 2.5: speculation from the start
    assert not g.use_ar() and not g.bursts and g.backoff == 4
    g.prime(1, 2, 15, depth=6)                     # too few pairs: no evidence
    assert not g.use_ar()
    g.observe_spec(1, 1.0)
    g.prime(1, 2, 31, depth=6)                     # only before the first step
    assert not g.use_ar()
    for bad in (dict(prime_rows=-1), dict(prime_scale=0.0)):
        with pytest.raises(ValueError, match="prime"):
            ArFallback(**bad)


def test_commit_agreement_counts_the_heads_hits_on_the_prompts_last_rows():
    """Planted tokens: the next token is the head's own first choice at every third row, its third
    choice at the next, a token outside its top-3 at the third; `commit(agree=(3, m))` over the last m
    rows counts exactly those, in chunks (chunk 7) as in one piece."""
    target = draft_target()
    head = tiny_head(target, draft_vocab=40, window=64)
    gen = torch.Generator().manual_seed(11)
    n = 30
    taps = [torch.randn(n, target.cfg.hidden_size, generator=gen) for _ in range(3)]
    ref = Eagle3Drafter(head, target)
    toks = [int(ref.vocab_ids[0])]
    kinds = []
    for i in range(n - 1):                          # row i's prediction names toks[i + 1]
        lp = ref.commit([t[i:i + 1] for t in taps], torch.tensor([toks[i]]))
        top = lp.topk(4).indices.tolist()
        kinds.append(i % 3)
        toks.append(top[0] if i % 3 == 0 else top[2] if i % 3 == 1 else top[3])
    for chunk in (64, 7):
        for m in (n, 12):
            d = Eagle3Drafter(head, target, chunk=chunk)
            d.commit(taps, torch.tensor(toks), agree=(3, m))
            last = kinds[-(m - 1):]
            assert d.agreement == (last.count(0), last.count(0) + last.count(1), m - 1)
    d = Eagle3Drafter(head, target)
    d.commit(taps, torch.tensor(toks))
    assert d.agreement is None


def test_policy_without_agreement_judges_by_rounds_alone():
    """use_agreement=False (a round with a context lookup accepts more than the head drafts): neither
    the prompt's agreement nor a burst's starts or extends a burst; the probe round decides."""
    f = ArFallback(slack=0, min_ar=2, max_ar=8, prior_break_even=2.5, min_pairs=4, use_agreement=False)
    f.prime(1, 2, 31, depth=6)                     # would not pay by the head: ignored
    assert not f.use_ar() and not f.bursts
    f.observe_spec(1, 1.0)                         # a round short of the break-even: a burst
    for _ in range(2):
        f.observe_ar(0.5)
    f.burst_end((1, 2, 10), depth=6)               # poor drafts: no extension, the probe runs
    assert not f.use_ar() and [b[1] for b in f.bursts] == [2]
