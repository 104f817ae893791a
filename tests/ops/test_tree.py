"""One draft-tree level and the grown tree's finish, one launch each, against their tensor twins
(interpreter on the CPU, compiled on a GPU), and grow_tree / grow_flat through them against build_tree."""
import pytest
import torch

import ssv.spec.device as SD
from ssv.ops.tree.naive import tree_finish_naive, tree_level_naive
from ssv.ops.tree.ops import tree_finish, tree_level
from ssv.spec.tree import TreeSpec

from ..spec.test_device import _grow_both
from .test_nsa_kernels import DEV


def _buffers(M, K, D, dev):
    """Pool and frontier outputs poisoned: every entry a level owns must be written."""
    return (torch.full((M,), -777, dtype=torch.long, device=dev), torch.full((M,), -777, dtype=torch.long, device=dev),
            torch.full((M,), float("nan"), dtype=torch.float64, device=dev),
            [torch.full((K,), -777, dtype=torch.long, device=dev) for _ in range(3)]
            + [torch.full((K, D), -777, dtype=torch.long, device=dev)])


@pytest.mark.parametrize("K,D", [(2, 1), (3, 4), (5, 3), (8, 6), (16, 2)])
@pytest.mark.parametrize("seed", [0, 1])
def test_tree_levels_match_the_tensor_form(K, D, seed):
    g = torch.Generator().manual_seed(seed * 100 + K)
    M = 1 + K + (D - 1) * K * K
    pools = [_buffers(M, K, D, DEV) for _ in range(2)]
    fronts = [None, None]
    root = torch.tensor([11], device=DEV)
    base = 1
    for t in range(1, D + 1):
        R = 1 if t == 1 else K
        vals = -(torch.randint(0, 3, (R, K), generator=g).double() * 0.5)      # ties across parents
        vals[torch.rand(R, K, generator=g) < 0.15] = float("-inf")
        vals = vals.sort(dim=-1, descending=True, stable=True).values.to(DEV)       # a top-k's order
        toks = torch.randint(0, 50, (R, K), generator=g).to(DEV)
        for i, (fn, (tok, par, score, outs)) in enumerate(zip((tree_level, tree_level_naive), pools)):
            nxt = [torch.full_like(o, -777) for o in outs]
            prev = fronts[i]
            fn(vals, toks, t, base, root, None if t == 1 else prev[0], None if t == 1 else prev[3],
               tok, par, score, *nxt)
            fronts[i] = nxt
        for a, b in zip(pools[0][:3], pools[1][:3]):
            assert torch.equal(a[:base + R * K], b[:base + R * K])
        assert not pools[0][2][:base + R * K].isnan().any() and (pools[0][0][:base + R * K] != -777).all()
        for a, b in zip(*fronts):
            assert torch.equal(a, b) and (a != -777).all()
        base += R * K


def test_tree_level_ranks_nan_first_as_a_stable_sort():
    K, D = 4, 3
    outs = []
    for fn in (tree_level, tree_level_naive):
        tok, par, score, nxt = _buffers(1 + K + K * K, K, D, DEV)
        vals = torch.tensor([[float("nan"), -0.5, -0.5, float("-inf")]], dtype=torch.float64, device=DEV)
        fn(vals, torch.arange(K, device=DEV)[None], 1, 1, torch.tensor([3], device=DEV), None, None, tok, par, score, *nxt)
        outs.append(nxt)
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    assert outs[0][0].tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("spec", [TreeSpec(3, 2, 7), TreeSpec(4, 3, 12), TreeSpec(6, 8, 48), TreeSpec(2, 16, 20)])
def test_grow_tree_through_the_kernel_matches_build_tree(spec, monkeypatch):
    monkeypatch.setattr(SD, "_tree_level", lambda x, k: tree_level)   # the kernel on the CPU too (interpreter)
    host, dev = _grow_both(spec, 40, 1, device=DEV)
    for a, b in ((dev.tokens, host.tokens), (dev.parents, host.parents), (dev.scores, host.scores),
                 (dev.depth, host.depth)):
        assert torch.equal(a, b)


def test_tree_level_refuses_what_one_program_cannot_hold():
    K, D = 17, 2
    tok, par, score, nxt = _buffers(1 + K + K * K, K, D, DEV)
    v = torch.zeros(K, K, dtype=torch.float64, device=DEV)
    with pytest.raises(ValueError, match="candidates"):
        tree_level(v, v.long(), 2, 1 + K, None, nxt[0], nxt[3], tok, par, score, *nxt[:3],
                   torch.empty(K, D, dtype=torch.long, device=DEV))
    with pytest.raises(ValueError, match="apart"):
        tree_level(v[:4, :4], v[:4, :4].long(), 2, 5, None, nxt[0], nxt[3], tok, par, score, *nxt)
    with pytest.raises(ValueError, match="float64"):
        tree_level(v[:1, :4].float(), v[:1, :4].long(), 1, 1, nxt[0][:1], None, None, tok, par, score,
                   nxt[0][:4], nxt[1][:4], nxt[2][:4], torch.empty(4, D, dtype=torch.long, device=DEV))


def _random_pool(K, D, seed, nan=False):
    """A pool of grow_pool's layout with random parents one level up (a kept node's parent may be
    dropped: then its parent is -1) and scores drawn from a few values (ties), -inf and NaN."""
    g = torch.Generator().manual_seed(seed)
    M = 1 + K + (D - 1) * K * K
    lo = [0, 1] + [1 + K + i * K * K for i in range(D)]       # level t's first pool id
    par = torch.full((M,), -1, dtype=torch.long)
    for t in range(1, D + 1):
        a, b = lo[t], min(lo[t + 1], M)
        par[a:b] = torch.randint(lo[t - 1], lo[t], (b - a,), generator=g) if t > 1 else 0
    score = -(torch.randint(0, 5, (M,), generator=g).double() * 0.25)
    score[torch.rand(M, generator=g) < 0.1] = float("-inf")
    if nan:
        score[torch.rand(M, generator=g) < 0.05] = float("nan")
    score[0] = 0.0
    tok = torch.randint(0, 100, (M,), generator=g)
    return tok.to(DEV), par.to(DEV), score.to(DEV)


@pytest.mark.parametrize("K,D,T", [(8, 6, 48), (2, 3, 6), (3, 4, 12), (4, 1, 5), (4, 5, 1), (5, 2, 26),
                                   (7, 3, 64), (2, 1, 3)])
@pytest.mark.parametrize("order", ["bfs", "dfs", "pos"])
@pytest.mark.parametrize("seed", [0, 1])
def test_tree_finish_matches_the_tensor_form(K, D, T, order, seed):
    pool = _random_pool(K, D, seed, nan=seed == 1)
    dlen = torch.tensor([1000 + seed], dtype=torch.int32, device=DEV)
    got = tree_finish(*pool, dlen, T, K, D, order)
    want = tree_finish_naive(*pool, dlen, T, K, D, order)
    names = ("tokens", "parents", "scores", "depth", "pos", "mask")
    for name, a, b in zip(names, got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a.nan_to_num(-9.0) if a.is_floating_point() else a,
                           b.nan_to_num(-9.0) if b.is_floating_point() else b), name
    assert got[5].diagonal().all() and torch.equal(got[4], got[3] + dlen.long())


@pytest.mark.parametrize("K,D,T,S", [(8, 6, 40, 8), (3, 4, 12, 5), (2, 3, 6, 1), (5, 2, 20, 11)])
@pytest.mark.parametrize("order", ["bfs", "dfs", "pos"])
@pytest.mark.parametrize("seed", [0, 1])
def test_tree_finish_spares_match_grow_spares(K, D, T, S, order, seed):
    """The next S nodes by rank beside the kept tree (a lookup's spares): grow_spares's, parents as
    flattened positions or T + spare rank, on pools with ties, -inf and (seed 1) NaN scores."""
    pool = _random_pool(K, D, seed + 10, nan=seed == 1)
    dlen = torch.tensor([500], dtype=torch.int32, device=DEV)
    got = tree_finish(*pool, dlen, T, K, D, order, spares=S)
    want = tree_finish_naive(*pool, dlen, T, K, D, order, spares=S)
    assert len(got) == len(want) == 10
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert torch.equal(a.nan_to_num(-9.0) if a.is_floating_point() else a,
                           b.nan_to_num(-9.0) if b.is_floating_point() else b), i
    with pytest.raises(ValueError, match="spares"):
        tree_finish(*pool, dlen, T, K, D, order, spares=17)


@pytest.mark.parametrize("spec", [TreeSpec(3, 2, 7), TreeSpec(6, 8, 48), TreeSpec(2, 16, 20)])
@pytest.mark.parametrize("order", ["bfs", "dfs"])
def test_grow_flat_through_the_kernels_matches_grow_tree_flattened(spec, order, monkeypatch):
    from ..spec.test_device import _table
    tab = _table(spec, 40, 2).to(DEV)
    expand = lambda lv, t, p, r: tab[lv - 1][t]   # noqa: E731
    root, dlen = torch.tensor(5, device=DEV), torch.tensor([77], dtype=torch.int32, device=DEV)
    tree = SD.grow_tree(expand, root, tab[0, 5], spec)
    want, _, want_mask = SD.flatten_device_masked(tree, order, spec)
    monkeypatch.setattr(SD, "_tree_level", lambda x, k: tree_level)
    monkeypatch.setattr(SD, "_tree_finish", lambda x, T, M: tree_finish)
    flat, mask, pos = SD.grow_flat(expand, root, tab[0, 5], spec, order, dlen)
    for a, b in ((flat.tokens, want.tokens), (flat.parents, want.parents), (flat.scores, want.scores),
                 (flat.depth, want.depth), (mask, want_mask), (pos, want.depth + 77)):
        assert torch.equal(a, b)


def test_tree_finish_refuses_what_one_program_cannot_hold():
    tok, par, score = _random_pool(3, 2, 0)
    dlen = torch.zeros(1, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="order"):
        tree_finish(tok, par, score, dlen, 5, 3, 2, "random")
    with pytest.raises(ValueError, match="pool"):
        tree_finish(tok, par, score, dlen, 5, 3, 3, "bfs")          # not a depth-3 pool
    with pytest.raises(ValueError, match="pool"):
        tree_finish(tok, par, score, dlen, tok.numel() + 1, 3, 2, "bfs")
    with pytest.raises(ValueError, match="float64"):
        tree_finish(tok, par, score.float(), dlen, 5, 3, 2, "bfs")
