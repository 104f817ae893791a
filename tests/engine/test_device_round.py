"""The device-resident round on the CPU: the same tokens as the host round and AR, commits equal to the host's."""
import pytest
import torch

from ssv.attention import StepMeta
from ssv.config import NSAConfig
from ssv.draft import Eagle3Drafter
from ssv.engine.device_round import DeviceEngine
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.engine.spec import SpecOptions, generate_spec
from ssv.ops.nsa.naive import compress_mean
from ssv.spec.accept import SamplingParams
from ssv.spec.device import grow_tree
from ssv.spec.tree import TreeSpec

from ..conftest import make_tiny_model
from ..draft.helpers import tiny_head
from ..draft.helpers import tiny_target as draft_target

# n_select 4 with 2 forced blocks: routing picks two, so stale compressed blocks would show
NSA = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=16, n_select=4, forced_local=1, window=16)
GREEDY = SamplingParams(temperature=0.0)


class OracleDeviceDrafter:
    """A device-round drafter that knows the AR continuation `truth`: each node's children put the
    true next token first (a decoy second), except at every `miss`-th position, so accepted paths
    are long, cross block boundaries, and stop at known places."""

    taps = (0, 1, 2)

    def __init__(self, truth, n_prompt, vocab, miss=5, device="cpu"):
        self.truth = torch.tensor(list(truth) + [0] * 64, device=device)
        self.n_prompt, self.vocab, self.miss, self.device = n_prompt, vocab, miss, device
        self.vocab_ids = torch.arange(vocab, device=device)
        self.dlen = torch.zeros(1, dtype=torch.long, device=device)
        self.slot_pos = torch.zeros(1, dtype=torch.long, device=device)
        self.hid_buf = torch.zeros(1, device=device)
        self.dlogp_buf = torch.zeros(vocab, device=device)
        self.length = 0

    def reset(self):
        self.length = 0
        self.dlen.zero_()

    def _logp(self, depth_ahead: torch.Tensor) -> torch.Tensor:
        i = (self.dlen - self.n_prompt) + depth_ahead                   # index of the true token
        t = self.truth[i.clamp(0, self.truth.numel() - 1)]
        t = torch.where(i % self.miss == 0, (t + 3) % self.vocab, t)     # a planted miss
        lp = torch.full((depth_ahead.numel(), self.vocab), -6.0, device=self.device)
        lp.scatter_(1, ((t + 1) % self.vocab)[:, None], -1.0)   # scatter_ of a scalar: capturable
        return lp.scatter_(1, t[:, None], -0.05)

    def commit(self, taps, next_tokens):
        self.length += len(next_tokens)
        self.dlen.fill_(self.length)
        self.dlogp_buf.copy_(self._logp(torch.ones(1, dtype=torch.long, device=self.device))[0])
        return self.dlogp_buf

    def expand_rows(self, level, tokens, parent_rows, path_rows):
        return self._logp(torch.full((tokens.numel(),), level, dtype=torch.long, device=self.device))

    def commit_rows(self, taps, tokens, n):
        assert taps.dim() == 2 and taps.shape[0] == tokens.numel()   # the target's taps side by side
        self.dlen += n
        self.dlogp_buf.copy_(self._logp(torch.ones(1, dtype=torch.long, device=self.device))[0])

    def advance_host(self, n):
        self.length += n


@pytest.mark.parametrize("attention", ["nsa", "dense"])
@pytest.mark.parametrize("order,spec", [("pos", TreeSpec(5, 2, 10)), ("dfs", TreeSpec(7, 2, 14)),
                                        ("bfs", TreeSpec(3, 3, 9))])
def test_device_round_emits_ar_tokens(attention, order, spec):
    target = make_tiny_model(1, vocab=64, n_layers=3)   # peaked attention: routing changes the output
    r = Runner(target, attention=attention, nsa=NSA, max_len=400)
    prompt = torch.randint(0, 64, (53,), generator=torch.Generator().manual_seed(2)).tolist()
    ar = generate_ar(r, prompt, GREEDY, 60)
    eng = DeviceEngine(r)
    r.cache._cmp.fill_(float("nan"))  # the host run's compressed blocks: the device run must write its own
    assert generate_ar(r, prompt, GREEDY, 60, engine=eng).token_ids == ar.token_ids
    assert r.cache.length == int(r.cache.dlen) == len(prompt) + 59
    d = OracleDeviceDrafter(ar.token_ids, len(prompt), 64)
    eng = DeviceEngine(r, d)
    r.cache._cmp.fill_(float("nan"))
    res = generate_spec(r, d, prompt, GREEDY, 60, opts=SpecOptions(tree=spec, order=order), engine=eng)
    assert res.token_ids == ar.token_ids
    assert res.stats["mean_accepted_length"] > 2.0        # long paths were committed
    assert r.cache.length == int(r.cache.dlen) and d.length == int(d.dlen)
    if attention == "nsa":  # the compressed blocks the rounds completed are the committed keys' means
        L, nb = r.cache.length, r.cache.n_cmp
        want = compress_mean(r.cache.k[0, :, :L], nb, NSA)
        torch.testing.assert_close(r.cache.k_cmp[0, :, :nb], want, rtol=1e-6, atol=1e-6)


def test_device_commit_matches_host_commit_path():
    target = make_tiny_model(3, vocab=64, n_layers=3)
    a = Runner(target, attention="nsa", nsa=NSA, max_len=300)
    b = Runner(target, attention="nsa", nsa=NSA, max_len=300)
    g = torch.Generator().manual_seed(4)
    for r in (a, b):
        r.prefill(torch.randint(0, 64, (37,), generator=torch.Generator().manual_seed(5)).tolist())
    for _ in range(6):
        n = 12
        toks = torch.randint(0, 64, (n,), generator=g)
        meta = StepMeta.chain(a.length, n)            # any scratch content will do
        a.forward(toks, meta)
        b.forward(toks, meta)
        k = int(torch.randint(1, 8, (1,), generator=g))
        path = sorted(torch.randperm(n - 1, generator=g)[: k - 1].add(1).tolist())
        a.cache.commit_path([0] + path)
        b.cache.sync_device()
        padded = torch.full((8,), -1, dtype=torch.long)
        padded[:k] = torch.tensor([0] + path)
        b.cache.commit_device(padded, torch.tensor([k]))
        b.cache.advance_host(k)
        assert a.length == b.length == int(b.cache.dlen)
        L = a.length
        assert torch.equal(a.cache.k[:, :, :L], b.cache.k[:, :, :L])
        assert torch.equal(a.cache.v[:, :, :L], b.cache.v[:, :, :L])
        assert torch.equal(a.cache.k_cmp[:, :, :a.cache.n_cmp], b.cache.k_cmp[:, :, :a.cache.n_cmp])
        assert torch.equal(a.cache.v_cmp[:, :, :a.cache.n_cmp], b.cache.v_cmp[:, :, :a.cache.n_cmp])


@pytest.mark.parametrize("draft_vocab,window", [(None, 512), (40, 3)])
def test_drafter_device_expansion_builds_the_host_tree(draft_vocab, window):
    target = draft_target()
    d = Eagle3Drafter(tiny_head(target, draft_vocab=draft_vocab, window=window), target)
    g = torch.Generator().manual_seed(0)
    taps = [torch.randn(9, target.cfg.hidden_size, generator=g) for _ in range(3)]
    toks = torch.randint(3, target.cfg.vocab_size, (9,), generator=g)
    lp = d.commit(taps, toks)
    spec = TreeSpec(depth=5, top_k=3, total_tokens=40)   # the whole pool: every expansion's scores show
    host = d.propose(int(toks[-1]), lp, spec)
    dev = grow_tree(d.expand_rows, toks[-1], d.dlogp_buf, spec, ids=d.vocab_ids)
    assert torch.equal(dev.tokens, host.tokens) and torch.equal(dev.parents, host.parents)
    torch.testing.assert_close(dev.scores, host.scores)


def test_drafter_scratch_survives_a_larger_bucket():
    """A captured draft graph keeps its scratch's addresses: a larger tree must get its own scratch,
    not replace (and free) the smaller one's."""
    target = draft_target()
    d = Eagle3Drafter(tiny_head(target, draft_vocab=40), target)
    g = torch.Generator().manual_seed(2)
    toks = torch.randint(3, target.cfg.vocab_size, (9,), generator=g)
    d.commit([torch.randn(9, target.cfg.hidden_size, generator=g) for _ in range(3)], toks)
    small, large = TreeSpec(3, 2, 6), TreeSpec(5, 3, 15)
    grow_tree(d.expand_rows, toks[-1], d.dlogp_buf, small, ids=d.vocab_ids)
    kept = [t.data_ptr() for t in d._scratch]
    grow_tree(d.expand_rows, toks[-1], d.dlogp_buf, large, ids=d.vocab_ids)
    assert [t.data_ptr() for t in d._scratch] != kept
    grow_tree(d.expand_rows, toks[-1], d.dlogp_buf, small, ids=d.vocab_ids)
    assert [t.data_ptr() for t in d._scratch] == kept


def test_drafter_device_commit_matches_host_commit():
    target = draft_target()
    a = Eagle3Drafter(tiny_head(target, draft_vocab=40, window=7), target)
    b = Eagle3Drafter(tiny_head(target, draft_vocab=40, window=7), target)
    g = torch.Generator().manual_seed(1)
    taps = [torch.randn(10, target.cfg.hidden_size, generator=g) for _ in range(3)]
    toks = torch.randint(3, target.cfg.vocab_size, (10,), generator=g)
    a.commit(taps, toks)
    b.commit(taps, toks)
    for n in (3, 1, 5, 2):
        t2 = [torch.randn(6, target.cfg.hidden_size, generator=g) for _ in range(3)]
        k2 = torch.randint(3, target.cfg.vocab_size, (6,), generator=g)
        want = a.commit([t[:n] for t in t2], k2[:n])
        b.commit_rows(t2, k2, torch.tensor([n]))
        b.advance_host(n)
        assert int(b.dlen) == a.length == b.length
        torch.testing.assert_close(b.dlogp_buf, a.dlogp_buf, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b.hid_buf, a.hid_buf, rtol=1e-5, atol=1e-5)
        W = a.window
        assert torch.equal(a.slot_pos[:W], b.slot_pos[:W])
        assert torch.isfinite(want).any()


def test_engine_refuses_what_it_cannot_run():
    target = make_tiny_model(0, vocab=64)
    r = Runner(target, attention="nsa", nsa=NSA, max_len=200)
    with pytest.raises(ValueError, match="CUDA"):
        DeviceEngine(r, graphs=True)
    eng = DeviceEngine(r)
    with pytest.raises(ValueError, match="drafter"):
        eng.spec_round(SpecOptions())
    d = OracleDeviceDrafter([1, 2], 1, 64)
    eng = DeviceEngine(r, d)
    with pytest.raises(ValueError, match="pool"):
        eng.spec_round(SpecOptions(tree=TreeSpec(2, 2, 8)))
    other = Runner(target, attention="nsa", nsa=NSA, max_len=200)
    with pytest.raises(ValueError, match="another runner"):
        generate_ar(other, [1, 2, 3], GREEDY, 4, engine=eng)


def test_engine_keeps_at_most_max_buckets():
    """A long-lived engine given ever new tree shapes keeps max_buckets of them (least recently used
    out), and a shape that was dropped runs again to the same tokens."""
    target = make_tiny_model(1, vocab=64, n_layers=3)
    r = Runner(target, attention="nsa", nsa=NSA, max_len=400)
    prompt = torch.randint(0, 64, (41,), generator=torch.Generator().manual_seed(4)).tolist()
    ar = generate_ar(r, prompt, GREEDY, 30)
    d = OracleDeviceDrafter(ar.token_ids, len(prompt), 64)
    eng = DeviceEngine(r, d, max_buckets=2)
    specs = [TreeSpec(3, 2, 6), TreeSpec(4, 2, 8), TreeSpec(3, 2, 6), TreeSpec(5, 2, 10), TreeSpec(4, 2, 8),
             TreeSpec(3, 2, 6)]
    live = []
    for spec in specs:
        opts = SpecOptions(tree=spec)
        res = generate_spec(r, d, prompt, GREEDY, 30, opts=opts, engine=eng)
        assert res.token_ids == ar.token_ids
        live = [k for k in live if k != opts.key()][-1:] + [opts.key()]
        assert [k[0] for k in eng._io] == live              # least recently used first
        assert {k[0] for k in eng._plans if k[0] == "spec"} and \
            {k[1] for k in eng._plans if k[0] == "spec"} == set(live)
    with pytest.raises(ValueError, match="max_buckets"):
        DeviceEngine(r, d, max_buckets=0)


def test_the_engine_driven_directly_after_generations_and_back():
    # a CPU generation runs in inference mode (`ssv.engine.modes.decoding`), so what it creates lazily (buckets,
    # coins, the drafter's scratch rows, the AR fall-back's ring) are inference tensors: the engine's and the
    # drafter's own methods take the same mode, so driving them directly afterwards, greedy and sampled, works,
    # and a generation after that still equals ar
    target = draft_target()
    r = Runner(target, attention="nsa", nsa=NSA, max_len=300)
    prompt = torch.randint(3, target.cfg.vocab_size, (41,), generator=torch.Generator().manual_seed(3)).tolist()
    d = Eagle3Drafter(tiny_head(target, draft_vocab=40, window=64), target)
    eng = DeviceEngine(r, d)
    opts, sampled = SpecOptions(tree=TreeSpec(3, 2, 6)), SamplingParams(temperature=0.7)
    for p in (GREEDY, sampled):
        generate_spec(r, d, prompt, p, 10, opts=opts, engine=eng)
    for p in (GREEDY, sampled):
        eng.start(5)
        assert len(eng.spec_round(opts, p)) >= 1 and len(eng.ar_step(p, keep_taps=True)) == 1
        eng.catch_up()
    assert not torch.is_inference_mode_enabled()
    ar = generate_ar(r, prompt, GREEDY, 12)
    assert generate_spec(r, d, prompt, GREEDY, 12, opts=opts, engine=eng).token_ids == ar.token_ids
