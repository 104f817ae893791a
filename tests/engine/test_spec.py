"""Speculative decoding on NSA: lossless verification, compaction, and the engine against autoregressive."""
from types import SimpleNamespace

import pytest
import torch

from ssv.attention import StepMeta, VerifyOptions
from ssv.config import ModelConfig, NSAConfig, RopeConfig
from ssv.engine.generate import generate_ar
from ssv.engine.modes import decoding
from ssv.engine.runner import Runner
from ssv.engine.spec import SpecOptions, generate_spec, verify
from ssv.model import Transformer
from ssv.spec.accept import SamplingParams
from ssv.spec.flatten import flatten, tree_metadata
from ssv.spec.tree import DraftTree, TreeSpec

NSA = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=16, n_select=3, window=16)


def tiny_target(seed=0, vocab=64, layers=3):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab, hidden_size=48, intermediate_size=64, n_layers=layers, n_heads=6,
                      n_kv_heads=2, head_dim=8, max_seq_len=512, rope=RopeConfig(theta=1000.0))
    m = Transformer(cfg)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.4)
    return m.eval()


class OracleDrafter:
    """Proposes trees containing a given continuation as one branch, plus random decoys: accepted paths
    are long (crossing compression/selection block boundaries) and rejections happen at known places."""

    taps = (0, 1, 2)

    def __init__(self, truth, vocab, seed=0, miss_every=3):
        self.truth, self.vocab, self.miss_every = truth, vocab, miss_every
        self.gen = torch.Generator().manual_seed(seed)
        self.reset()

    def reset(self):
        self.pos = 0
        self.rounds = 0
        self.committed = []

    def commit(self, taps, next_tokens):
        for t in taps:
            assert t.shape[0] == len(next_tokens)
        self.committed += list(next_tokens.tolist())
        return torch.zeros(self.vocab)

    def propose(self, root, root_logp, spec):
        self.rounds += 1
        # committed holds prompt[1:] + generated; the next truth index is how many were generated
        k = len(self.committed) - self.n_prompt
        depth = spec.depth if self.rounds % self.miss_every else 1
        good = self.truth[k:k + depth]
        toks, parents, scores = [root], [-1], [0.0]
        prev = 0
        for i, t in enumerate(good):
            toks.append(t), parents.append(prev), scores.append(-float(i + 1))
            prev = len(toks) - 1
            decoy = (t + 1 + int(torch.randint(0, self.vocab - 1, (1,), generator=self.gen))) % self.vocab
            toks.append(decoy), parents.append(parents[-1]), scores.append(-float(i + 1) - 0.5)
        return DraftTree(torch.tensor(toks), torch.tensor(parents), torch.tensor(scores))


def run_pair(model, prompt, n_new, opts, attention="nsa"):
    runner = Runner(model, attention=attention, nsa=NSA)
    ar = generate_ar(runner, prompt, SamplingParams(), n_new)
    d = OracleDrafter(ar.token_ids[1:], model.cfg.vocab_size)
    d.n_prompt = len(prompt)
    sd = generate_spec(runner, d, prompt, SamplingParams(), n_new, opts)
    return ar, sd, runner


@pytest.mark.parametrize("attention", ["nsa", "dense"])
@pytest.mark.parametrize("C, order", [(1, "bfs"), (4, "pos"), (16, "dfs")])
def test_greedy_spec_equals_autoregressive(attention, C, order):
    model = tiny_target()
    prompt = torch.randint(0, 64, (93,), generator=torch.Generator().manual_seed(C)).tolist()
    opts = SpecOptions(TreeSpec(depth=7, top_k=2, total_tokens=15), order, VerifyOptions(group_size=C))
    ar, sd, _ = run_pair(model, prompt, 60, opts, attention)
    assert sd.token_ids == ar.token_ids
    assert sd.stats["mean_accepted_length"] > 2.5  # long paths were really accepted and committed


def test_compacted_cache_equals_sequential():
    model = tiny_target(1)
    prompt = torch.randint(0, 64, (70,), generator=torch.Generator().manual_seed(3)).tolist()
    opts = SpecOptions(TreeSpec(depth=6, top_k=2, total_tokens=13), "pos", VerifyOptions(group_size=4))
    runner = Runner(model, attention="nsa", nsa=NSA)
    ar = generate_ar(runner, prompt, SamplingParams(), 40)
    k_ar = runner.cache.k[:, :, :runner.length].clone()
    kc_ar = runner.cache.k_cmp[:, :, :runner.cache.n_cmp].clone()
    n_ar = runner.length
    d = OracleDrafter(ar.token_ids[1:], 64)
    d.n_prompt = len(prompt)
    sd = generate_spec(runner, d, prompt, SamplingParams(), 40, opts)
    assert sd.token_ids == ar.token_ids
    n = min(n_ar, runner.length)
    torch.testing.assert_close(runner.cache.k[:, :, :n], k_ar[:, :, :n], atol=1e-5, rtol=1e-5)
    m = min(kc_ar.shape[2], runner.cache.n_cmp)
    torch.testing.assert_close(runner.cache.k_cmp[:, :, :m], kc_ar[:, :, :m], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("order", ["bfs", "dfs", "pos"])
def test_tree_logits_equal_sequential_paths(order):
    """Every node's logits from one tree pass equal a forward over prefix + its root-to-node path."""
    model = tiny_target(2)
    gen = torch.Generator().manual_seed(5)
    P = 61  # paths of depth up to 6 cross compression (4) and selection (16) block boundaries
    prompt = torch.randint(0, 64, (P,), generator=gen).tolist()
    n = 14
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    tree = DraftTree(torch.randint(0, 64, (n,), generator=gen), torch.tensor(parents), -torch.rand(n, generator=gen))
    tree, _ = flatten(tree, order)
    runner = Runner(model, attention="nsa", nsa=NSA)
    runner.prefill(prompt)
    logits, _ = verify(runner, tree, SpecOptions(TreeSpec(6, 4, 16), order, VerifyOptions(group_size=4)))
    meta = tree_metadata(tree, P)
    for i in range(n):
        path = meta.ancestors[i]
        ref = Runner(model, attention="nsa", nsa=NSA)
        ref.prefill(prompt)
        out, _ = ref.forward(tree.tokens[path], StepMeta.chain(P, len(path)))
        torch.testing.assert_close(logits[i], out[-1], atol=1e-4, rtol=1e-4)


def test_approx_and_refresh_change_only_when_asked():
    model = tiny_target(4)
    prompt = torch.randint(0, 64, (120,), generator=torch.Generator().manual_seed(9)).tolist()
    ar, strict, _ = run_pair(model, prompt, 24, SpecOptions(TreeSpec(5, 2, 11), "pos", VerifyOptions(4)))
    assert strict.token_ids == ar.token_ids
    with pytest.raises(ValueError, match="approx"):
        SpecOptions(verify=VerifyOptions(refresh=(True, False)))
    approx = SpecOptions(TreeSpec(5, 2, 11), "pos", VerifyOptions(4, "approx", refresh=(True, False, False)))
    _, sd, _ = run_pair(model, prompt, 24, approx)
    assert sd.stats["precision"] == "approx" and sd.stats["rounds"] > 0


@pytest.mark.parametrize("kw, msg", [
    (dict(order="zigzag"), "traversal"),
    (dict(tree=TreeSpec(depth=4, top_k=16, total_tokens=200)), "128"),
])
def test_spec_options_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SpecOptions(**kw)


def test_verify_options_errors():
    with pytest.raises(ValueError, match="group size"):
        VerifyOptions(group_size=3)
    with pytest.raises(ValueError, match="precision"):
        VerifyOptions(precision="loose")


def test_bench_spec_rows_and_summary():
    """The acceptance-by-context evaluation: strict rows reproduce `ar`, every mode reports its numbers."""
    from ssv.bench.spec import eval_spec, summarize

    model = tiny_target(6)
    gen = torch.Generator().manual_seed(11)
    docs = [torch.randint(0, 64, (140,), generator=gen).tolist() for _ in range(2)]

    def make_runner(att):
        return Runner(model, attention=att, nsa=NSA)

    rows = []
    for L in (60, 130):
        for i, doc in enumerate(docs):
            ar = generate_ar(make_runner("nsa"), doc[:L], SamplingParams(), 20)
            d = OracleDrafter(ar.token_ids[1:], 64)
            d.n_prompt = L
            part = eval_spec(model, d, [doc], [L], 20, TreeSpec(5, 2, 11),
                             which={"ssv strict", "ssv approx C16", "ssv strict tree 3x2x6"},
                             make_runner=make_runner, warmup=2, extra_trees=(TreeSpec(3, 2, 6),))
            for r in part:
                r["doc"] = i
            rows += part
    strict = [r for r in rows if r["mode"].startswith("ssv strict")]
    assert {r["mode"] for r in strict} == {"ssv strict", "ssv strict tree 3x2x6"}
    assert strict and all(r["first_diff_vs_ar"] is None for r in strict)
    assert all(r["mean_accepted_length"] > 1.5 for r in strict)
    for r in rows:  # a divergence carries the AR top-2 margin where it happened
        if r["mode"] != "ar":
            assert (r["ar_margin_at_diff"] is None) == (r["first_diff_vs_ar"] is None)
            assert r["ar_margin_at_diff"] is None or r["ar_margin_at_diff"] >= 0
    summ = summarize(rows)
    assert {s["mode"] for s in summ} == {"ar", "ssv strict", "ssv approx C16", "ssv strict tree 3x2x6"}
    from ssv.bench.spec import strategies
    from ssv.spec.planner import Profile
    strat = strategies(TreeSpec(5, 2, 11), "pos", extra_trees=(TreeSpec(3, 2, 6),))
    assert strat["ssv strict tree 3x2x6"].tree == TreeSpec(3, 2, 6) and strat["ssv strict"].tree.depth == 5
    assert strat["ssv approx C16 reuse/2"].refresh_every == 2 and strat["sd-naive"].group_size == 1
    prof = Profile.from_rows(rows, strat)   # the planner's offline profile from these rows
    assert prof.bounds == [95, 130] and prof.meta["contexts"] == [60, 130]
    assert {e.strategy.name for e in prof.entries[0]} == {"ssv strict", "ssv approx C16", "ssv strict tree 3x2x6"}
    assert all(s["docs"] == 2 for s in summ)
    for s in summ:  # agreement with ar: every token of a run that never diverged is compared
        if s["mode"] == "ar":
            continue
        rs = [r for r in rows if (r["context"], r["mode"]) == (s["context"], s["mode"])]
        assert s["divergences"] == sum(r["first_diff_vs_ar"] is not None for r in rs)
        assert s["tokens_compared"] == sum(r["tokens"] if r["first_diff_vs_ar"] is None else r["first_diff_vs_ar"] + 1
                                           for r in rs)
        if s["mode"].startswith("ssv strict"):
            assert s["divergences"] == 0 and s["divergence_rate"] == 0.0 and s["tokens_compared"] >= 40


def test_summary_divergence_rate_counts_tokens_up_to_the_first_difference():
    from ssv.bench.spec import summarize
    rows = [dict(context=8, doc=0, mode="m", tokens=10, mean_accepted_length=2.0, tokens_per_second=1.0,
                 first_diff_vs_ar=None, ar_margin_at_diff=None),
            dict(context=8, doc=1, mode="m", tokens=10, mean_accepted_length=3.0, tokens_per_second=1.0,
                 first_diff_vs_ar=4, ar_margin_at_diff=0.01)]
    (s,) = summarize(rows)
    assert (s["divergences"], s["tokens_compared"]) == (1, 15)
    assert s["divergence_rate"] == pytest.approx(1 / 15) and s["max_ar_margin_at_diff"] == 0.01


class RandomTreeDrafter:
    """Proposes random trees (duplicates allowed) whatever the context: acceptance must still be lossless.
    ranked: scores fall along every path, as a drafter's cumulative scores do (a chain from the
    context takes the place of the lowest-ranked nodes: `attach_chain`)."""

    taps = (0, 1, 2)

    def __init__(self, vocab, seed, ranked=False):
        self.vocab, self.gen, self.ranked = vocab, torch.Generator().manual_seed(seed), ranked

    def reset(self):
        pass

    def commit(self, taps, next_tokens):
        return torch.zeros(self.vocab)

    def propose(self, root, root_logp, spec):
        n = spec.total_tokens
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=self.gen)) for i in range(1, n)]
        toks = [root] + torch.randint(0, self.vocab, (n - 1,), generator=self.gen).tolist()
        scores = -torch.rand(n, generator=self.gen)
        if self.ranked:
            scores = -torch.arange(n) - scores.neg()   # a child's index is above its parent's
        return DraftTree(torch.tensor(toks), torch.tensor(parents), scores)


def _exact_first_two(runner, prompt, params, vocab):
    """The target's exact distribution of the first two sampled tokens, by enumeration: [V, V]."""
    from ssv.spec.accept import target_probs
    runner.reset()
    last, _ = runner.prefill(prompt)
    p1 = target_probs(last[None].float().cpu(), params)[0]
    exact = torch.zeros(vocab, vocab)
    for a in range(vocab):
        if p1[a] > 0:
            runner.reset()
            la, _ = runner.prefill(prompt + [a])
            exact[a] = p1[a] * target_probs(la[None].float().cpu(), params)[0]
    return exact


def _chi_square_pvalue(counts, exact, trials):
    from scipy.stats import chisquare
    keep = exact.flatten() * trials >= 5  # chi-square needs expected counts of at least ~5
    obs, exp = counts.flatten()[keep].double(), exact.flatten()[keep].double() * trials
    rest_obs, rest_exp = trials - obs.sum(), trials - exp.sum()
    if rest_exp >= 5:   # the pairs left out, as one bin
        obs, exp = torch.cat([obs, rest_obs.reshape(1)]), torch.cat([exp, rest_exp.reshape(1)])
    else:               # too rare (or none: 0 / 0) for a bin of their own: into the largest
        obs[exp.argmax()] += rest_obs
        exp[exp.argmax()] += rest_exp
    return chisquare(obs.numpy(), exp.numpy()).pvalue


def test_sampled_spec_matches_target_distribution():
    """Chi-square: the first two sampled tokens of speculative decoding follow the target's exact
    distribution (computed by enumeration), at temperature 1.3 and top-p 0.9."""
    vocab = 8
    model = tiny_target(7, vocab=vocab, layers=3)
    params = SamplingParams(temperature=1.3, top_p=0.9)
    prompt = [1, 5, 2, 7, 3] * 8
    runner = Runner(model, attention="nsa", nsa=NSA)
    exact = _exact_first_two(runner, prompt, params, vocab)
    drafter = RandomTreeDrafter(vocab, seed=3)
    opts = SpecOptions(TreeSpec(3, 3, 7), "pos", VerifyOptions(4))
    trials = 1500
    counts = torch.zeros(vocab, vocab)
    for s in range(trials):
        out = generate_spec(runner, drafter, prompt, params, 2, opts, seed=1000 + s).token_ids
        counts[out[0], out[1]] += 1
    assert _chi_square_pvalue(counts, exact, trials) > 1e-4


@pytest.mark.parametrize("form", ["host compact", "host spares", "device spares"])
def test_sampled_spec_with_lookup_matches_target_distribution(form, monkeypatch):
    """A sampled round with a chain from the context (ssv.spec.lookup): a looked-up token is one more
    deterministic candidate, and the first two tokens still follow the target's exact distribution.
    Every round has a proposal (counted; that the chain is taken is tests/spec/test_lookup.py's)."""
    import ssv.engine.spec as spec_mod
    import ssv.spec.lookup as lookup_mod
    from ssv.draft import Eagle3Drafter
    from ssv.engine.device_round import DeviceEngine
    from tests.draft.helpers import tiny_head

    vocab, trials = 8, 800
    model = tiny_target(7, vocab=vocab, layers=4)   # 4: an EAGLE-3 head taps three layers
    params = SamplingParams(temperature=1.3, top_p=0.9)
    # "3 a" followed by a token for every a: whatever the first token, the round has a proposal
    prompt = [t for a in range(vocab) for t in (3, a, (3 * a + 1) % vocab)] * 2 + [1, 5, 2, 7, 3]
    runner = Runner(model, attention="nsa", nsa=NSA)
    exact = _exact_first_two(runner, prompt, params, vocab)
    proposals = []

    def spy(hist, length, k, *a, **kw):
        toks, valid = _lookup(hist, length, k, *a, **kw)
        proposals.append(int(toks[0]) if bool(valid[0]) else -1)
        return toks, valid
    _lookup = lookup_mod.context_lookup
    monkeypatch.setattr(lookup_mod, "context_lookup", spy)
    monkeypatch.setattr(spec_mod, "context_lookup", spy)
    opts = SpecOptions(TreeSpec(2, 2, 4), "pos", VerifyOptions(4), lookup=3, spares=form.endswith("spares"))
    if form.startswith("device"):
        drafter = Eagle3Drafter(tiny_head(model, window=64), model)
        engine = DeviceEngine(runner, drafter)
    else:
        drafter, engine = RandomTreeDrafter(vocab, seed=3, ranked=True), None
    counts = torch.zeros(vocab, vocab)
    for s in range(trials):
        out = generate_spec(runner, drafter, prompt, params, 2, opts, seed=1000 + s, engine=engine).token_ids
        counts[out[0], out[1]] += 1
    assert len(proposals) == trials and min(proposals) >= 0
    assert _chi_square_pvalue(counts, exact, trials) > 1e-4


def test_bench_spec_extra_tree_argument():
    from ssv.bench.spec import _tree_arg
    assert _tree_arg("4,4,16") == TreeSpec(4, 4, 16)
    with pytest.raises(ValueError, match="depth,top-k,tokens"):
        _tree_arg("4x4x16")
    with pytest.raises(ValueError, match="depth"):
        _tree_arg("0,4,16")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_generation_runs_without_autograd_in_inference_mode_on_the_cpu_only(device):
    # `decoding` only reads the runner's device (no GPU needed): inference mode on the CPU, no_grad on CUDA
    # (whose steps are graph replays); the mode ends with the call, also when it raises
    seen = []

    @decoding
    def gen(runner, fail=False):
        seen.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        if fail:
            raise ValueError("bad input")
        return "done"

    runner = SimpleNamespace(device=torch.device(device))
    assert gen(runner) == "done"
    with pytest.raises(ValueError, match="bad input"):
        gen(runner, fail=True)
    assert seen == [(device == "cpu", False)] * 2
    assert not torch.is_inference_mode_enabled() and torch.is_grad_enabled()



def test_generate_ar_and_spec_on_the_cpu_run_in_inference_mode():
    # the public entry points carry `decoding`: the drafter's calls inside see inference mode on
    model = tiny_target(3)
    prompt = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    runner = Runner(model, attention="nsa", nsa=NSA)
    ar = generate_ar(runner, prompt, SamplingParams(), 12)
    d = OracleDrafter(ar.token_ids[1:], model.cfg.vocab_size)
    d.n_prompt = len(prompt)
    modes, propose = [], d.propose
    d.propose = lambda *a: modes.append(torch.is_inference_mode_enabled()) or propose(*a)
    opts = SpecOptions(TreeSpec(depth=3, top_k=2, total_tokens=7), "pos", VerifyOptions(group_size=4))
    assert generate_spec(runner, d, prompt, SamplingParams(), 12, opts).token_ids == ar.token_ids
    assert modes and all(modes) and not torch.is_inference_mode_enabled()
