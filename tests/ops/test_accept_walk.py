"""The greedy tree-walk kernel against its tensor twin (interpreter on the CPU, compiled on a GPU), on
random trees with ties and -inf scores, and against the host `accept_greedy` through the device API."""
import pytest
import torch

from ssv.ops.accept.naive import accept_greedy_walk_naive
from ssv.ops.accept.ops import accept_greedy_walk

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
