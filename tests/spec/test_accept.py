import math
import random
from collections import Counter

import pytest
import torch

from ssv.spec.accept import (
    AcceptResult,
    SamplingParams,
    accept_greedy,
    accept_sample,
    coin_shape,
    draw_coins,
    sample_from,
    target_probs,
)
from ssv.spec.tree import DraftTree, chain

ALPHA = 1e-4  # per chi-square test; every run is seeded, so a pass is reproducible
END = -1  # marks "the round ended" in joint outcomes


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # Thousands of tiny ops: with 2 intra-op threads on a shared 2-core box, thread hand-off
    # dominates (softmax on [12, 16] goes from ~15 us to ~70 us or worse under load).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------ helpers


def random_tree(rng, n, vocab, dup_prob=0.0):
    """Random topology; sibling tokens distinct unless dup_prob asks for duplicates."""
    parents = [-1] + [rng.randrange(i) for i in range(1, n)]
    tokens = [rng.randrange(vocab)]
    used = {}
    for i in range(1, n):
        taken = used.setdefault(parents[i], [])
        free = [t for t in range(vocab) if t not in taken]
        if taken and (rng.random() < dup_prob or not free):
            tok = rng.choice(taken)
        else:
            tok = rng.choice(free)
        taken.append(tok)
        tokens.append(tok)
    # Coarse scores make ties, so the index tie-break of the sibling order matters too.
    scores = [0.0] + [-float(rng.randint(0, 6)) / 2 for _ in range(1, n)]
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(scores))


def first_child_with(tree, u, tok):
    toks = tree.tokens.tolist()
    return next((c for c in tree.sorted_children(u) if toks[c] == tok), None)


def chi_square_pvalue(observed, expected_p, trials):
    """Pearson goodness-of-fit. Outcomes with expected count < 5 are pooled into one bin; an
    observed outcome of probability 0 gives p = 0."""
    if any(expected_p.get(k, 0.0) <= 0.0 for k in observed):
        return 0.0
    bins, pooled_obs, pooled_exp = [], 0, 0.0
    for k, p in expected_p.items():
        e = p * trials
        if e < 5:
            pooled_obs += observed.get(k, 0)
            pooled_exp += e
        else:
            bins.append((observed.get(k, 0), e))
    if pooled_exp > 0:
        bins.append((pooled_obs, pooled_exp))
    if len(bins) < 2:
        return 1.0
    stat = sum((o - e) ** 2 / e for o, e in bins if e > 0)
    df = torch.tensor((len(bins) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, torch.tensor(stat / 2, dtype=torch.float64)))


def reference_sequences(tree, probs):
    """Distribution of the tokens one round emits if they were sampled autoregressively from
    the target: draw from p at the current node; follow the child carrying that token (first
    in sibling order) or stop."""
    out = {}

    def walk(u, prefix, mass):
        for y, py in enumerate(probs[u].tolist()):
            if py <= 0:
                continue
            c = first_child_with(tree, u, y)
            if c is None:
                out[prefix + (y,)] = out.get(prefix + (y,), 0.0) + mass * py
            else:
                walk(c, prefix + (y,), mass * py)

    walk(0, (), 1.0)
    return out


def reference_first_two(tree, probs):
    out = {}
    for x1, p1 in enumerate(probs[0].tolist()):
        c = first_child_with(tree, 0, x1)
        if c is None:
            out[(x1, END)] = p1
        else:
            for x2, p2 in enumerate(probs[c].tolist()):
                out[(x1, x2)] = p1 * p2
    return out


def run_trials(accept_fn, tree, logits, params, trials, seed):
    g = torch.Generator().manual_seed(seed)
    coins = torch.rand((trials,) + coin_shape(tree), generator=g)
    seqs = Counter()
    for t in range(trials):
        res = accept_fn(tree, logits, params, coins[t])
        seqs[tuple(res.emitted)] += 1
    return seqs


def normalised_target(logits, params):
    # fp32 rows do not sum to 1 exactly; acceptance and sample_from renormalise in fp64.
    probs = target_probs(logits, params).double()
    return probs / probs.sum(-1, keepdim=True)


def goodness_of_fit(seqs, tree, logits, params, trials):
    probs = normalised_target(logits, params)
    first = Counter()
    two = Counter()
    for s, k in seqs.items():
        first[s[0]] += k
        two[(s[0], s[1] if len(s) > 1 else END)] += k
    p_first = {x: p for x, p in enumerate(probs[0].tolist())}
    return {
        "first": chi_square_pvalue(first, p_first, trials),
        "first_two": chi_square_pvalue(two, reference_first_two(tree, probs), trials),
        "sequence": chi_square_pvalue(seqs, reference_sequences(tree, probs), trials),
    }


def make_case(seed):
    """A random (tree, logits, params) covering the awkward corners."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    vocab = rng.randint(8, 16)
    n = rng.randint(1, 12)
    tree = random_tree(rng, n, vocab, dup_prob=rng.choice([0.0, 0.3]))
    logits = torch.randn(n, vocab, generator=g) * rng.choice([0.5, 1.0, 2.0])
    toks = tree.tokens.tolist()
    for u in range(n):
        kids = tree.children(u)
        style = rng.random()
        if kids and style < 0.5:
            # Favour draft tokens so deep paths get accepted often.
            for c in kids:
                logits[u, toks[c]] += rng.uniform(0.5, 3.0)
        elif style < 0.6:
            # Exact one-hot target, on a draft token (always accepted) or not.
            hot = toks[rng.choice(kids)] if kids and rng.random() < 0.5 else rng.randrange(vocab)
            logits[u] = -math.inf
            logits[u, hot] = 0.0
        elif style < 0.65:
            logits[u, rng.randrange(vocab)] = -math.inf  # a zero-probability token
    params = SamplingParams(
        temperature=rng.choice([1.0, 1.0, 0.7, 1.5, 0.3]),
        top_p=rng.choice([1.0, 1.0, 0.9, 0.6, 0.2, 1e-3]),
    )
    return tree, logits, params


def hand_tree():
    # root(tok 3) -> children tok 0 (score -1) and tok 1 (score -2); child tok 1 -> tok 2.
    return DraftTree(torch.tensor([3, 0, 1, 2]), torch.tensor([-1, 0, 0, 2]), torch.tensor([0.0, -1.0, -2.0, -3.0]))


# ------------------------------------------------------------------------------ params & probs


@pytest.mark.parametrize("t", [-0.1, -1e-9, math.inf, math.nan, "1", True])
def test_bad_temperature(t):
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        SamplingParams(temperature=t)


@pytest.mark.parametrize("p", [0.0, -0.5, 1.0000001, 2.0, math.nan, None])
def test_bad_top_p(p):
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        SamplingParams(temperature=1.0, top_p=p)


def test_target_probs_softmax_and_temperature():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 11, generator=g, dtype=torch.float64) * 3
    for t in (0.3, 1.0, 2.5):
        got = target_probs(logits, SamplingParams(temperature=t))
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), torch.softmax(logits / t, -1), atol=1e-6, rtol=1e-5)
    bf = target_probs(logits.bfloat16(), SamplingParams(temperature=1.0))
    assert bf.dtype == torch.float32
    torch.testing.assert_close(bf.sum(-1), torch.ones(5))


def test_target_probs_greedy_is_one_hot_lowest_id():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    got = target_probs(logits, SamplingParams(temperature=0.0, top_p=0.5))
    assert got.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]


def test_target_probs_top_p_hand_cases():
    one = SamplingParams(temperature=1.0, top_p=0.5)
    # Equal probabilities: the boundary tie goes to the lower token ids.
    assert target_probs(torch.zeros(4), one).tolist() == [0.5, 0.5, 0.0, 0.0]
    got = target_probs(torch.zeros(4), SamplingParams(temperature=1.0, top_p=0.51))
    torch.testing.assert_close(got, torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0]))
    # p = [0.125, 0.5, 0.25, 0.125]: mass 0.5 reached by token 1 alone at top_p = 0.5.
    logits = torch.log(torch.tensor([0.125, 0.5, 0.25, 0.125]))
    assert target_probs(logits, one).tolist() == [0.0, 1.0, 0.0, 0.0]
    got = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.7))
    torch.testing.assert_close(got, torch.tensor([0.0, 2 / 3, 1 / 3, 0.0]))
    # Tiny top_p keeps only the top token.
    assert target_probs(logits, SamplingParams(temperature=1.0, top_p=1e-6)).tolist() == [0, 1, 0, 0]


@pytest.mark.parametrize("seed", range(5))
def test_target_probs_top_p_is_smallest_nucleus(seed):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(64, 13, generator=g) * rng.choice([0.5, 2.0, 5.0])
    logits[:8] = logits[:8].round()  # exact ties
    for top_p in (0.05, 0.3, 0.5, 0.9, 0.999):
        params = SamplingParams(temperature=rng.choice([0.5, 1.0, 2.0]), top_p=top_p)
        got = target_probs(logits, params).double()
        full = torch.softmax(logits / params.temperature, -1).tolist()
        for row, p in zip(got.tolist(), full):
            order = sorted(range(13), key=lambda x: (-p[x], x))
            kept, mass = [], 0.0
            for x in order:
                kept.append(x)
                mass += p[x]
                if mass >= top_p:
                    break
            assert {x for x, v in enumerate(row) if v > 0} == set(kept)
            for x in kept:
                assert row[x] == pytest.approx(p[x] / mass, rel=1e-5, abs=1e-7)


def test_target_probs_bad_logits():
    params = SamplingParams(temperature=1.0)
    with pytest.raises(ValueError, match="NaN"):
        target_probs(torch.tensor([0.0, math.nan]), params)
    with pytest.raises(ValueError, match="entirely -inf"):
        target_probs(torch.tensor([[0.0, 1.0], [-math.inf, -math.inf]]), params)
    with pytest.raises(ValueError, match="floating"):
        target_probs(torch.tensor([1, 2]), params)
    with pytest.raises(ValueError, match="SamplingParams"):
        target_probs(torch.zeros(3), 1.0)


# ------------------------------------------------------------------------------ sample_from


@pytest.mark.parametrize("seed", range(5))
def test_sample_from_is_inverse_cdf(seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(10, generator=g)
    p[torch.rand(10, generator=g) < 0.4] = 0.0
    p[3] = 0.7
    m = 20_000
    counts = Counter(sample_from(p, (k + 0.5) / m) for k in range(m))
    share = (p / p.sum()).tolist()
    for x in range(10):
        # A midpoint grid of coins hits each token's CDF interval in proportion to its mass.
        assert abs(counts.get(x, 0) - share[x] * m) <= 1.0
        if share[x] == 0:
            assert x not in counts


def test_sample_from_edges():
    p = torch.tensor([0.0, 0.3, 0.0, 0.7, 0.0, 0.0])
    assert sample_from(p, 0.0) == 1
    assert sample_from(p, 0.2999) == 1
    assert sample_from(p, 0.3001) == 3
    assert sample_from(p, math.nextafter(1.0, 0.0)) == 3  # top end: never a trailing zero
    assert sample_from(p * 7, 0.5) == 3  # unnormalised is fine
    assert sample_from(torch.tensor([0.0, 1.0]), 0.0) == 1
    # Float32 masses that do not sum to 1 exactly still never overrun.
    q = torch.full((7,), 1 / 7, dtype=torch.float32)
    assert sample_from(q, math.nextafter(1.0, 0.0)) == 6


@pytest.mark.parametrize(
    "probs, coin, match",
    [
        (torch.tensor([0.5, 0.5]), 1.0, r"coin must be in \[0, 1\)"),
        (torch.tensor([0.5, 0.5]), -0.1, r"coin must be in \[0, 1\)"),
        (torch.tensor([[0.5, 0.5]]), 0.1, "1-D"),
        (torch.tensor([0.0, 0.0]), 0.1, "positive total mass"),
        (torch.tensor([0.5, -0.5]), 0.1, "non-negative"),
    ],
)
def test_sample_from_bad_input(probs, coin, match):
    with pytest.raises(ValueError, match=match):
        sample_from(probs, coin)


# ------------------------------------------------------------------------------ greedy


def argmax_lowest(row):
    return min(range(len(row)), key=lambda x: (-row[x], x))


def greedy_case(seed):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    vocab = rng.randint(4, 16)
    n = rng.randint(1, 30)
    tree = random_tree(rng, n, vocab, dup_prob=0.3)
    # Integer logits in a small range make argmax ties common.
    logits = torch.randint(-3, 4, (n, vocab), generator=g).float()
    toks = tree.tokens.tolist()
    for u in range(n):
        kids = tree.children(u)
        if kids and rng.random() < 0.7:
            # Make a draft token a (possibly tied) maximum so walks go deep.
            logits[u, toks[rng.choice(kids)]] = logits[u].max() + rng.choice([0.0, 1.0])
    return tree, logits


@pytest.mark.parametrize("seed", range(200))
def test_accept_greedy_matches_autoregressive(seed):
    tree, logits = greedy_case(seed)
    rows = logits.tolist()
    res = accept_greedy(tree, logits)

    # Reference: autoregressive greedy decoding, stopping at the first token not in the tree.
    u, emitted, path = 0, [], [0]
    while True:
        y = argmax_lowest(rows[u])
        emitted.append(y)
        c = first_child_with(tree, u, y)
        if c is None:
            break
        u = c
        path.append(c)
    assert res.path == path
    assert res.emitted == emitted
    assert res.accepted_len == len(path)

    # The same, stated as properties of the result.
    toks = tree.tokens.tolist()
    parents = tree.parents.tolist()
    for node in res.path[1:]:
        assert toks[node] == argmax_lowest(rows[parents[node]])
        assert tree.parents[node] in res.path
    assert res.tokens == [toks[i] for i in res.path[1:]]
    assert res.bonus == argmax_lowest(rows[res.path[-1]])
    assert res.bonus not in [toks[c] for c in tree.children(res.path[-1])]


def test_accept_greedy_hand():
    logits = torch.full((4, 5), -1.0)
    logits[0, 1] = 3.0  # root -> tok 1 (node 2)
    logits[2, 2] = 3.0  # node 2 -> tok 2 (node 3)
    logits[3, 4] = 1.0  # bonus 4
    res = accept_greedy(hand_tree(), logits)
    assert (res.path, res.tokens, res.bonus, res.accepted_len) == ([0, 2, 3], [1, 2], 4, 3)
    res = accept_greedy(chain([0]), torch.tensor([[0.0, 1.0, 1.0]]))
    assert (res.path, res.tokens, res.bonus) == ([0], [], 1)


def test_accept_greedy_bad_input():
    with pytest.raises(ValueError, match=r"shape \[N=4, V\]"):
        accept_greedy(hand_tree(), torch.zeros(3, 5))
    with pytest.raises(ValueError, match="vocabulary size 3"):
        accept_greedy(hand_tree(), torch.zeros(4, 3))


# ------------------------------------------------------------------------------ sampling: exact cases


def test_accept_sample_hand():
    tree = hand_tree()
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]] * 4))
    params = SamplingParams(temperature=1.0)
    coins = torch.zeros(coin_shape(tree))
    assert coins.shape == (4, 3)
    # Root tries tok 0 (p=.5): coin .6 rejects; residual [0,.5,.25,.25] -> tok 1 coin .4 accepts.
    # Node 2 tries tok 2 (p=.125): coin .2 rejects; residual [4/7,2/7,0,1/7], bonus coin .95 -> tok 3.
    coins[0, 0], coins[0, 1] = 0.6, 0.4
    coins[2, 0], coins[2, -1] = 0.2, 0.95
    res = accept_sample(tree, logits, params, coins)
    assert (res.path, res.tokens, res.bonus) == ([0, 2], [1], 3)
    # Same but bonus coin .5 < 4/7 -> tok 0.
    coins[2, -1] = 0.5
    assert accept_sample(tree, logits, params, coins).bonus == 0
    # Reject both root children: residual [0,0,.5,.5]; coin .49 -> tok 2.
    coins[0, 1], coins[0, -1] = 0.6, 0.49
    res = accept_sample(tree, logits, params, coins)
    assert (res.path, res.tokens, res.bonus) == ([0], [], 2)


def test_accept_sample_one_hot_and_zero_prob():
    tree = hand_tree()
    params = SamplingParams(temperature=1.0)
    top = math.nextafter(1.0, 0.0)
    coins = torch.full(coin_shape(tree), top, dtype=torch.float64)
    # p(x) == 1 on a draft token: accepted even with the largest coin.
    logits = torch.full((4, 4), -math.inf)
    logits[0, 1] = 0.0
    logits[1, 0] = 0.0
    logits[2, 2] = 0.0
    logits[3, 0] = 0.0
    res = accept_sample(tree, logits, params, coins)
    assert (res.path, res.bonus) == ([0, 2, 3], 0)
    # One-hot on a non-draft token: always rejected, bonus is that token even with coin 0.
    logits = torch.full((4, 4), -math.inf)
    logits[:, 3] = 0.0
    res = accept_sample(tree, logits, params, torch.zeros(coin_shape(tree)))
    assert (res.path, res.bonus) == ([0], 3)
    # A zero-probability draft token is rejected with coin 0.
    logits = torch.zeros(4, 4)
    logits[0, 0] = -math.inf
    coins = torch.zeros(coin_shape(tree))
    res = accept_sample(tree, logits, params, coins)
    assert res.path[:2] == [0, 2]


def test_accept_sample_duplicate_sibling_never_second():
    # Two children with the same token: after the first is rejected, the second cannot win.
    tree = DraftTree(torch.tensor([0, 1, 1]), torch.tensor([-1, 0, 0]), torch.tensor([0.0, -1.0, -1.0]))
    logits = torch.zeros(3, 4)
    coins = torch.tensor([[0.9, 0.0, 0.1], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    res = accept_sample(tree, logits, SamplingParams(temperature=1.0), coins)
    assert res.path == [0] and res.bonus != 1


def test_accept_sample_root_only():
    tree = chain([2])
    coins = torch.tensor([[0.99]])
    res = accept_sample(tree, torch.zeros(1, 5), SamplingParams(temperature=1.0), coins)
    assert (res.path, res.tokens, res.bonus, res.accepted_len) == ([0], [], 4, 1)


def test_accept_sample_bad_input():
    tree = hand_tree()
    logits = torch.zeros(4, 5)
    params = SamplingParams(temperature=1.0)
    with pytest.raises(ValueError, match="use accept_greedy"):
        accept_sample(tree, logits, SamplingParams(temperature=0.0), torch.zeros(4, 3))
    for shape in [(4, 2), (4, 4), (3, 3), (12,)]:
        with pytest.raises(ValueError, match=r"coins must have shape \(4, 3\)"):
            accept_sample(tree, logits, params, torch.zeros(shape))
    with pytest.raises(ValueError, match=r"uniforms in \[0, 1\)"):
        accept_sample(tree, logits, params, torch.ones(4, 3))
    with pytest.raises(ValueError, match=r"uniforms in \[0, 1\)"):
        accept_sample(tree, logits, params, torch.full((4, 3), -0.5))
    with pytest.raises(ValueError, match=r"shape \[N=4, V\]"):
        accept_sample(tree, torch.zeros(5, 5), params, torch.zeros(4, 3))
    with pytest.raises(ValueError, match="SamplingParams"):
        accept_sample(tree, logits, 1.0, torch.zeros(4, 3))


def test_draw_coins():
    tree = hand_tree()
    a = draw_coins(tree, torch.Generator().manual_seed(3))
    b = draw_coins(tree, torch.Generator().manual_seed(3))
    assert a.shape == (4, 3) and torch.equal(a, b)
    assert bool(((a >= 0) & (a < 1)).all())
    assert draw_coins(chain([1])).shape == (1, 1)


def test_accept_result_validation():
    assert AcceptResult(path=[0, 3], tokens=[7], bonus=2).emitted == [7, 2]
    with pytest.raises(ValueError, match="start with the root"):
        AcceptResult(path=[1], tokens=[], bonus=0)
    with pytest.raises(ValueError, match="len\\(path\\) - 1"):
        AcceptResult(path=[0, 1], tokens=[], bonus=0)
    with pytest.raises(ValueError, match="bonus"):
        AcceptResult(path=[0], tokens=[], bonus=-1)


# ------------------------------------------------------------------------------ sampling: statistics


def test_reference_first_token_is_target():
    # The sequence reference must itself have first-token marginal p_root.
    for seed in range(20):
        tree, logits, params = make_case(seed)
        probs = normalised_target(logits, params)
        first = Counter()
        for s, p in reference_sequences(tree, probs).items():
            first[s[0]] += p
        for x, p in enumerate(probs[0].tolist()):
            assert first.get(x, 0.0) == pytest.approx(p, abs=1e-9)


FAST_CASES = 12
FAST_TRIALS = 2_000  # x FAST_CASES ~ 2.4e4 trials


@pytest.mark.parametrize("seed", range(FAST_CASES))
def test_accept_sample_distribution(seed):
    tree, logits, params = make_case(1000 + seed)
    seqs = run_trials(accept_sample, tree, logits, params, FAST_TRIALS, seed)
    pvals = goodness_of_fit(seqs, tree, logits, params, FAST_TRIALS)
    assert min(pvals.values()) > ALPHA, pvals


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10))
def test_accept_sample_distribution_slow(seed):
    trials = 100_000  # x 10 cases = 1e6 trials
    tree, logits, params = make_case(5000 + seed)
    seqs = run_trials(accept_sample, tree, logits, params, trials, seed)
    pvals = goodness_of_fit(seqs, tree, logits, params, trials)
    assert min(pvals.values()) > ALPHA, pvals


# The harness must be able to fail: two plausible bugs are caught with the fast trial count.


def _buggy_accept(tree, logits, params, coins, renormalise=True, residual_bonus=True):
    probs = target_probs(logits, params).double()
    toks = tree.tokens.tolist()
    path = [0]
    while True:
        u = path[-1]
        p = probs[u].clone()
        for j, c in enumerate(tree.sorted_children(u)):
            if float(coins[u, j]) < float(p[toks[c]]):
                path.append(c)
                break
            if renormalise:
                p[toks[c]] = 0.0
                p = p / p.sum()
        else:
            bonus_p = p if residual_bonus else probs[u]
            return AcceptResult(path, [toks[i] for i in path[1:]], sample_from(bonus_p, float(coins[u, -1])))


@pytest.mark.parametrize(
    "bug", [dict(renormalise=False), dict(residual_bonus=False)], ids=["no-renormalise", "full-p-bonus"]
)
def test_harness_catches_bugs(bug):
    # Root with three draft children that share most of the target mass.
    tree = DraftTree(torch.tensor([0, 1, 2, 3]), torch.tensor([-1, 0, 0, 0]), torch.tensor([0.0, -1, -2, -3]))
    logits = torch.log(torch.tensor([[0.05, 0.3, 0.3, 0.25, 0.1]] * 4))
    params = SamplingParams(temperature=1.0)

    def buggy(*args):
        return _buggy_accept(*args, **bug)

    seqs = run_trials(buggy, tree, logits, params, FAST_TRIALS, seed=0)
    assert goodness_of_fit(seqs, tree, logits, params, FAST_TRIALS)["first"] < ALPHA
    # ... while the real implementation passes on the same coins.
    seqs = run_trials(accept_sample, tree, logits, params, FAST_TRIALS, seed=0)
    assert goodness_of_fit(seqs, tree, logits, params, FAST_TRIALS)["first"] > ALPHA


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_device_sampling_gives_the_params_probabilities_bitwise(device, monkeypatch):
    """DeviceSampling (1 / temperature and top-p in a device buffer, what a CUDA graph reads) against the
    Python scalars of SamplingParams: the same probabilities bit for bit, over fresh settings and logits
    (ties and -inf included), both flavours (top-p filtering or not); the buffer is written only when the
    values change, and a view of it carries the setting's flavour."""
    from ssv.spec.accept import DeviceSampling, probs_unchecked
    rng = random.Random()
    ds = DeviceSampling(device)
    for _ in range(12):
        t = rng.choice([rng.uniform(0.05, 3.0), 1.0, 0.7])
        p = rng.choice([1.0, rng.uniform(0.05, 0.999)])
        params = SamplingParams(temperature=t, top_p=p)
        logits = torch.randn(rng.randint(1, 7), rng.randint(2, 3001), device=device) * rng.uniform(0.5, 20)
        logits[0, : logits.shape[1] // 3] = logits[0, 0]                  # ties
        logits[-1, rng.randrange(logits.shape[1])] = -math.inf
        view = ds.view(params)
        assert view.filters == (p < 1.0) and view.buf is ds.buf
        assert torch.equal(probs_unchecked(logits, view), probs_unchecked(logits, params))
    writes = []
    real = torch.Tensor.fill_
    monkeypatch.setattr(torch.Tensor, "fill_", lambda self, v: (writes.append(v), real(self, v))[1])
    ds.view(SamplingParams(0.5, 0.9))
    ds.view(SamplingParams(0.5, 0.9))
    ds.view(SamplingParams(0.25, 0.9)).view(SamplingParams(0.5, 0.9))   # a view writes for its parent too
    ds.view(SamplingParams(0.5, 0.9))
    monkeypatch.undo()
    assert writes == [2.0, 0.9, 4.0, 0.9, 2.0, 0.9]
    assert ds.buf.tolist() == [2.0, pytest.approx(0.9)]
    with pytest.raises(ValueError, match="greedy"):
        ds.view(SamplingParams(0.0))
