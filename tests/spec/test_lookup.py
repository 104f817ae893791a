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
from ssv.spec.lookup import NGRAMS, attach_chain, context_lookup
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
    with pytest.raises(ValueError, match="device round drafts no context lookup"):
        generate_spec(r, drafter, repetitive(), SamplingParams(), 8, SpecOptions(TreeSpec(2, 2, 4), lookup=4),
                      engine=DeviceEngine(r, drafter))
