import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssv.spec.flatten import flatten, tree_metadata
from ssv.spec.tree import ORDERS, DraftTree, TreeSpec, build_tree, chain, top_k_stable


def make_tree(tokens, parents, scores=None):
    n = len(tokens)
    if scores is None:
        scores = [0.0] * n
    return DraftTree(
        torch.tensor(tokens, dtype=torch.long),
        torch.tensor(parents, dtype=torch.long),
        torch.tensor(scores, dtype=torch.float32),
    )


@st.composite
def trees(draw, max_n=24):
    n = draw(st.integers(1, max_n))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    tokens = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    # A small score alphabet forces sibling ties, which exercises the index tie-break.
    scores = [0.0] + draw(st.lists(st.sampled_from([-3.0, -2.0, -1.0, -0.5, 0.0]), min_size=n - 1, max_size=n - 1))
    return make_tree(tokens, parents, scores)


def brute_depth(parents, i):
    d = 0
    while parents[i] != -1:
        i = parents[i]
        d += 1
    return d


def brute_ancestors(parents, i):
    out = {i}
    while parents[i] != -1:
        i = parents[i]
        out.add(i)
    return out


# ------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "tokens, parents, scores, match",
    [
        ([[1, 2]], [[-1, 0]], [[0.0, 0.0]], "1-D"),
        ([1, 2], [-1, 0, 0], [0.0, 0.0], "same length"),
        ([], [], [], "at least one node"),
        ([1, 2], [0, 0], [0.0, 0.0], "parent -1"),
        ([1, 2, 3], [-1, 0, -1], [0.0, 0.0, 0.0], r"parent of node 2 must be in \[0, 1\]"),
        ([1, 2, 3], [-1, 2, 0], [0.0, 0.0, 0.0], r"parent of node 1 must be in \[0, 0\]"),
        ([1, 2], [-1, 1], [0.0, 0.0], "parent of node 1"),
        ([1, -2], [-1, 0], [0.0, 0.0], "tokens must be >= 0"),
        ([1, 2], [-1, 0], [0.0, float("nan")], "NaN"),
    ],
)
def test_tree_validation(tokens, parents, scores, match):
    with pytest.raises(ValueError, match=match):
        DraftTree(
            torch.tensor(tokens, dtype=torch.long),
            torch.tensor(parents, dtype=torch.long),
            torch.tensor(scores, dtype=torch.float32),
        )


def test_tree_validation_dtypes():
    good = dict(tokens=torch.tensor([1, 2]), parents=torch.tensor([-1, 0]), scores=torch.tensor([0.0, -1.0]))
    for name, bad in [
        ("tokens", torch.tensor([1.0, 2.0])),
        ("parents", torch.tensor([-1.0, 0.0])),
        ("scores", torch.tensor([0, -1])),
        ("tokens", [1, 2]),
    ]:
        with pytest.raises(ValueError, match=f"DraftTree.{name}"):
            DraftTree(**{**good, name: bad})


def test_tree_basics():
    #      0
    #    / | \
    #   1  2  4      scores: 1:-1, 2:-0.5, 4:-0.5
    #   |
    #   3
    t = make_tree([5, 1, 2, 3, 1], [-1, 0, 0, 1, 0], [0.0, -1.0, -0.5, -2.0, -0.5])
    assert t.n == 5
    assert t.depth.tolist() == [0, 1, 1, 2, 1]
    assert t.children(0) == [1, 2, 4]
    assert t.children(3) == []
    assert t.sorted_children(0) == [2, 4, 1]  # -0.5 (idx 2), -0.5 (idx 4), -1
    assert t.max_children == 3
    assert not t.is_chain
    with pytest.raises(ValueError, match="node index"):
        t.children(5)


def test_chain():
    c = chain([7, 3, 3, 9])
    assert c.parents.tolist() == [-1, 0, 1, 2]
    assert c.tokens.tolist() == [7, 3, 3, 9]
    assert c.scores.tolist() == [0.0] * 4
    assert c.is_chain and c.max_children == 1
    assert chain(torch.tensor([4])).is_chain
    assert chain([4]).max_children == 0
    assert not make_tree([0, 1, 2], [-1, 0, 0]).is_chain
    with pytest.raises(ValueError, match="non-empty"):
        chain([])


@given(trees())
def test_is_chain_matches_parents(t):
    assert t.is_chain == (t.parents.tolist() == list(range(-1, t.n - 1)))


# ------------------------------------------------------------------------------ flatten


def check_relabelled(old, new, perm):
    n = old.n
    assert sorted(perm.tolist()) == list(range(n))
    assert perm[0] == 0
    assert torch.equal(new.tokens, old.tokens[perm])
    assert torch.equal(new.scores, old.scores[perm])
    p = perm.tolist()
    for k in range(1, n):
        assert new.parents[k] < k
        assert p[int(new.parents[k])] == int(old.parents[p[k]])


def check_sibling_order(old, new, perm):
    """Children of every node appear in descending score, ties by lower OLD index."""
    p = perm.tolist()
    s = old.scores.tolist()
    for u in range(new.n):
        kids_old = [p[c] for c in new.children(u)]
        assert kids_old == sorted(kids_old, key=lambda c: (-s[c], c))


def check_bfs(new):
    # Parents precede children and parent indices never decrease: exactly the BFS queue.
    par = new.parents.tolist()[1:]
    assert par == sorted(par)
    d = new.depth.tolist()
    assert d == sorted(d)


def check_dfs(new):
    parents = new.parents.tolist()
    for i in range(new.n):
        desc = [j for j in range(new.n) if j != i and i in brute_ancestors(parents, j)]
        assert desc == list(range(i + 1, i + 1 + len(desc))), f"subtree of {i} not contiguous"
        if desc:
            assert parents[i + 1] == i  # preorder: first child right after its parent


def check_pos(old, new, perm):
    d = new.depth.tolist()
    assert d == sorted(d)
    parents = new.parents.tolist()
    # Siblings adjacent: each parent's children form one contiguous run.
    for u in range(new.n):
        kids = new.children(u)
        if kids:
            assert kids == list(range(kids[0], kids[0] + len(kids)))
    # Groups within a level are ordered by the parent's DFS preorder index.
    _, dfs_perm = flatten(old, "dfs")
    pre = {old_i: k for k, old_i in enumerate(dfs_perm.tolist())}
    p = perm.tolist()
    group_keys = [pre[p[parents[k]]] for k in range(1, new.n)]
    levels = d[1:]
    for a in range(len(group_keys) - 1):
        if levels[a] == levels[a + 1]:
            assert group_keys[a] <= group_keys[a + 1]


@settings(max_examples=200, deadline=None)
@given(trees())
def test_flatten_orders(t):
    for order in ORDERS:
        new, perm = flatten(t, order)
        check_relabelled(t, new, perm)
        check_sibling_order(t, new, perm)
        if order == "bfs":
            check_bfs(new)
        elif order == "dfs":
            check_dfs(new)
        else:
            check_pos(t, new, perm)


def test_flatten_hand_example():
    #        0
    #      /   \
    #     1     2        scores 1:-2, 2:-1   -> 2 first
    #    / \    |
    #   3   4   5        scores 3:-3, 4:-2.5, 5:-4
    #           |
    #           6
    t = make_tree([0, 1, 2, 3, 4, 5, 6], [-1, 0, 0, 1, 1, 2, 5], [0, -2, -1, -3, -2.5, -4, -5])
    assert flatten(t, "bfs")[1].tolist() == [0, 2, 1, 5, 4, 3, 6]
    assert flatten(t, "dfs")[1].tolist() == [0, 2, 5, 6, 1, 4, 3]
    assert flatten(t, "pos")[1].tolist() == [0, 2, 1, 5, 4, 3, 6]


@settings(max_examples=100, deadline=None)
@given(trees())
def test_flatten_pos_equals_bfs(t):
    # Within one level both BFS and DFS preorder list nodes in lexicographic order of their
    # sibling-rank paths, so "pos" and "bfs" coincide under these definitions.
    assert flatten(t, "pos")[1].tolist() == flatten(t, "bfs")[1].tolist()


def test_flatten_bad_order():
    with pytest.raises(ValueError, match="order must be one of"):
        flatten(chain([1, 2]), "preorder")


# ------------------------------------------------------------------------------ metadata


@settings(max_examples=150, deadline=None)
@given(trees(), st.integers(0, 10_000))
def test_metadata_brute_force(t, prefix_len):
    meta = tree_metadata(t, prefix_len)
    parents = t.parents.tolist()
    n = t.n
    for q in range(n):
        anc = brute_ancestors(parents, q)
        for s in range(n):
            assert bool(meta.mask[q, s]) == (s in anc)
        assert int(meta.positions[q]) == prefix_len + brute_depth(parents, q)
        path = meta.ancestors[q]
        assert path[0] == 0 and path[-1] == q and set(path) == anc
        assert all(parents[b] == a for a, b in zip(path, path[1:]))
    assert meta.mask.dtype == torch.bool and meta.mask.shape == (n, n)
    assert torch.equal(meta.depth, t.depth)
    assert meta.positions.dtype == torch.long


@settings(max_examples=50, deadline=None)
@given(trees())
def test_metadata_commutes_with_flatten(t):
    meta = tree_metadata(t, 3)
    for order in ORDERS:
        new, perm = flatten(t, order)
        m2 = tree_metadata(new, 3)
        assert torch.equal(m2.mask, meta.mask[perm][:, perm])
        assert torch.equal(m2.positions, meta.positions[perm])


@pytest.mark.parametrize("bad", [-1, 1.5, True, None])
def test_metadata_bad_prefix(bad):
    with pytest.raises(ValueError, match="prefix_len must be an int >= 0"):
        tree_metadata(chain([1, 2]), bad)


# ------------------------------------------------------------------------------ build_tree


class FakeDrafter:
    """Deterministic draft model: log-probs depend on the node's token and depth."""

    def __init__(self, vocab, seed, scale=2.0):
        g = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.by_token = torch.randn(vocab, vocab, generator=g, dtype=torch.float64) * scale
        self.by_depth = torch.randn(40, vocab, generator=g, dtype=torch.float64) * scale
        self.calls = []

    def row(self, token, depth):
        return torch.log_softmax(self.by_token[token] + self.by_depth[depth], dim=-1)

    def __call__(self, frontier, tree):
        self.calls.append(list(frontier))
        return torch.stack([self.row(int(tree.tokens[u]), int(tree.depth[u])) for u in frontier]).float()


def token_paths(tree):
    meta = tree_metadata(tree, 0)
    toks = tree.tokens.tolist()
    return [tuple(toks[i] for i in path) for path in meta.ancestors]


def spec_cases(n_cases, seed):
    rng = random.Random(seed)
    for _ in range(n_cases):
        vocab = rng.randint(4, 16)
        top_k = rng.randint(1, min(vocab, 5))
        depth = rng.randint(1, 6)
        total = rng.randint(1, 80)
        yield vocab, depth, top_k, total, rng.randrange(10**9)


@pytest.mark.parametrize("vocab, depth, top_k, total, seed", list(spec_cases(40, seed=1)))
def test_build_tree_properties(vocab, depth, top_k, total, seed):
    model = FakeDrafter(vocab, seed)
    root = seed % vocab
    t = build_tree(model, root, depth, top_k, total)
    spec = TreeSpec(depth, top_k, total)
    assert t.n == min(total, spec.max_nodes)
    assert int(t.tokens[0]) == root and float(t.scores[0]) == 0.0
    assert int(t.depth.max()) <= depth
    toks, pars, scores = t.tokens.tolist(), t.parents.tolist(), t.scores.tolist()
    for i in range(1, t.n):
        p = pars[i]
        # Scores are cumulative draft log-probs of the path, hence non-increasing along it.
        expect = scores[p] + float(model.row(toks[p], int(t.depth[p]))[toks[i]])
        assert scores[i] == pytest.approx(expect, abs=1e-4)
        assert scores[i] <= scores[p]
    for u in range(t.n):
        kid_toks = [toks[c] for c in t.children(u)]
        assert len(kid_toks) == len(set(kid_toks)) <= top_k
    if total == 1:
        assert model.calls == []
    else:
        assert len(model.calls) == depth


@pytest.mark.parametrize("vocab, depth, top_k, _total, seed", list(spec_cases(20, seed=2)))
def test_build_tree_full_pool_structure(vocab, depth, top_k, _total, seed):
    """With room for the whole pool, check the expansion rule level by level."""
    model = FakeDrafter(vocab, seed)
    spec_nodes = 1 + top_k + (depth - 1) * top_k * top_k
    t = build_tree(model, 0, depth, top_k, min(spec_nodes, 256))
    if spec_nodes > 256:
        pytest.skip("pool larger than the 256-node limit")
    toks, scores, d = t.tokens.tolist(), t.scores.tolist(), t.depth.tolist()
    for level in range(depth):
        nodes = [i for i in range(t.n) if d[i] == level]
        assert len(nodes) == (1 if level == 0 else top_k if level == 1 else top_k * top_k)
        beam = sorted(nodes, key=lambda i: (-scores[i], i))[:top_k]
        for u in nodes:
            kids = t.children(u)
            if u in beam:
                row = model.row(toks[u], level)
                expect = sorted(range(vocab), key=lambda x: (-float(row[x]), x))[:top_k]
                assert sorted(toks[c] for c in kids) == sorted(expect)
            else:
                assert kids == []


@pytest.mark.parametrize("vocab, depth, top_k, total, seed", list(spec_cases(20, seed=3)))
def test_build_tree_rerank_is_top_of_pool(vocab, depth, top_k, total, seed):
    model = FakeDrafter(vocab, seed)
    full = build_tree(model, 1, depth, top_k, 256)
    small = build_tree(FakeDrafter(vocab, seed), 1, depth, top_k, total)
    if full.n >= 256:
        pytest.skip("pool truncated by the 256-node limit")
    scored = sorted(zip(full.scores.tolist()[1:], token_paths(full)[1:]), key=lambda sp: -sp[0])
    want = {path for _, path in scored[: total - 1]}
    assert set(token_paths(small)[1:]) == want


@pytest.mark.parametrize("seed", range(8))
def test_build_tree_top1_is_greedy_chain(seed):
    vocab, depth = 12, 7
    model = FakeDrafter(vocab, seed)
    for total in (1, 3, depth + 1, 50):
        t = build_tree(model, 5, depth, 1, total)
        assert t.is_chain
        assert t.n == min(total, depth + 1)
        expect, tok = [5], 5
        for level in range(t.n - 1):
            tok = int(torch.argmax(model.row(tok, level)))
            expect.append(tok)
        assert t.tokens.tolist() == expect


def test_build_tree_ties_keep_ancestors():
    # A one-hot drafter gives log-prob 0 (child score == parent score) and -inf elsewhere;
    # ties must still keep every kept node's parent.
    def one_hot(frontier, tree):
        out = torch.full((len(frontier), 6), -math.inf)
        out[:, 2] = 0.0
        return out

    for total in range(1, 30):
        t = build_tree(one_hot, 0, 5, 3, total)  # DraftTree validation checks parents exist
        assert t.n == min(total, 1 + 3 + 4 * 9)
        # The all-token-2 chain (root + 5 levels, score 0) outranks every -inf node.
        zero = [i for i, s in enumerate(t.scores.tolist()) if s == 0.0]
        assert len(zero) == min(total, 6)
        assert all(int(t.tokens[i]) == (0 if i == 0 else 2) for i in zero)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(depth=0), r"depth must be an int in \[1, 32\]"),
        (dict(depth=33), r"depth must be an int in \[1, 32\]"),
        (dict(top_k=0), r"top_k must be an int in \[1, 16\]"),
        (dict(top_k=17), r"top_k must be an int in \[1, 16\]"),
        (dict(total_tokens=0), r"total_tokens must be an int in \[1, 256\]"),
        (dict(total_tokens=257), r"total_tokens must be an int in \[1, 256\]"),
        (dict(depth=2.0), "depth must be an int"),
        (dict(top_k=True), "top_k must be an int"),
    ],
)
def test_tree_spec_validation(kwargs, match):
    args = {**dict(depth=3, top_k=2, total_tokens=10), **kwargs}
    with pytest.raises(ValueError, match=match):
        TreeSpec(**args)
    with pytest.raises(ValueError, match=match):
        build_tree(FakeDrafter(8, 0), 0, **args)


def test_build_tree_bad_inputs():
    with pytest.raises(ValueError, match="root_token"):
        build_tree(FakeDrafter(8, 0), -1, 2, 2, 5)
    with pytest.raises(ValueError, match="exceeds the vocabulary"):
        build_tree(FakeDrafter(4, 0), 0, 2, 5, 5)
    with pytest.raises(ValueError, match=r"Tensor\[1, V\]"):
        build_tree(lambda f, t: torch.zeros(len(f) + 1, 8), 0, 2, 2, 5)
    with pytest.raises(ValueError, match="log-probabilities"):
        build_tree(lambda f, t: torch.randn(len(f), 8).abs() + 1, 0, 2, 2, 5)
    with pytest.raises(ValueError, match="NaN"):
        build_tree(lambda f, t: torch.full((len(f), 8), float("nan")), 0, 2, 2, 5)


@pytest.mark.parametrize("seed", range(8))
def test_top_k_stable_equals_the_stable_sort(seed):
    """Ties (many, at and around the k-th value), -inf tails and k past the finite entries: the
    same values and indices as the first k columns of the full stable sort."""
    gen = torch.Generator().manual_seed(seed)
    rows, V = 1 + seed % 4, 50 + 37 * seed
    x = torch.randint(-6, 1, (rows, V), generator=gen).float() / 2           # coarse: ties everywhere
    x[torch.rand(rows, V, generator=gen) < 0.3] = float("-inf")
    if seed % 3 == 0:
        x[0, 5:] = float("-inf")                                              # fewer finite than k
    for k in (1, 3, 8, V):
        want_v, want_i = torch.sort(x, dim=1, descending=True, stable=True)
        got_v, got_i = top_k_stable(x, k)
        assert torch.equal(got_v, want_v[:, :k]) and torch.equal(got_i, want_i[:, :k])
