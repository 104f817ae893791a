"""Drafting from the context (ssv.spec.lookup): the fixed-shape lookup against a plain loop, the chain
attached to a tree, and generation with it (greedy: ar's tokens; sampled: the chain taken, its
distribution tested in tests/engine/test_spec.py)."""
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
from ssv.spec.lookup import NGRAMS, attach_chain, attach_chain_device, context_lookup, grow_spares, no_spares
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


def test_attach_chain_takes_the_place_of_the_lowest_ranked_nodes():
    #          0 (root, token 9)
    #       /      |       \
    #   1:a(-1)  2:a(-2)  3:c(-3)     two children with token a: acceptance follows node 1 (higher score)
    #   |
    #   4:b(-1.5)
    t = tree([9, 10, 10, 12, 11], [-1, 0, 0, 0, 1], [0.0, -1.0, -2.0, -3.0, -1.5])
    # 2 slots: nodes 2 and 3 (the lowest ranked) are spares. The chain a, d walks node 1 and needs
    # one slot (d under 1): the higher ranked spare (node 2) keeps the other
    one = attach_chain(t, [10, 13], 2)
    assert one.tokens.tolist() == [9, 10, 11, 13, 10] and one.parents.tolist() == [-1, 0, 1, 1, 0]
    out = attach_chain(t, [13, 14], 2)                           # nothing held: both slots, under the root
    assert out.tokens.tolist() == [9, 10, 11, 13, 14] and out.parents.tolist() == [-1, 0, 1, 0, 3]
    assert out.scores[3] == out.scores[0] and out.scores[4] == out.scores[0]   # first among their siblings
    assert torch.equal(attach_chain(t, [], 2).tokens, torch.tensor([9, 10, 11, 10, 12]))   # no chain: spares
    held = attach_chain(t, [10, 11], 2)                          # the tree holds it: the spares stay
    assert held.tokens.tolist() == [9, 10, 11, 10, 12] and held.parents.tolist() == [-1, 0, 1, 0, 0]
    # the target continues d, e, then f: the chain's nodes are accepted, the bonus is f
    logits = torch.full((out.n, 20), -5.0)
    for node, nxt in enumerate([13, 0, 0, 14, 15]):
        logits[node, nxt] = 5.0
    res = accept_greedy(out, logits)
    assert res.tokens == [13, 14] and res.bonus == 15 and res.path == [0, 3, 4]
    # no spares: the tree and the chain's new nodes (d under 1)
    grown = attach_chain(t, [10, 13], 0)
    assert grown.tokens.tolist() == [9, 10, 10, 12, 11, 13] and grown.parents.tolist() == [-1, 0, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="5 spares of a 5-node tree"):
        attach_chain(t, [1], 5)


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
    plain = generate_spec(runner, drafter, ids, SamplingParams(), n, SpecOptions(TreeSpec(2, 3, 4), order))
    look = generate_spec(runner, drafter, ids, SamplingParams(), n, SpecOptions(TreeSpec(2, 3, 4), order, lookup=6))
    assert look.token_ids == plain.token_ids == ar.token_ids
    # the tiny target repeats itself (runs of one token): the chain carries rounds past the head's 2 levels
    assert look.stats["mean_accepted_length"] > plain.stats["mean_accepted_length"]
    assert len(look.stats["acceptance_by_depth"]) > 2


@pytest.mark.parametrize("round_", ["host", "device"])
def test_sampled_generation_takes_the_chain(models, round_):
    """Sampled rounds attach the chain too (a deterministic candidate, accepted with the target's
    probability: tests/engine/test_spec.py). At a low temperature the tiny target repeats itself
    (runs of one token) where its head does not: the chain raises every run's acceptance; the same
    seed gives the same tokens; the device round's history holds the text (the chain's source)."""
    target, drafter = models
    ids, sp = repetitive(), SamplingParams(temperature=0.05)
    runner = Runner(target, attention="nsa", nsa=NSA)
    engine = DeviceEngine(runner, drafter) if round_ == "device" else None
    runs = {k: [generate_spec(runner, drafter, ids, sp, 24, SpecOptions(TreeSpec(2, 3, 4), lookup=k), seed=s,
                              engine=engine) for s in (3, 3, 4, 5)] for k in (0, 6)}
    assert runs[6][0].token_ids == runs[6][1].token_ids
    if engine is not None:   # (a sampled round once wrote its tokens at positions named by its tokens)
        out = runs[6][-1].token_ids
        assert engine.hist[:len(ids) + len(out)].tolist() == ids + out
    mal = {k: [r.stats["mean_accepted_length"] for r in rs] for k, rs in runs.items()}
    assert all(m > 1.15 for m in mal[6]) and sum(mal[6]) > sum(mal[0]) + 1.0, mal


def test_attach_chain_refuses_an_unranked_tree():
    # node 2 (score -0.5) outranks its parent 1 (-1.0): dropping the lowest-ranked would orphan it
    tree = DraftTree(torch.tensor([0, 1, 2, 3]), torch.tensor([-1, 0, 1, 0]), torch.tensor([0.0, -1.0, -0.5, -2.0]))
    with pytest.raises(ValueError, match="node 2 ranks above its parent 1"):
        attach_chain(tree, [5, 6], 2)


def test_lookup_options_are_checked(models):
    with pytest.raises(ValueError, match=r"lookup must be an int in \[0, 16\]"):
        SpecOptions(lookup=17)
    with pytest.raises(ValueError, match="128 tree tokens.*\\+ 8 looked up"):
        SpecOptions(TreeSpec(6, 8, 124), lookup=8)
    assert SpecOptions(TreeSpec(2, 3, 4), lookup=6).max_depth == 6
    with pytest.raises(ValueError, match="a tree of 4 \\+ 6 needs a larger pool than depth 2 and top-k 2 grow \\(7 nodes\\)"):
        SpecOptions(TreeSpec(2, 2, 4), lookup=6)
    assert SpecOptions(TreeSpec(2, 3, 4), lookup=6, spares=False).key() != SpecOptions(TreeSpec(2, 3, 4), lookup=6).key()
    SpecOptions(TreeSpec(2, 2, 4), lookup=6, spares=False)     # no spares: no pool needed past the tree
    assert SpecOptions(TreeSpec(2, 3, 4), lookup=6).key() != SpecOptions(TreeSpec(2, 3, 4)).key()
    target, drafter = models
    r = Runner(target, attention="nsa", nsa=NSA)
    eng = DeviceEngine(r, drafter)
    r.reset(), drafter.reset()
    r.prefill(repetitive()[:-1])
    eng.start(3)                                   # no history: a lookup round cannot run
    with pytest.raises(ValueError, match="needs the prompt's tokens"):
        eng.launch_spec(SpecOptions(TreeSpec(2, 3, 4), lookup=4))
    with pytest.raises(ValueError, match="history has 3 tokens, the cache holds 59"):
        eng.start(3, history=[1, 2, 3])


@pytest.mark.parametrize("spares", [True, False])
@pytest.mark.parametrize("order", ["pos", "bfs", "dfs"])
def test_the_device_round_with_lookup_matches_the_host_round(models, order, spares):
    """The CPU's device round (fixed shapes, the chain attached by attach_chain_device): greedy, ar's
    tokens and the host round's rounds; sampled, seeded (its distribution: tests/engine/test_spec.py)."""
    target, drafter = models
    ids, n = repetitive(), 40
    opts = SpecOptions(TreeSpec(2, 3, 4), order, lookup=6, spares=spares)
    runner = Runner(target, attention="nsa", nsa=NSA)
    ar = generate_ar(runner, ids, SamplingParams(), n)
    host = generate_spec(runner, drafter, ids, SamplingParams(), n, opts)
    dev = generate_spec(runner, drafter, ids, SamplingParams(), n, opts, engine=DeviceEngine(runner, drafter))
    assert dev.token_ids == host.token_ids == ar.token_ids
    assert dev.stats["rounds"] == host.stats["rounds"] and dev.stats["acceptance_by_depth"] == host.stats["acceptance_by_depth"]
    sp = SamplingParams(temperature=0.9)
    runs = [generate_spec(runner, drafter, ids, sp, 16, SpecOptions(TreeSpec(2, 3, 4), order, lookup=6, spares=spares),
                          seed=s, engine=DeviceEngine(runner, drafter)) for s in (2, 2)]
    assert runs[0].token_ids == runs[1].token_ids and len(runs[0].token_ids) == 16


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10 ** 6), st.integers(1, 5), st.sampled_from(["pos", "bfs", "dfs"]),
       st.sampled_from([(2, 3, 6), (3, 2, 4), (3, 3, 9), (4, 2, 3)]), st.sampled_from([3, 6]))
def test_the_fixed_shape_chain_accepts_what_the_host_tree_accepts(seed, K, order, shape, V):
    """A head's pool over a 3- or 6-token vocabulary (ssv.spec.device.grow_pool against build_tree) and a
    random chain: the fixed-shape tree (`grow_spares`, `attach_chain_device`) and the host tree
    (`attach_chain`) accept the same tokens from a target that follows a random text, often the
    chain's own (the target's choice at a node is a function of the node's path)."""
    from tests.spec.test_device import _table
    from ssv.ops.accept.naive import accept_greedy_walk_naive
    from ssv.spec.device import ancestor_mask, grow_pool
    from ssv.spec.flatten import flatten
    from ssv.spec.tree import build_tree
    D, k, T = shape
    spec = TreeSpec(D, k, T + K)
    if spec.total_tokens > spec.max_nodes:
        return
    root = V - 1
    tab = _table(spec, V, seed % 1000)
    host_tree = build_tree(lambda fr, tr: torch.stack([tab[int(tr.depth[u]), int(tr.tokens[u])] for u in fr]),
                           root, D, k, T + K)
    pool = grow_pool(lambda level, toks, pr, rows: tab[level - 1][toks], torch.tensor(root), tab[0, root], spec)
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, V, (K,), generator=g)
    n_valid = int(torch.randint(0, K + 1, (1,), generator=g))
    valid = torch.arange(K) < n_valid
    flat, mask, pos, spare = grow_spares(*pool, T, K, k, order, D, torch.tensor([100]))
    compact = seed % 3 == 0   # the CPU's form: the T-node tree and the chain's new nodes only
    if compact and seed % 2:
        spare = no_spares(flat, K)   # what the CPU's round passes: dropped all the same
    full, fmask, fpos = attach_chain_device(flat, mask, pos, spare, toks, valid, compact=compact)
    if compact:
        small = build_tree(lambda fr, tr: torch.stack([tab[int(tr.depth[u]), int(tr.tokens[u])] for u in fr]),
                           root, D, k, T)
        host = attach_chain(small, toks[:n_valid].tolist(), 0)
        assert T <= full.n == host.n <= T + K
    else:
        host = attach_chain(host_tree, toks[:n_valid].tolist(), K)
        assert full.n == host.n == T + K
    assert torch.equal(fmask, ancestor_mask(full.parents, int(full.depth.max())))
    assert torch.equal(fpos, 100 + full.depth) and bool((full.parents[1:] < torch.arange(1, full.n)).all())
    # the same multiset of root-to-node paths: the same tree in another order
    def paths(tr_tokens, tr_parents):
        out = []
        for i in range(len(tr_tokens)):
            p, seq = i, []
            while p >= 0:
                seq.append(int(tr_tokens[p]))
                p = int(tr_parents[p])
            out.append(tuple(reversed(seq)))
        return sorted(out)
    assert paths(full.tokens, full.parents) == paths(host.tokens, host.parents)
    host_flat, _ = flatten(host, order)
    text = toks.tolist() if seed % 2 else torch.randint(0, V, (K + D,), generator=g).tolist()

    def target_logits(tr_tokens, tr_parents):
        lg = torch.zeros(len(tr_tokens), V)
        for i in range(len(tr_tokens)):
            p, seq = i, []
            while p > 0:
                seq.append(int(tr_tokens[p]))
                p = int(tr_parents[p])
            seq.reverse()
            follows = seq == text[:len(seq)] and len(seq) < len(text)
            lg[i, text[len(seq)] if follows else (sum(seq) * 7 + len(seq)) % V] = 1.0
        return lg
    path, n, bonus = accept_greedy_walk_naive(full.parents, full.tokens, full.scores,
                                              target_logits(full.tokens, full.parents).argmax(-1), max(D, K))
    got = [int(full.tokens[i]) for i in path[1:int(n)]] + [int(bonus)]
    res = accept_greedy(host_flat, target_logits(host_flat.tokens, host_flat.parents))
    assert got == res.tokens + [res.bonus]


@pytest.mark.parametrize("spares", [True, False])
@pytest.mark.parametrize("round_", ["host", "device"])
def test_a_root_only_tree_drafts_from_the_context_alone(models, round_, spares):
    """A tree of the root alone beside a lookup (`--tree-tokens T --lookup T - 1`: prompt-lookup
    decoding, no head node verified): AR's tokens, rounds carried by the chain. The device round's
    compact form once indexed the root's first child for its placeholder spares and failed here."""
    target, drafter = models
    ids, n = repetitive(), 40
    runner = Runner(target, attention="nsa", nsa=NSA)
    ar = generate_ar(runner, ids, SamplingParams(), n)
    engine = DeviceEngine(runner, drafter) if round_ == "device" else None
    opts = SpecOptions(TreeSpec(2, 3, 1), lookup=6, spares=spares)
    res = generate_spec(runner, drafter, ids, SamplingParams(), n, opts, engine=engine)
    assert res.token_ids == ar.token_ids
    assert res.stats["mean_accepted_length"] > 1.5
