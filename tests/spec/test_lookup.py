"""Drafting from the context (ssv.spec.lookup): the fixed-shape lookup against a plain loop, the chain
attached to a tree, and generation with it (greedy: ar's tokens; sampled: the chain unused)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssv.draft import Eagle3Drafter
from ssv.engine.device_round import DeviceEngine
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.engine.spec import SpecOptions, generate_spec
from ssv.spec.accept import SamplingParams, accept_greedy
from ssv.spec.lookup import NGRAMS, attach_chain, attach_chain_device, context_lookup
from ssv.spec.tree import DraftTree, TreeSpec

from tests.draft.helpers import tiny_head, tiny_target
from tests.engine.test_spec import NSA


def lookup_loop(seq, k, ngrams=NGRAMS):
    """The plain reading: the longest suffix (hi..lo tokens) with an earlier occurrence that ends
    before the last token; its latest such occurrence; the k tokens after it, cut at the end."""
    lo, hi = ngrams
    for n in range(hi, lo - 1, -1):
        if len(seq) < n + 1:
            continue
        for m in range(len(seq) - n - 1, -1, -1):
            if seq[m:m + n] == seq[len(seq) - n:]:
                return seq[m + n:m + n + k]
    return []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.integers(0, 30), st.integers(1, 7),
       st.sampled_from([(2, 4), (1, 3), (3, 3)]))
def test_context_lookup_equals_the_plain_loop(seq, pad, k, ngrams):
    # a fixed buffer: garbage past the history's end must not be read
    hist = torch.tensor(seq + [int(x) for x in torch.randint(0, 4, (pad,))], dtype=torch.long)
    toks, valid = context_lookup(hist, torch.tensor([len(seq)]), k, ngrams)
    want = lookup_loop(seq, k, ngrams)
    assert toks.shape == valid.shape == (k,)
    assert valid.tolist() == [True] * len(want) + [False] * (k - len(want))
    assert toks[valid].tolist() == want


def test_context_lookup_finds_a_repeat_and_refuses_bad_arguments():
    seq = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7]
    toks, valid = context_lookup(torch.tensor(seq + [0] * 5), len(seq), 4)
    assert toks[valid].tolist() == [8, 9, 1, 2]
    toks, valid = context_lookup(torch.tensor([1, 2, 3, 4]), 4, 3)
    assert not valid.any()
    with pytest.raises(ValueError, match="k must be >= 1"):
        context_lookup(torch.tensor(seq), len(seq), 0)
    with pytest.raises(ValueError, match="ngrams"):
        context_lookup(torch.tensor(seq), len(seq), 2, (3, 2))


def tree(tokens, parents, scores):
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(scores, dtype=torch.float32))


def test_attach_chain_reuses_the_path_greedy_acceptance_would_follow():
    #      0(root)
    #     /      \
    #   1:a(-1)  2:a(-2)     two children with token a: acceptance follows node 1 (higher score)
    #   |
    #   3:b
    t = tree([9, 10, 10, 11], [-1, 0, 0, 1], [0.0, -1.0, -2.0, -1.5])
    out = attach_chain(t, [10, 11, 12, 13])
    assert out.tokens.tolist() == [9, 10, 10, 11, 12, 13]
    assert out.parents.tolist() == [-1, 0, 0, 1, 3, 4]
    assert out.scores[4] < out.scores[3] and out.scores[5] < out.scores[4]
    assert attach_chain(t, [10, 11]).n == 4                        # held already: nothing added
    fresh = attach_chain(t, [7, 8])                                # no prefix held: under the root
    assert fresh.parents.tolist()[4:] == [0, 4] and fresh.tokens.tolist()[4:] == [7, 8]
    # the target continues a, b, c, d, then e: the chain's nodes are accepted, the bonus is e
    logits = torch.full((out.n, 20), -5.0)
    for node, nxt in enumerate([10, 11, 0, 12, 13, 14]):
        logits[node, nxt] = 5.0
    res = accept_greedy(out, logits)
    assert res.tokens == [10, 11, 12, 13] and res.bonus == 14 and res.path == [0, 1, 3, 4, 5]


@pytest.fixture(scope="module")
def models():
    target = tiny_target(vocab=24)   # a small vocabulary: the continuation repeats the prompt's phrases
    return target, Eagle3Drafter(tiny_head(target, draft_vocab=16, window=64), target)


def repetitive(n=60):
    base = [3, 7, 1, 9, 4, 4, 2, 8, 5, 1, 6]
    return (base * (n // len(base) + 1))[:n]


@pytest.mark.parametrize("order", ["pos", "dfs"])
def test_greedy_generation_with_lookup_is_ar_and_accepts_the_chain(models, order):
    target, drafter = models
    ids, n = repetitive(), 40
    runner = Runner(target, attention="nsa", nsa=NSA)
    ar = generate_ar(runner, ids, SamplingParams(), n)
    plain = generate_spec(runner, drafter, ids, SamplingParams(), n, SpecOptions(TreeSpec(2, 2, 4), order))
    look = generate_spec(runner, drafter, ids, SamplingParams(), n, SpecOptions(TreeSpec(2, 2, 4), order, lookup=6))
    assert look.token_ids == plain.token_ids == ar.token_ids
    # the tiny target repeats itself (runs of one token): the chain carries rounds past the head's 2 levels
    assert look.stats["mean_accepted_length"] > plain.stats["mean_accepted_length"]
    assert len(look.stats["acceptance_by_depth"]) > 2


def test_sampled_generation_ignores_the_chain(models):
    target, drafter = models
    ids, sp = repetitive(), SamplingParams(temperature=0.9)
    runner = Runner(target, attention="nsa", nsa=NSA)
    runs = [generate_spec(runner, drafter, ids, sp, 16, SpecOptions(TreeSpec(2, 2, 4), lookup=k), seed=3)
            for k in (0, 6)]
    assert runs[0].token_ids == runs[1].token_ids
    assert runs[0].stats["mean_accepted_length"] == runs[1].stats["mean_accepted_length"]


def test_lookup_options_are_checked(models):
    with pytest.raises(ValueError, match=r"lookup must be an int in \[0, 16\]"):
        SpecOptions(lookup=17)
    with pytest.raises(ValueError, match="128 tree tokens.*\\+ 8 looked up"):
        SpecOptions(TreeSpec(6, 8, 124), lookup=8)
    assert SpecOptions(TreeSpec(2, 2, 4), lookup=6).max_depth == 6
    assert SpecOptions(TreeSpec(2, 2, 4), lookup=6).key() != SpecOptions(TreeSpec(2, 2, 4)).key()
    target, drafter = models
    r = Runner(target, attention="nsa", nsa=NSA)
    eng = DeviceEngine(r, drafter)
    r.reset(), drafter.reset()
    r.prefill(repetitive()[:-1])
    eng.start(3)                                   # no history: a lookup round cannot run
    with pytest.raises(ValueError, match="needs the prompt's tokens"):
        eng.launch_spec(SpecOptions(TreeSpec(2, 2, 4), lookup=4))
    with pytest.raises(ValueError, match="history has 3 tokens, the cache holds 59"):
        eng.start(3, history=[1, 2, 3])


@pytest.mark.parametrize("order", ["pos", "bfs", "dfs"])
def test_the_device_round_with_lookup_matches_the_host_round(models, order):
    """The CPU's device round (fixed shapes, the chain attached by attach_chain_device): greedy, ar's
    tokens and the host round's rounds; sampled, the same as without the chain."""
    target, drafter = models
    ids, n = repetitive(), 40
    opts = SpecOptions(TreeSpec(2, 2, 4), order, lookup=6)
    runner = Runner(target, attention="nsa", nsa=NSA)
    ar = generate_ar(runner, ids, SamplingParams(), n)
    host = generate_spec(runner, drafter, ids, SamplingParams(), n, opts)
    dev = generate_spec(runner, drafter, ids, SamplingParams(), n, opts, engine=DeviceEngine(runner, drafter))
    assert dev.token_ids == host.token_ids == ar.token_ids
    assert dev.stats["rounds"] == host.stats["rounds"] and dev.stats["acceptance_by_depth"] == host.stats["acceptance_by_depth"]
    sp = SamplingParams(temperature=0.9)
    runs = [generate_spec(runner, drafter, ids, sp, 16, SpecOptions(TreeSpec(2, 2, 4), order, lookup=k), seed=2,
                          engine=DeviceEngine(runner, drafter)) for k in (0, 6)]
    assert runs[0].token_ids == runs[1].token_ids


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10 ** 6), st.integers(1, 6), st.sampled_from(["pos", "dfs"]))
def test_attach_chain_device_accepts_what_the_host_tree_accepts(seed, k, order):
    """Random trees over a 5-token vocabulary (duplicate siblings included) and random chains: the
    greedy walk over the fixed-shape tree takes the host-attached tree's tokens, for logits that
    follow the chain, a tree path, or neither."""
    from ssv.ops.accept.naive import accept_greedy_walk_naive
    from ssv.spec.device import DeviceTree, flatten_device_masked
    g = torch.Generator().manual_seed(seed)
    T = int(torch.randint(2, 12, (1,), generator=g))
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, T)]
    tokens = torch.randint(0, 5, (T,), generator=g)
    scores = -torch.rand(T, generator=g) * 5
    scores[0] = 0.0
    host = DraftTree(tokens, torch.tensor(parents), scores)
    depth = host.depth
    dt = DeviceTree(tokens, torch.tensor(parents), scores, depth)
    spec = TreeSpec(max(1, int(depth.max())), 16, T)
    flat, perm, mask = flatten_device_masked(dt, order, spec)
    chain = torch.randint(0, 5, (k,), generator=g)
    n_valid = int(torch.randint(0, k + 1, (1,), generator=g))
    valid = torch.arange(k) < n_valid
    pos = 100 + flat.depth
    full, fmask, fpos = attach_chain_device(flat, mask, pos, chain, valid)
    assert full.n == T + k and fmask.shape == (T + k, T + k)
    want_tree = attach_chain(DraftTree(flat.tokens, flat.parents, flat.scores), chain[:n_valid].tolist())
    assert bool((fpos == 100 + full.depth).all())
    from ssv.spec.device import ancestor_mask
    assert torch.equal(fmask, ancestor_mask(full.parents, int(full.depth.max())))
    D = int(full.depth.max())
    for trial in range(4):
        logits = torch.randn(T + k, 5, generator=g)
        if trial % 2 == 0:   # follow the chain from its attachment: the target agrees with it
            for i in range(T, T + k):
                p = int(full.parents[i])
                logits[p, int(full.tokens[i])] += 10.0
        got_path, got_len, got_bonus = accept_greedy_walk_naive(full.parents, full.tokens, full.scores,
                                                                logits.argmax(-1), D)
        got = [int(full.tokens[i]) for i in got_path[1:int(got_len)]] + [int(got_bonus)]
        # the host tree's node j: the device tree's node j (the same order, dead slots left out)
        real = [0] + [i for i in range(1, T + k) if i < T or full.scores[i] > float("-inf")]
        hl = logits[real]
        res = accept_greedy(want_tree, hl)
        assert got == res.tokens + [res.bonus]
