"""The draft level's attention kernel against its tensor twin (interpreter on the CPU, compiled on a GPU)."""
import pytest
import torch

from ssv.ops.draft_attn.naive import draft_attn_naive
from ssv.ops.draft_attn.ops import draft_attn

from .test_nsa_kernels import DEV, DTYPES

DT = DTYPES[0]
TOL = dict(rtol=1e-4, atol=1e-4) if DT == torch.float32 else dict(rtol=3e-2, atol=3e-2)


def _case(f, hq, hkv, d, W, depth, level, used, dlen, seed):
    g = torch.Generator().manual_seed(seed)
    rows = max(1, (depth - 1) * f)
    q = torch.randn(f, hq, d, generator=g)
    kr, vr = (torch.randn(W + 1, hkv, d, generator=g) for _ in range(2))
    ks, vs = (torch.randn(rows, hkv, d, generator=g) for _ in range(2))
    # ring slots hold positions dlen - used .. dlen - 1 (slot = position % W), the rest empty
    ring = torch.full((W + 1,), -1, dtype=torch.long)
    p = torch.arange(dlen - used, dlen)
    ring[p % W] = p
    # paths as grow_tree lays them out: the ancestor at depth j + 1 in row j * F + r (r < F), the
    # node's own row (level - 2) * F + f last, -1 after
    path = torch.full((f, depth), -1, dtype=torch.long)
    for j in range(level - 2):
        path[:, j] = j * f + torch.randint(0, f, (f,), generator=g)
    path[:, level - 2] = (level - 2) * f + torch.arange(f)
    dl = torch.tensor([dlen])
    return [t.to(DEV) for t in (q, kr, vr, ring, ks, vs, path, dl)]


@pytest.mark.parametrize("f,hq,hkv,d,W,depth,level,used,dlen", [
    (8, 9, 3, 64, 512, 6, 4, 512, 4100),     # the default head's shape, a full ring
    (3, 4, 2, 16, 3, 5, 5, 3, 40),           # a window shorter than the path: the oldest ancestor drops out
    (5, 8, 8, 32, 100, 5, 2, 37, 37),        # a ring not yet full, level 2 (the path is the node itself)
    (1, 2, 1, 16, 70, 3, 3, 70, 1000),       # one query, a ring that is not a multiple of the tile
    (3, 4, 2, 8, 20, 4, 3, 20, 25),          # a head dim below the dot's 16 (the tests' tiny head)
])
def test_draft_attn_matches_naive(f, hq, hkv, d, W, depth, level, used, dlen):
    q, kr, vr, ring, ks, vs, path, dl = _case(f, hq, hkv, d, W, depth, level, used, dlen, f + W + level)
    want = draft_attn_naive(q.float(), kr.float(), vr.float(), ring, ks.float(), vs.float(), path, dl, level, W)
    got = draft_attn(q.to(DT), kr.to(DT), vr.to(DT), ring, ks.to(DT), vs.to(DT), path, dl, level, W)
    assert got.dtype == DT and not got.isnan().any()
    torch.testing.assert_close(got.float(), want, **TOL)


def test_draft_attn_reads_the_length_on_the_device():
    """A later length (same tensors otherwise) moves the window: the kernel must see it."""
    q, kr, vr, ring, ks, vs, path, dl = _case(4, 4, 2, 16, 16, 4, 3, 16, 50, 0)
    a = draft_attn(q, kr, vr, ring, ks, vs, path, dl, 3, 16)
    dl.fill_(53)                                    # three ring slots fall out of the window
    b = draft_attn(q, kr, vr, ring, ks, vs, path, dl, 3, 16)
    torch.testing.assert_close(b.float(), draft_attn_naive(q, kr, vr, ring, ks, vs, path, dl, 3, 16), **TOL)
    assert (a - b).abs().max() > 1e-3


def test_draft_attn_refuses_bad_shapes():
    q, kr, vr, ring, ks, vs, path, dl = _case(2, 4, 2, 16, 8, 3, 2, 8, 20, 1)
    with pytest.raises(ValueError, match="draft_attn"):
        draft_attn(q[:, :3], kr, vr, ring, ks, vs, path, dl, 2, 8)          # Hq not a multiple of Hkv
    with pytest.raises(ValueError, match="draft_attn"):
        draft_attn(q, kr, vr, ring, ks, vs, path, dl, 2, 16)                # a window past the ring
    with pytest.raises(ValueError, match="draft_attn"):
        draft_attn(q, kr, vr, ring, ks, vs, path[:1], dl, 2, 8)


def test_draft_attn_never_reads_what_it_cannot_see():
    """NaN in every ring slot outside the window, the spare slot and every scratch row off the
    nodes' paths (a sibling branch's rows): the output is finite and unchanged."""
    q, kr, vr, ring, ks, vs, path, dl = _case(4, 4, 2, 16, 40, 5, 4, 25, 60, 3)
    want = draft_attn(q, kr, vr, ring, ks, vs, path, dl, 4, 40)
    pos = int(dl) - 1 + 3
    hidden = (ring < 0) | (ring <= pos - 40)
    hidden[40:] = True
    off_path = torch.ones(ks.shape[0], dtype=torch.bool, device=ks.device)
    off_path[path[path >= 0]] = False
    assert hidden.any() and off_path.any()
    for t, m in ((kr, hidden), (vr, hidden), (ks, off_path), (vs, off_path)):
        t[m] = float("nan")
    got = draft_attn(q, kr, vr, ring, ks, vs, path, dl, 4, 40)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want)
