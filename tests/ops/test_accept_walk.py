"""The greedy tree-walk kernel against its tensor twin (interpreter on the CPU, compiled on a GPU), on
random trees with ties and -inf scores, and against the host `accept_greedy` through the device API."""
import pytest
import torch

from ssv.ops.accept.naive import accept_greedy_round_naive, accept_greedy_walk_naive
from ssv.ops.accept.ops import accept_greedy_round, accept_greedy_walk

from .test_nsa_kernels import DEV


def _tree(t, seed):
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((t,), -1, dtype=torch.long)
    for u in range(1, t):
        parents[u] = torch.randint(0, u, (1,), generator=g)
    tokens = torch.randint(0, 4, (t,), generator=g)          # few tokens: siblings share them
    scores = -torch.randint(0, 3, (t,), generator=g).double()   # ties between siblings
    scores[torch.rand(t, generator=g) < 0.1] = float("-inf")
    best = torch.randint(0, 4, (t,), generator=g)
    return parents, tokens, scores, best


@pytest.mark.parametrize("t,d,seed", [(1, 3, 0), (9, 4, 1), (48, 6, 2), (48, 6, 3), (130, 9, 4), (33, 2, 5)])
def test_accept_walk_kernel_matches_twin(t, d, seed):
    for i in range(4):
        p, k, s, b = (x.to(DEV) for x in _tree(t, seed * 10 + i))
        want = accept_greedy_walk_naive(p, k, s, b, d)
        got = accept_greedy_walk(p, k, s, b, d)
        for x, y in zip(got, want):
            assert torch.equal(x, y)
        assert got[0].shape == (d + 1,) and int(got[1]) >= 1


def test_accept_walk_refuses_bad_shapes():
    z = torch.zeros(5, dtype=torch.long, device=DEV)
    with pytest.raises(ValueError, match="accept_greedy_walk"):
        accept_greedy_walk(z, z[:4], z.double(), z, 3)


@pytest.mark.parametrize("t,d,seed", [(1, 3, 0), (9, 4, 1), (48, 6, 2), (48, 6, 3), (130, 9, 4), (33, 2, 5)])
def test_accept_round_record_matches_twin(t, d, seed):
    hits = 0
    for i in range(6):
        p, k, s, b = (x.to(DEV) for x in _tree(t, seed * 10 + i))
        if i % 2:
            b = k.clone()          # the target agrees everywhere: long paths, the bonus at a leaf
        outs = []
        for fn in (accept_greedy_round, accept_greedy_round_naive):
            # the record's buffers poisoned (a view into a larger record, as the engine's)
            rec = torch.full((d + 4,), -777, dtype=torch.long, device=DEV)
            bonus = torch.full((1,), -777, dtype=torch.long, device=DEV)
            path, rows = fn(p, k, s, b, d, rec[0:1], rec[1:d + 2], bonus)
            outs.append((path, rows, rec, bonus))
        for x, y in zip(*outs):
            assert torch.equal(x, y)
        path, rows, rec, bonus = outs[0]
        assert (rec[d + 2:] == -777).all() and (rec[:d + 2] != -777).all() and int(bonus) != -777
        walk = accept_greedy_walk_naive(p, k, s, b, d)
        assert torch.equal(path, walk[0]) and torch.equal(rec[0:1], walk[1]) and torch.equal(bonus, walk[2])
        n = int(rec[0])
        assert int(rec[n]) == int(bonus) and torch.equal(rows, path.clamp_min(0))
        hits += n > 1
    assert hits > 0 or t == 1


def test_accept_round_refuses_bad_buffers():
    z = torch.zeros(5, dtype=torch.long, device=DEV)
    with pytest.raises(ValueError, match="nxt"):
        accept_greedy_round(z, z, z.double(), z, 3, z[:1], z[:3], z[:1])
    with pytest.raises(ValueError, match="length"):
        accept_greedy_round(z, z, z.double(), z, 3, z[:1].int(), z[:4], z[:1])
