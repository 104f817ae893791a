"""`DeviceEngine.prepare`: the buckets a generation uses are compiled / captured before its decode
clock, and the warm-up leaves the round's state as it found it."""
import pytest
import torch

from ssv.config import NSAConfig
from ssv.draft import Eagle3Drafter
from ssv.engine.device_round import DeviceEngine
from ssv.spec.fallback import ArFallback
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.engine.spec import SpecOptions, generate_spec
from ssv.spec.accept import SamplingParams
from ssv.spec.tree import TreeSpec

from ..draft.helpers import tiny_head
from ..draft.helpers import tiny_target as draft_target

NSA = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=16, n_select=4, forced_local=1, window=16)
GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.9)
def CUDA(fn):   # CUDA-only: marked (pytest -m cuda) and skipped without a GPU
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")(fn))


def _setup(device="cpu", **kw):
    target = draft_target(head_dim=16).to(device)   # tl.dot needs K >= 16 on a GPU
    r = Runner(target, attention="nsa", nsa=NSA, max_len=300)
    # a repeated stretch: the context lookup finds proposals
    g = torch.Generator().manual_seed(5)
    part = torch.randint(3, target.cfg.vocab_size, (20,), generator=g).tolist()
    prompt = part + torch.randint(3, target.cfg.vocab_size, (9,), generator=g).tolist() + part
    d = Eagle3Drafter(tiny_head(target, draft_vocab=40, window=64).to(device), target)
    return r, d, prompt, DeviceEngine(r, d, **kw)


def _fallback():
    fb = ArFallback(slack=0, min_ar=4, max_ar=8, prior_break_even=50.0)
    fb.break_even = lambda: 50.0   # bursts of AR steps between the rounds
    return fb


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_warm_up_leaves_the_round_state_as_found(params):
    r, d, prompt, eng = _setup()
    opts = SpecOptions(tree=TreeSpec(3, 2, 8), lookup=3)
    _, chunks = r.prefill(prompt, taps=d.taps)
    d.commit([torch.cat([c[i] for c in chunks]) for i in range(len(d.taps))], torch.tensor(prompt[1:] + [7]))
    eng.start(7, seed=1, history=prompt)
    before = [t.clone() for t in eng._state()]
    eng.prepare(opts, params, ar=True, keep_taps=True, top_k=2)
    assert not eng._warm and not eng._graphs               # on the CPU nothing compiles: nothing runs
    eng.prepare(opts, params, ar=True, keep_taps=True, top_k=2, force=True)
    assert len(eng._warm) == 3                             # the round, the AR step, the catch-up
    after = eng._state()
    assert len(after) == len(before) + len(eng.ring.tensors())   # the ring is made for the fall-back
    for b, a in zip(before, after):
        assert torch.equal(b, a)
    assert not eng.ring.pending and int(eng.ring.cnt) == 0


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_prepared_generation_equals_an_unprepared_one(params, monkeypatch):
    opts = SpecOptions(tree=TreeSpec(3, 2, 8), lookup=3)
    r, d, prompt, eng = _setup()
    ref = generate_spec(r, d, prompt, params, 40, opts=opts, engine=eng, fallback=_fallback(), seed=3)
    assert ref.stats["ar_steps"] > 0 and ref.stats["rounds"] > 0
    plain = DeviceEngine.prepare
    monkeypatch.setattr(DeviceEngine, "prepare", lambda self, *a, **k: plain(self, *a, **{**k, "force": True}))
    r, d, prompt, eng = _setup()
    got = generate_spec(r, d, prompt, params, 40, opts=opts, engine=eng, fallback=_fallback(), seed=3)
    assert len(eng._warm) == 3
    assert got.token_ids == ref.token_ids
    assert got.stats["setup_seconds"] > 0 and "setup_seconds" in ref.stats
    ar_ref = generate_ar(r, prompt, params, 20, engine=DeviceEngine(r), seed=2)
    ar_eng = DeviceEngine(r)
    ar = generate_ar(r, prompt, params, 20, engine=ar_eng, seed=2)
    assert len(ar_eng._warm) == 1 and ar.token_ids == ar_ref.token_ids


@CUDA
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_cuda_graphs_are_captured_before_the_decode_clock(params, monkeypatch):
    """Every graph a generation with a fall-back replays is captured in `prepare`, none in its steps;
    the tokens equal an eager engine's."""
    opts = SpecOptions(tree=TreeSpec(3, 2, 8), lookup=3)
    r, d, prompt, eager = _setup("cuda", graphs=False)
    ref = generate_spec(r, d, prompt, params, 40, opts=opts, engine=eager, fallback=_fallback(), seed=3)
    assert len(eager._warm) == 3                           # CUDA eager: warmed (compiled) all the same
    r, d, prompt, eng = _setup("cuda")
    inside, where = [False], []
    cap, prep = DeviceEngine._capture, DeviceEngine.prepare

    def capture(self, phases):
        where.append((phases[0][0][0], inside[0]))
        return cap(self, phases)

    def prepare(self, *a, **k):
        inside[0] = True
        try:
            return prep(self, *a, **k)
        finally:
            inside[0] = False
    monkeypatch.setattr(DeviceEngine, "_capture", capture)
    monkeypatch.setattr(DeviceEngine, "prepare", prepare)
    got = generate_spec(r, d, prompt, params, 40, opts=opts, engine=eng, fallback=_fallback(), seed=3)
    assert got.stats["ar_steps"] > 0 and got.stats["rounds"] > 0
    # the prompt's chunks are captured by the prefill (before the clock too), the rest by `prepare`
    assert sorted(k for k, _ in where) == ["ar", "catch-up", "draft", "prefill"]
    assert all(i == (k != "prefill") for k, i in where)
    assert got.token_ids == ref.token_ids


def test_prepare_refuses_what_a_round_refuses():
    r, d, prompt, eng = _setup()
    with pytest.raises(ValueError, match="prompt's tokens"):
        eng.prepare(SpecOptions(tree=TreeSpec(3, 2, 8), lookup=3), force=True)   # no start(history=)
    with pytest.raises(ValueError, match="needs a drafter"):
        DeviceEngine(r).prepare(SpecOptions(tree=TreeSpec(3, 2, 8)), force=True)
    with pytest.raises(ValueError, match="keep_taps needs a drafter"):
        DeviceEngine(r).prepare(ar=True, keep_taps=True, force=True)
    assert not eng._warm and not eng._io and eng.ring is None


def _settings():
    # two settings of one graph key (top-p filters), then one of the other (no top-p)
    return [SAMPLED, SamplingParams(temperature=1.3, top_p=0.6), SamplingParams(temperature=0.5)]


def test_one_engine_serves_every_sampling_setting():
    """Temperature and top-p are device scalars a round reads, not constants of its bucket: one engine run
    through three settings gives each one's tokens as a fresh engine does, and keeps one bucket per kind
    (top-p filtering or not), not one per setting."""
    opts = SpecOptions(tree=TreeSpec(3, 2, 8), lookup=3)
    r, d, prompt, eng = _setup()
    for params in _settings():
        got = generate_spec(r, d, prompt, params, 30, opts=opts, engine=eng, fallback=_fallback(), seed=4)
        r2, d2, _, fresh = _setup()
        want = generate_spec(r2, d2, prompt, params, 30, opts=opts, engine=fresh, fallback=_fallback(), seed=4)
        assert got.token_ids == want.token_ids
        ar = generate_ar(r, prompt, params, 12, engine=eng, seed=2)
        assert ar.token_ids == generate_ar(r2, prompt, params, 12, engine=DeviceEngine(r2), seed=2).token_ids
    assert sorted(k[1] for k in eng._io) == [("sample", False), ("sample", True)]
    assert eng.sampling._held == [(2.0, 1.0)]   # the last setting's 1 / temperature and top-p


@CUDA
def test_cuda_graphs_serve_every_sampling_setting(monkeypatch):
    """On CUDA a new temperature / top-p replays the graphs captured for the first (no capture), and each
    setting's tokens equal an eager engine's."""
    opts = SpecOptions(tree=TreeSpec(3, 2, 8), lookup=3)
    r, d, prompt, eng = _setup("cuda")
    caught = []
    cap = DeviceEngine._capture
    monkeypatch.setattr(DeviceEngine, "_capture", lambda self, phases: (caught.append(phases[0][0]),
                                                                          cap(self, phases))[1])
    for i, params in enumerate(_settings()):
        before = len(caught)
        got = generate_spec(r, d, prompt, params, 30, opts=opts, engine=eng, fallback=_fallback(), seed=4)
        r2, d2, _, eager = _setup("cuda", graphs=False)
        want = generate_spec(r2, d2, prompt, params, 30, opts=opts, engine=eager, fallback=_fallback(), seed=4)
        assert got.token_ids == want.token_ids
        if i == 1:   # the second setting shares the first's key: nothing captured
            assert len(caught) == before
    assert {k[1][1] for k in caught if k[0] == "draft"} == {("sample", True), ("sample", False)}


@CUDA
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("top_p", [0.9, 1.0])
def test_cuda_sampled_ar_step_equals_the_twin(monkeypatch, graphs, top_p):
    """On CUDA the sampled AR step draws its token with `sample_row` from the filtered probabilities (top-p), else
    straight from the logits with `sample_logits_row`; the same engine with the tensor twin (softmax,
    `sample_device`) in that launch's place gives the same tokens, plain and under a fall-back that keeps the
    drafter's rows."""
    import ssv.ops.accept.ops as ops
    from ssv.spec.device_accept import sample_device
    ar_params = SamplingParams(temperature=0.8, top_p=top_p)
    spec_params = SamplingParams(temperature=0.9, top_p=top_p)

    def twin_row(probs, coin, out, out2):   # sample_row's signature
        return _written(sample_device(probs[0], coin), out, out2)

    def twin_logits(logits, inv_temperature, coin, out, out2):   # sample_logits_row's: probs_unchecked unfiltered
        return _written(sample_device(torch.softmax(logits.float() * inv_temperature, dim=-1)[0], coin), out, out2)

    name, twin_fn = ("sample_row", twin_row) if top_p < 1.0 else ("sample_logits_row", twin_logits)
    runs, called = {}, []
    for twin, fn in ((False, getattr(ops, name)), (True, twin_fn)):
        def counted(*args, fn=fn, twin=twin, **kwargs):
            called.append(twin)
            return fn(*args, **kwargs)
        monkeypatch.setattr(ops, name, counted)
        r, d, prompt, eng = _setup("cuda", graphs=graphs)
        ar = generate_ar(r, prompt, ar_params, 24, engine=eng, seed=3).token_ids
        r2, d2, _, eng2 = _setup("cuda", graphs=graphs)
        spec = generate_spec(r2, d2, prompt, spec_params, 30, opts=SpecOptions(tree=TreeSpec(3, 2, 8)), engine=eng2,
                             fallback=_fallback(), seed=5)
        assert spec.stats["ar_steps"] > 0
        runs[twin] = (ar, spec.token_ids)
    assert runs[False] == runs[True] and set(called) == {False, True}


def _written(tok, out, out2):
    out.copy_(tok)
    out2.copy_(tok)
    return out


@CUDA
def test_cuda_evicted_buckets_drop_their_graphs_and_capture_again():
    """With max_buckets=2, a third tree shape drops the least recently used bucket's three graphs; that
    shape, run again, is captured again, and every run's tokens equal an eager engine's."""
    r, d, prompt, eng = _setup("cuda", max_buckets=2)
    specs = [TreeSpec(3, 2, 8), TreeSpec(2, 2, 6), TreeSpec(4, 2, 10), TreeSpec(3, 2, 8)]
    for i, spec in enumerate(specs):
        opts = SpecOptions(tree=spec)
        got = generate_spec(r, d, prompt, GREEDY, 24, opts=opts, engine=eng, seed=1)
        r2, d2, _, eager = _setup("cuda", graphs=False)
        assert got.token_ids == generate_spec(r2, d2, prompt, GREEDY, 24, opts=opts, engine=eager, seed=1).token_ids
        spec_keys = {k[1] for k in eng._graphs if k[0] in ("draft", "verify", "accept")}
        assert len(spec_keys) == min(i + 1, 2) and spec_keys == set(eng._io)
        assert sum(k[0] in ("draft", "verify", "accept") for k in eng._graphs) == 3 * len(spec_keys)
    assert [k[0] for k in eng._io] == [SpecOptions(tree=specs[2]).key(), SpecOptions(tree=specs[3]).key()]
