"""The device round's tree work against the host versions: same trees, orders, masks and accepted paths."""
import pytest
import torch

from ssv.spec.accept import accept_greedy
from ssv.spec.device import DeviceTree, ancestor_mask, check_spec, flatten_device, flatten_device_masked, grow_tree
from ssv.spec.device_accept import accept_greedy_device
from ssv.spec.flatten import flatten, tree_metadata
from ssv.spec.tree import DraftTree, TreeSpec, build_tree

SPECS = [TreeSpec(1, 1, 2), TreeSpec(3, 2, 7), TreeSpec(4, 3, 12), TreeSpec(6, 8, 48), TreeSpec(5, 4, 61),
         TreeSpec(2, 16, 20)]


def _table(spec, vocab, seed, levels=4):
    """Log-probs [V] of the next token by (depth, token): coarse values, so ties are everywhere."""
    g = torch.Generator().manual_seed(seed)
    return -torch.randint(0, levels, (spec.depth + 1, vocab, vocab), generator=g).double() * 0.5


def _grow_both(spec, vocab, seed, ids=None, device="cpu"):
    tab = _table(spec, vocab, seed)
    root = 5
    dtab = tab.to(device)

    def host_expand(frontier, tree):
        return torch.stack([tab[int(tree.depth[u]), int(tree.tokens[u])] for u in frontier])

    def dev_expand(level, tokens, parent_rows, path_rows):
        assert path_rows.shape == (spec.top_k, spec.depth)
        assert bool((path_rows[:, level - 2].cpu() == (level - 2) * spec.top_k + torch.arange(spec.top_k)).all())
        lp = dtab[level - 1][tokens]
        return lp if ids is None else lp[:, ids]

    host = build_tree(host_expand, root, spec.depth, spec.top_k, spec.total_tokens)
    root_lp = dtab[0, root] if ids is None else dtab[0, root][ids]
    dev = grow_tree(dev_expand, torch.tensor(root, device=device), root_lp, spec, ids=ids)
    return host, DeviceTree(*(t.cpu() for t in (dev.tokens, dev.parents, dev.scores, dev.depth)))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grow_tree_matches_build_tree(spec, seed):
    host, dev = _grow_both(spec, 40, seed)
    assert torch.equal(dev.tokens, host.tokens)
    assert torch.equal(dev.parents, host.parents)
    assert torch.equal(dev.scores, host.scores)
    assert torch.equal(dev.depth, host.depth)


def test_grow_tree_over_a_sub_vocabulary_ranks_as_the_full_one():
    spec = TreeSpec(4, 3, 12)
    vocab = 40
    ids = torch.sort(torch.randperm(vocab, generator=torch.Generator().manual_seed(3))[:25]).values
    tab = _table(spec, vocab, 4)
    off = torch.ones(vocab, dtype=torch.bool)
    off[ids] = False
    tab[:, :, off] = float("-inf")      # a draft vocabulary: -inf elsewhere

    def host_expand(frontier, tree):
        return torch.stack([tab[int(tree.depth[u]), int(tree.tokens[u])] for u in frontier])

    host = build_tree(host_expand, 7, spec.depth, spec.top_k, spec.total_tokens)
    dev = grow_tree(lambda lv, t, p, r: tab[lv - 1][t][:, ids], torch.tensor(7), tab[0, 7][ids], spec, ids=ids)
    assert torch.equal(dev.tokens, host.tokens) and torch.equal(dev.parents, host.parents)


def _random_tree(n, seed, ties=True):
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    scores = [0.0]
    for i in range(1, n):
        step = float(torch.randint(0, 3, (1,), generator=g)) * 0.5 if ties else float(torch.rand(1, generator=g))
        scores.append(scores[parents[i]] - step)
    tokens = torch.randint(0, 6, (n,), generator=g)  # few tokens: duplicate siblings
    return DraftTree(tokens=tokens, parents=torch.tensor(parents), scores=torch.tensor(scores))


def _dev(tree: DraftTree) -> DeviceTree:
    return DeviceTree(tree.tokens.clone(), tree.parents.clone(), tree.scores.clone(), tree.depth.clone())


@pytest.mark.parametrize("order", ["bfs", "dfs", "pos"])
@pytest.mark.parametrize("seed", range(6))
def test_flatten_device_matches_flatten(order, seed):
    tree = _random_tree(30, seed, ties=seed % 2 == 0)
    depth = int(tree.depth.max())
    spec = TreeSpec(max(depth, 1), 16, 30)
    want, perm = flatten(tree, order)
    got, gperm = flatten_device(_dev(tree), order, spec)
    assert torch.equal(gperm, perm)
    assert torch.equal(got.parents, want.parents) and torch.equal(got.tokens, want.tokens)
    meta = tree_metadata(want, 100)
    assert torch.equal(ancestor_mask(got.parents, spec.depth), meta.mask)
    assert torch.equal(got.depth + 100, meta.positions)
    _, _, mask = flatten_device_masked(_dev(tree), order, spec)   # the permuted mask the round uses
    assert torch.equal(mask, meta.mask)


@pytest.mark.parametrize("seed", range(12))
def test_accept_greedy_device_matches_host(seed):
    tree = _random_tree(25, seed)
    g = torch.Generator().manual_seed(100 + seed)
    # logits with ties (lowest id wins) and a strong pull toward the tree's tokens so paths are long
    logits = torch.randint(0, 3, (25, 6), generator=g).float()
    follow = torch.rand(25, generator=g) < 0.7
    for u in range(25):
        kids = [c for c in range(25) if int(tree.parents[c]) == u]
        if kids and follow[u]:
            logits[u, int(tree.tokens[kids[-1]])] = 5.0
    want = accept_greedy(tree, logits)
    D = int(tree.depth.max())
    path, n, bonus = accept_greedy_device(_dev(tree), logits, D)
    assert int(n) == len(want.path)
    assert path[: len(want.path)].tolist() == want.path and bool((path[len(want.path):] == -1).all())
    assert int(bonus) == want.bonus


def test_check_spec_refuses_what_the_device_round_cannot_hold():
    with pytest.raises(ValueError, match="candidate pool"):
        check_spec(TreeSpec(2, 2, 7 + 1))
    with pytest.raises(ValueError, match="depth"):
        check_spec(TreeSpec(12, 16, 20))
    check_spec(TreeSpec(6, 8, 48))


@pytest.mark.parametrize("v", [5000, 8192])
def test_vocab_top_ranks_as_the_stable_sort(v):
    """The large-vocabulary top-k (an int64 key, no sort) equals the stable descending sort, ties and -inf included."""
    from ssv.spec.device import _stable_top, _vocab_top
    g = torch.Generator().manual_seed(v)
    lp = (-torch.randint(0, 6, (8, v), generator=g).float() * 0.25)
    lp[:, ::3] = float("-inf")
    lp[0, :] = float("-inf")
    lp[0, v - 2] = -0.5
    vals, ids = _vocab_top(lp, 16)
    wv, wi = _stable_top(lp.double(), 16)
    assert torch.equal(ids, wi) and torch.equal(vals, wv)
