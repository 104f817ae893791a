"""The drafter's one-launch ring commit (`ring_commit`) against its tensor twin (`ring_commit_naive`):
random rows, ring wrap-around, no / every row accepted, odd head sizes, NaN-filled state."""
import pytest
import torch

from ssv.ops.ring_commit.naive import ring_commit_naive
from ssv.ops.ring_commit.ops import ring_commit

from .test_nsa_kernels import DEV, DTYPES

CASES = [  # seed, window, R, n, P (committed rows before), Hkv, D, H
    (0, 8, 1, 1, 0, 1, 64, 64), (1, 8, 8, 8, 5, 3, 64, 576), (2, 7, 5, 3, 12, 2, 48, 40),
    (3, 16, 9, 0, 30, 3, 64, 96), (4, 5, 5, 5, 4, 1, 16, 33), (5, 12, 7, 1, 1000, 2, 32, 200),
]


def _state(seed, window, R, hkv, d, h, dtype, poison):
    gen = torch.Generator().manual_seed(seed)
    def rnd(*s):
        return torch.randn(*s, generator=gen).to(dtype)
    ring = [rnd(window + 1, hkv, d), rnd(window + 1, hkv, d)]
    if poison:   # never read by the twin or the kernel before they write it, except the spare slot
        ring[0][:window // 2] = float("nan")
    slot_pos = torch.randint(-1, 50, (window + 1,), generator=gen)
    new = [rnd(R, hkv, d), rnd(R, hkv, d), rnd(R, h)]
    hid = torch.full((h,), float("nan"), dtype=dtype) if poison else rnd(h)
    return [t.to(DEV) for t in (*ring, slot_pos, *new, hid)]


@pytest.mark.parametrize("poison", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_ring_commit_equals_twin(case, poison):
    seed, window, R, n, P, hkv, d, h = case
    dtype = DTYPES[0]
    outs = []
    for fn in (ring_commit_naive, ring_commit):
        k_ring, v_ring, slot_pos, k_new, v_new, x, hid = _state(seed, window, R, hkv, d, h, dtype, poison)
        dlen = torch.tensor([P], device=DEV)
        fn(k_new, v_new, k_ring, v_ring, slot_pos, x, hid, torch.tensor([n], device=DEV), dlen, window)
        outs.append((k_ring, v_ring, slot_pos, hid, dlen))
    (k0, v0, s0, h0, d0), (k1, v1, s1, h1, d1) = outs
    # the spare slot (padded rows) holds whichever padded row came last: never read
    assert torch.allclose(k0[:window], k1[:window], equal_nan=True)
    assert torch.allclose(v0[:window], v1[:window], equal_nan=True)
    assert torch.equal(s0, s1)
    assert torch.equal(h0, h1)
    assert d0.item() == d1.item() == P + n
    for r in range(n):   # position P + r at slot (P + r) % window
        assert s1[(P + r) % window].item() == P + r
    assert s1[window].item() == (-1 if n < R else s0[window].item())


def test_ring_commit_rows_are_the_new_ones():
    # independent of the twin: every real row's keys and values at its slot, the others untouched
    window, R, n, P = 6, 4, 3, 4
    k_ring, v_ring, slot_pos, k_new, v_new, x, hid = _state(9, window, R, 2, 16, 24, DTYPES[0], False)
    before = k_ring.clone(), v_ring.clone(), slot_pos.clone()
    ring_commit(k_new, v_new, k_ring, v_ring, slot_pos, x, hid, torch.tensor([n], device=DEV),
                torch.tensor([P], device=DEV), window)
    written = {(P + r) % window: r for r in range(n)}
    for s in range(window):
        r = written.get(s)
        assert torch.equal(k_ring[s], before[0][s] if r is None else k_new[r])
        assert torch.equal(v_ring[s], before[1][s] if r is None else v_new[r])
        assert slot_pos[s].item() == (before[2][s].item() if r is None else P + r)
    assert torch.equal(hid, x[n - 1])


def test_ring_commit_refuses_bad_shapes():
    k_ring, v_ring, slot_pos, k_new, v_new, x, hid = _state(0, 4, 3, 2, 16, 24, DTYPES[0], False)
    n, dlen = torch.tensor([1], device=DEV), torch.tensor([0], device=DEV)
    with pytest.raises(ValueError, match="rows"):           # more rows than the ring's window
        ring_commit(k_new, v_new, k_ring, v_ring, slot_pos, x, hid, n, dlen, 2)
    with pytest.raises(ValueError, match="window \\+ 1"):
        ring_commit(k_new, v_new, k_ring[:4], v_ring[:4], slot_pos, x, hid, n, dlen, 4)
    with pytest.raises(ValueError, match="x must be"):
        ring_commit(k_new, v_new, k_ring, v_ring, slot_pos, x[:2], hid, n, dlen, 4)
    with pytest.raises(ValueError, match="int64"):
        ring_commit(k_new, v_new, k_ring, v_ring, slot_pos, x, hid, n, dlen.int(), 4)
    with pytest.raises(ValueError, match="Hkv, D"):
        ring_commit(k_new, v_new[:, :1], k_ring, v_ring, slot_pos, x, hid, n, dlen, 4)
