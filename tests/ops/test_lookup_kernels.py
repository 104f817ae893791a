"""The fused context lookup + chain attachment (ssv/ops/lookup: two launches) against its tensor twin
(`context_lookup` then `attach_chain_device`), in Triton's interpreter on the CPU and compiled on a GPU:
random histories over a few tokens (suffixes recur) and without repeats, lengths at the buffer's
ends and at the suffix lengths, random trees (ties, -inf and NaN scores) and the head's grown trees
with their spares (`grow_spares`); outputs poisoned before each launch, the workspace back at -1
after it, a second launch on the same workspace the same."""
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ssv.ops.lookup.naive import lookup_attach_naive  # noqa: E402
from ssv.ops.lookup.ops import MAX_NODES, lookup_attach, lookup_buffers, lookup_workspace  # noqa: E402
from ssv.spec.device import DeviceTree, ancestor_mask  # noqa: E402
from ssv.spec.lookup import context_lookup, grow_spares  # noqa: E402
from ssv.spec.tree import TreeSpec  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def _random_tree(T, K, V, g, nan=False):
    """A random tree of T nodes (parents before children, tokens of V, tied and -inf scores; NaN ones
    when nan) with its mask, positions and K spares hanging under it or under earlier spares."""
    par = torch.full((T,), -1, dtype=torch.long)
    for u in range(1, T):
        par[u] = int(torch.randint(0, u, (1,), generator=g))
    dep = torch.zeros(T, dtype=torch.long)
    for u in range(1, T):
        dep[u] = dep[par[u]] + 1
    tok = torch.randint(0, V, (T,), generator=g)
    sc = -torch.randint(0, 3, (T,), generator=g).float()
    sc[torch.rand(T, generator=g) < 0.1] = float("-inf")
    if nan:
        sc[torch.rand(T, generator=g) < 0.2] = float("nan")
    sc[0] = 0.0
    mask = ancestor_mask(par, int(dep.max())) if T > 1 else torch.ones(1, 1, dtype=torch.bool)
    sp_par = torch.tensor([int(torch.randint(0, T + i, (1,), generator=g)) for i in range(K)], dtype=torch.long)
    sp_dep = torch.tensor([0] * K, dtype=torch.long)
    for i in range(K):
        p = int(sp_par[i])
        sp_dep[i] = (dep[p] if p < T else sp_dep[p - T]) + 1
    spare = DeviceTree(torch.randint(0, V, (K,), generator=g), sp_par, -3 - torch.rand(K, generator=g), sp_dep)
    return DeviceTree(tok, par, sc, dep), mask, 40 + dep, spare


def _grown_tree(T, K, V, seed, order="dfs"):
    """The head's kept tree and spares as a round grows them (`grow_pool`, `grow_spares`) from a
    table of coarse log-probs by (depth, token): ties everywhere."""
    from ssv.spec.device import grow_pool
    for D, k in ((2, 3), (3, 3), (4, 4), (6, 4)):
        spec = TreeSpec(D, k, T + K)
        if spec.total_tokens <= spec.max_nodes:
            break
    g = torch.Generator().manual_seed(seed)
    tab = -torch.randint(0, 4, (D + 1, V, V), generator=g).double() * 0.5
    pool = grow_pool(lambda level, toks, pr, rows: tab[level - 1][toks], torch.tensor(V - 1), tab[0, V - 1], spec)
    return grow_spares(*pool, T, K, k, order, D, torch.tensor([100]))


def _history(S, V, g, kind):
    if kind == "distinct":   # no suffix recurs (nor any token)
        return torch.randperm(S, generator=g) + 10
    hist = torch.randint(0, V, (S,), generator=g)
    if kind == "periodic":   # a repeated phrase: long suffixes recur
        period = int(torch.randint(3, 9, (1,), generator=g))
        hist = hist[:period].repeat(S // period + 1)[:S].clone()
        hist[torch.rand(S, generator=g) < 0.05] = V   # a few breaks
    return hist


def _poisoned(T, K, dev, flag):
    """Output buffers full of values the kernel never writes (the mask all `flag`)."""
    o_tok, o_par, o_sc, o_dep, o_mask, o_pos = lookup_buffers(T, K, dev)
    for x in (o_tok, o_par, o_dep, o_pos):
        x.fill_(-777)
    o_sc.fill_(float("nan") if flag else 1234.5)
    o_mask.fill_(flag)
    return o_tok, o_par, o_sc, o_dep, o_mask, o_pos


def _same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    if a.dtype.is_floating_point:
        assert bool(((a == b) | (a.isnan() & b.isnan())).all()), (a, b)
    else:
        assert torch.equal(a, b), (a, b)


def _compare(hist, length, tree, mask, pos, spare, K, ngrams=(2, 4), block=32, offset=0):
    """The kernel (twice, the same workspace, the buffers poisoned both ways) against the twin; the
    inputs moved to the test's device (compiled on a GPU, the interpreter on the CPU)."""
    dev = DEV
    hist, mask, pos = hist.to(dev), mask.to(dev), pos.to(dev)
    length = length.to(dev) if isinstance(length, torch.Tensor) else length
    tree, spare = (DeviceTree(*(x.to(dev) for x in vars(t).values())) for t in (tree, spare))
    want = lookup_attach_naive(hist, length, tree, mask, pos, spare, K, ngrams, offset)
    best = lookup_workspace(ngrams, dev)
    for flag in (True, False):
        out = _poisoned(tree.n, K, dev, flag)
        got = lookup_attach(hist, length, tree, mask, pos, spare, K, best=best, out=out, ngrams=ngrams,
                            length_offset=offset, block=block)
        assert got[0].tokens is out[0] and got[1] is out[4] and got[2] is out[5]   # written in place
        for x, y in zip(vars(got[0]).values(), vars(want[0]).values()):
            _same(x, y)
        _same(got[1], want[1])
        _same(got[2], want[2])
        assert bool((best == -1).all()), best
    return want


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10 ** 6), st.sampled_from([64, 97, 200]), st.integers(2, 6), st.sampled_from([1, 3, 8]),
       st.sampled_from([1, 5, 13, 47]), st.sampled_from(["random", "periodic", "distinct"]),
       st.sampled_from(["zero", "near_n", "end", "any"]), st.sampled_from([(2, 4), (1, 3), (3, 3)]))
def test_lookup_attach_matches_twin_on_random_trees(seed, S, V, K, T, kind, where, ngrams):
    g = torch.Generator().manual_seed(seed)
    hist = _history(S, V, g, kind)
    span = {"zero": (0, 2), "near_n": (ngrams[0] - 1, ngrams[1] + 2), "end": (S - 3, S), "any": (0, S)}[where]
    length = torch.tensor([int(torch.randint(span[0], span[1] + 1, (1,), generator=g))])
    tree, mask, pos, spare = _random_tree(T, K, V, g, nan=seed % 5 == 0)
    # the chain often starts along the tree: the tree's first path gets the text's next tokens
    if seed % 2 and int(length) > 0:
        at = int(torch.randint(0, max(1, int(length) - K), (1,), generator=g))
        u = 0
        for j in range(K):
            kids = (tree.parents == u).nonzero().flatten()
            if not len(kids):
                break
            u = int(kids[0])
            tree.tokens[u] = hist[min(at + j, S - 1)]
    offset = 0
    if seed % 3 == 0:   # the cache's form: int32 dlen, the text one token longer
        length, offset = (length - 1).int(), 1
    hist, length = hist.to(DEV), length.to(DEV)
    tree, spare = (DeviceTree(*(x.to(DEV) for x in vars(t).values())) for t in (tree, spare))
    _compare(hist, length, tree, mask.to(DEV), pos.to(DEV), spare, K, ngrams, offset=offset)


@pytest.mark.parametrize("T,K,order,seed", [(5, 3, "dfs", 0), (9, 8, "bfs", 1), (4, 1, "pos", 2), (21, 8, "dfs", 3)])
def test_lookup_attach_matches_twin_on_grown_trees(T, K, order, seed):
    """The round's own trees (grow_spares) on a periodic text whose phrases the head also drafts:
    held prefixes, chains under inner nodes, spares kept and displaced."""
    V = 4
    tree, mask, pos, spare = _grown_tree(T, K, V, seed, order)
    g = torch.Generator().manual_seed(seed)
    held = 0
    for i in range(6):
        hist = _history(120, V, g, "periodic" if i % 3 else "random")
        if i % 2:   # the text continues along the tree's first child: the chain's first token held
            hist[:] = torch.tensor([int(tree.tokens[1]), int(tree.tokens[0])] * 60)
        length = torch.tensor([int(torch.randint(90, 121, (1,), generator=g))])
        _compare(hist, length, tree, mask, pos, spare, K)
        toks, valid = context_lookup(hist, length, K)   # the chain's first token under the root: held
        held += bool(valid[0]) and bool((tree.tokens[tree.parents == 0] == toks[0]).any())
    assert held > 0


def test_lookup_attach_tie_rule_nan_and_inf_scores():
    """Siblings with the chain's token: the higher score first, ties to the lower index, -inf scores
    walked when all hits have them; a NaN score among the hits ends the walk (the tensor form's max
    is NaN, which no score equals)."""
    hist = torch.tensor([1, 2, 3, 4, 5, 1, 2, 0, 0])   # suffix 1 2 recurs: the chain 3 4 5
    # root; children 1..4 with token 3; a child with token 4 under each
    par = torch.tensor([-1, 0, 0, 0, 0, 1, 2, 3, 4])
    tok = torch.tensor([2, 3, 3, 3, 3, 4, 4, 4, 4])
    dep = torch.tensor([0, 1, 1, 1, 1, 2, 2, 2, 2])
    spare = DeviceTree(torch.tensor([7, 8, 9]), torch.tensor([0, 9, 10]), torch.tensor([-5.0, -6, -7]),
                       torch.tensor([1, 2, 3]))
    inf, nan = float("-inf"), float("nan")
    for s1 in ([-1.0, -0.5, -0.5, -2.0], [inf, inf, inf, inf], [-1.0, nan, -0.5, -2.0], [inf, -3.0, inf, nan],
               [-0.5, -0.5, -0.5, -0.5]):
        sc = torch.tensor([0.0] + s1 + [-1.0] * 4)
        tree = DeviceTree(tok, par, sc, dep)
        want = _compare(hist, torch.tensor([7]), tree, ancestor_mask(par, 2), 10 + dep, spare, 3)
        if s1[1] != s1[1] or s1[3] != s1[3]:
            assert want[0].parents[9] == 0        # nothing held: the chain under the root
        else:
            assert want[0].parents[9] > 4         # 3 and 4 held: 5 under a depth-2 node


def test_lookup_attach_spares_under_spares():
    """Spares hanging under earlier spares move with the chain's length r (their parents shift by r)
    and the rows of the mask follow them: every r of 0..K."""
    K, T = 8, 4
    par = torch.tensor([-1, 0, 0, 1])
    tok = torch.tensor([9, 9, 8, 9])
    dep = torch.tensor([0, 1, 1, 2])
    tree = DeviceTree(tok, par, torch.tensor([0.0, -1, -2, -3]), dep)
    # spares: a chain of spares under node 2, then two more under spare 0 and node 3
    spare = DeviceTree(torch.arange(20, 28), torch.tensor([2, 4, 5, 6, 4, 3, 9, 10]), -4 - torch.arange(8.0),
                       torch.tensor([2, 3, 4, 5, 3, 3, 4, 5]))
    for n_chain in range(K + 2):
        # the text ends with 7 7 7 (a suffix that occurs earlier, followed by n_chain tokens 30..)
        body = [7, 7, 7] + [30 + i for i in range(n_chain)] + [7, 7, 7]
        hist = torch.tensor(body + [0] * (40 - len(body)))
        want = _compare(hist, torch.tensor([len(body)]), tree, ancestor_mask(par, 2), 5 + dep, spare, K)
        assert (want[0].tokens[T:T + min(n_chain, K)] >= 30).all()


def test_lookup_attach_edges():
    """Tiny buffers (the suffix lengths capped at S - 1, as context_lookup), the whole buffer as the
    text, a found chain cut at the text's end, and a length past the buffer (the clamped reads)."""
    g = torch.Generator().manual_seed(5)
    tree, mask, pos, spare = _random_tree(6, 3, 3, g)
    for S, L in ((1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (16, 16), (16, 20)):
        hist = torch.randint(0, 2, (S,), generator=g)
        for block in (16, 1024):
            _compare(hist, torch.tensor([L]), tree, mask, pos, spare, 3, block=block)
    # 5 6 7 | 8 9 | ... 5 6 7: the chain 8, 9, then the end of the text (one valid token short)
    hist = torch.tensor([5, 6, 7, 8, 9, 5, 6, 7] + [0] * 8)
    want = _compare(hist, torch.tensor([8]), tree, mask, pos, spare, 3)
    assert want[0].tokens[6:].tolist()[:2] == [8, 9]
    # a Python int length and allocated buffers
    hist, mask, pos = hist.to(DEV), mask.to(DEV), pos.to(DEV)
    tree, spare = (DeviceTree(*(x.to(DEV) for x in vars(t).values())) for t in (tree, spare))
    got = lookup_attach(hist, 8, tree, mask, pos, spare, 3)
    assert torch.equal(got[0].tokens, want[0].tokens) and torch.equal(got[1], want[1])


def test_lookup_attach_refuses_bad_inputs():
    g = torch.Generator().manual_seed(1)
    tree, mask, pos, spare = _random_tree(5, 3, 3, g)
    hist, L = torch.randint(0, 3, (32,), generator=g), torch.tensor([20])
    with pytest.raises(ValueError, match="K must be an int in"):
        lookup_attach(hist, L, tree, mask, pos, spare, 0)
    with pytest.raises(ValueError, match="K must be an int in"):
        lookup_attach(hist, L, tree, mask, pos, spare, 17)
    with pytest.raises(ValueError, match="spare.tokens"):
        lookup_attach(hist, L, tree, mask, pos, spare, 2)
    with pytest.raises(ValueError, match="ngrams"):
        lookup_attach(hist, L, tree, mask, pos, spare, 3, ngrams=(3, 2))
    with pytest.raises(ValueError, match="hist"):
        lookup_attach(hist.int(), L, tree, mask, pos, spare, 3)
    with pytest.raises(ValueError, match="length"):
        lookup_attach(hist, torch.tensor([20, 21]), tree, mask, pos, spare, 3)
    with pytest.raises(ValueError, match="length must be int32 or int64"):
        lookup_attach(hist, torch.tensor([20.0]), tree, mask, pos, spare, 3)
    with pytest.raises(ValueError, match="mask"):
        lookup_attach(hist, L, tree, mask[:4], pos, spare, 3)
    with pytest.raises(ValueError, match="tree.scores"):
        lookup_attach(hist, L, DeviceTree(tree.tokens, tree.parents, tree.scores.double(), tree.depth), mask, pos,
                      spare, 3)
    with pytest.raises(ValueError, match="best"):
        lookup_attach(hist, L, tree, mask, pos, spare, 3, best=lookup_workspace((1, 4)))
    big, bmask, bpos, bspare = _random_tree(MAX_NODES - 7, 8, 3, g)
    with pytest.raises(ValueError, match=f"T \\+ K <= {MAX_NODES}"):
        lookup_attach(hist, L, big, bmask, bpos, bspare, 8)
    with pytest.raises(ValueError, match="out mask"):
        lookup_attach(hist, L, tree, mask, pos, spare, 3, out=lookup_buffers(5, 3)[:4] + (mask, pos))
    out = lookup_buffers(5, 3)
    with pytest.raises(ValueError, match="overlap"):
        lookup_attach(hist, L, tree, mask, pos, spare, 3, out=(out[0], out[0]) + out[2:])
    with pytest.raises(ValueError, match="block"):
        lookup_attach(hist, L, tree, mask, pos, spare, 3, block=48)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_lookup_attach_cuda_long_buffer():
    """The compiled kernels on a round's buffer (S = 9000, the default 1024-token blocks) against the
    twin on the GPU; then one CUDA graph of the two launches replayed for other lengths."""
    S = 9000
    for seed in range(12):
        g = torch.Generator().manual_seed(seed)
        T, K, V = (5, 13, 47, 120)[seed % 4], (1, 3, 8, 8)[seed % 4], 2 + seed % 5
        hist = _history(S, V, g, ("random", "periodic", "distinct")[seed % 3]).cuda()
        tree, mask, pos, spare = _random_tree(T, K, V, g, nan=seed == 7)
        tree, spare = (DeviceTree(*(x.cuda() for x in vars(t).values())) for t in (tree, spare))
        for L in (0, 3, 5, 1000, S - 1, S, int(torch.randint(0, S, (1,), generator=g))):
            _compare(hist, torch.tensor([L], device="cuda"), tree, mask.cuda(), pos.cuda(), spare, K, block=1024)
    # the graph: captured at one length, replayed at others (nothing read on the host); the
    # length as the round has it, the cache's int32 dlen one short of the text's
    length = torch.tensor([3999], dtype=torch.int32, device="cuda")
    best, out = lookup_workspace(device="cuda"), lookup_buffers(T, K, "cuda")
    mask, pos = mask.cuda(), pos.cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):   # compiled before the capture
        lookup_attach(hist, length, tree, mask, pos, spare, K, best=best, out=out, length_offset=1)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lookup_attach(hist, length, tree, mask, pos, spare, K, best=best, out=out, length_offset=1)
    for L in (4000, 17, 9000, 1, 2500):
        length.fill_(L - 1)
        for x in out:
            x.fill_(0)
        graph.replay()
        want = lookup_attach_naive(hist, length, tree, mask, pos, spare, K, length_offset=1)
        for x, y in zip((out[0], out[1], out[2], out[3]), vars(want[0]).values()):
            _same(x, y)
        _same(out[4], want[1])
        _same(out[5], want[2])
        assert bool((best == -1).all())
