"""The one-launch device commit (`kv_commit`) against its tensor twin (`kv_commit_naive`) and the host
commit: random accepted paths, lengths around compression-block boundaries and the cache's end."""
import pytest
import torch

from ssv.cache import KVCache
from ssv.config import NSAConfig
from ssv.ops.commit.naive import kv_commit_naive
from ssv.ops.commit.ops import kv_commit

from .test_nsa_kernels import DEV

CASES = [  # seed, P, R, n, cmp_block, cmp_stride, nsa
    (0, 0, 1, 1, 8, 4, True), (1, 7, 1, 1, 8, 4, True), (2, 30, 7, 7, 8, 4, True), (3, 45, 7, 3, 16, 8, True),
    (4, 100, 5, 1, 8, 4, True), (5, 61, 9, 9, 32, 16, True), (6, 20, 7, 4, 8, 4, False), (7, 118, 7, 7, 8, 4, True),
]


def _path(R, n, gen, P_room):
    """Root first, strictly increasing scratch offsets for the first n rows, -1 after."""
    picks = torch.randperm(min(P_room, 3 * R), generator=gen)[: n - 1] + 1
    path = torch.full((R,), -1, dtype=torch.long)
    path[0] = 0
    path[1:n] = picks.sort().values
    return path


@pytest.mark.parametrize("case", CASES)
def test_commit_kernel_equals_twin(case):
    seed, P, R, n, l, st, use_nsa = case
    nsa = NSAConfig(cmp_block=l, cmp_stride=st, slc_block=max(16, l), n_select=4, forced_local=1, window=16)
    gen = torch.Generator().manual_seed(seed)
    cache = KVCache(3, 2, 16, max_len=128, scratch=24, nsa=nsa if use_nsa else None, device=DEV)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    cache._cmp.copy_(torch.randn(cache._cmp.shape, generator=gen))
    cache.dlen.fill_(P)
    path = _path(R, n, gen, cache.k.shape[2] - P).to(DEV)
    nt = torch.tensor([n], device=DEV)
    states = []
    for fn in (kv_commit, kv_commit_naive):
        k, v, c, dlen = cache.k.clone(), cache.v.clone(), cache._cmp.clone(), cache.dlen.clone()
        fn(k, v, c, dlen, path, nt, cache.nsa)
        states.append((k, v, c[:, :, :, :-1], dlen))   # the spare block takes the twin's padded writes
    for a, b in zip(*states):
        assert torch.allclose(a.cpu().float(), b.cpu().float(), atol=1e-6, rtol=0), "kernel commit differs"
    assert int(states[0][3]) == P + n
    # the rows moved where the host commit puts them
    want = cache.k[:, :, P + path[:n].cpu()].cpu()
    assert torch.equal(states[0][0][:, :, P:P + n].cpu(), want)


def test_commit_kernel_blocks_match_host_commit():
    """Compressed blocks after device commits equal the host's incremental ones."""
    nsa = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=16, n_select=4, forced_local=1, window=16)
    gen = torch.Generator().manual_seed(11)
    dev_c = KVCache(2, 2, 16, max_len=96, scratch=16, nsa=nsa, device=DEV)
    host = KVCache(2, 2, 16, max_len=96, scratch=16, nsa=nsa, device=DEV)
    for c in (dev_c, host):
        c.k.copy_(torch.randn(c.k.shape, generator=torch.Generator().manual_seed(3)))
        c.v.copy_(torch.randn(c.v.shape, generator=torch.Generator().manual_seed(4)))
    while host.length < 80:
        n = int(torch.randint(1, 6, (1,), generator=gen))
        path = torch.arange(n, device=DEV)
        dev_c.commit_device(torch.cat([path, torch.full((6 - n,), -1, device=DEV)]), torch.tensor([n], device=DEV),
                            kernel=True)
        host.commit(n)
    assert int(dev_c.dlen) == host.length
    nb = host.n_cmp
    assert torch.allclose(dev_c.k_cmp[:, :, :nb].cpu(), host.k_cmp[:, :, :nb].cpu(), atol=1e-6)
    assert torch.allclose(dev_c.v_cmp[:, :, :nb].cpu(), host.v_cmp[:, :, :nb].cpu(), atol=1e-6)


def test_commit_kernel_refuses_bad_shapes():
    k = torch.zeros(2, 2, 8, 12, device=DEV)
    with pytest.raises(ValueError, match="D a power of two"):
        kv_commit(k, k.clone(), None, torch.zeros(1, dtype=torch.int32, device=DEV),
                  torch.zeros(1, dtype=torch.long, device=DEV), torch.ones(1, dtype=torch.long, device=DEV), None)


@pytest.mark.parametrize("P,M,n,L", [(0, 1, 1, 8), (5, 7, 3, 40), (30, 9, 0, 40), (33, 7, 7, 41), (11, 5, 2, 64)])
def test_commit_writes_history_as_twin(P, M, n, L):
    """hist[P + 1 + i] = tokens[i] with the length's advance (one launch after the kernel); P = 33,
    M = 7, L = 41 writes up to the history's last slot exactly."""
    gen = torch.Generator().manual_seed(P * 100 + M)
    cache = KVCache(2, 2, 16, max_len=48, scratch=16, nsa=None, device=DEV)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    tokens = torch.randint(0, 1000, (M,), generator=gen).to(DEV)
    path = _path(M, max(n, 1), gen, 16).to(DEV)
    states = []
    for fn in (kv_commit, kv_commit_naive):
        hist = torch.full((L,), -7, dtype=torch.long, device=DEV)
        k, v, dlen = cache.k.clone(), cache.v.clone(), torch.tensor([P], dtype=torch.int32, device=DEV)
        fn(k, v, None, dlen, path, torch.tensor([n], device=DEV), None, hist, tokens)
        states.append((k, v, dlen, hist))
    for a, b in zip(*states):
        assert torch.equal(a, b)
    want = torch.full((L,), -7, dtype=torch.long)
    want[P + 1:P + 1 + M] = tokens.cpu()
    assert torch.equal(states[0][3].cpu(), want) and int(states[0][2]) == P + n


def test_commit_refuses_bad_history_before_any_write():
    k = torch.randn(2, 2, 8, 16, device=DEV)
    v, dlen, before = k.clone(), torch.zeros(1, dtype=torch.int32, device=DEV), k.clone()
    path = torch.tensor([0, 3], device=DEV)   # would move row 3 to row 1
    two = torch.tensor([2], device=DEV)
    for hist, tokens in ((torch.zeros(8, dtype=torch.int32, device=DEV), two),
                         (torch.zeros(8, dtype=torch.long, device=DEV), None),
                         (torch.zeros(8, dtype=torch.long, device=DEV), two.float())):
        with pytest.raises(ValueError, match="hist and tokens"):
            kv_commit(k, v, None, dlen, path, two, None, hist, tokens)
        assert torch.equal(k, before) and torch.equal(v, before) and int(dlen) == 0
