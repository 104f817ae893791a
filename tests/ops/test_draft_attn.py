"""The draft level's and the commit rows' attention kernel against their tensor twins (interpreter on the
CPU, compiled on a GPU)."""
import pytest
import torch

from ssv.ops.draft_attn.naive import draft_attn_naive, draft_attn_rows_naive
from ssv.ops.draft_attn.ops import draft_attn, draft_attn_rows

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


@pytest.mark.parametrize("r,hq,hkv,d,W,used,dlen,n", [
    (7, 9, 3, 64, 512, 512, 4100, 3),        # the default head's commit of a depth-6 path, a full ring
    (7, 9, 3, 64, 512, 512, 4100, 7),        # every row real
    (4, 4, 2, 16, 5, 5, 40, 1),              # a window shorter than the ring's span: each row sees fewer
    (3, 8, 8, 32, 100, 37, 37, 2),           # a ring not yet full
    (5, 4, 2, 8, 20, 0, 0, 5),               # an empty ring (the first commit): rows see only rows
])
def test_draft_attn_rows_matches_naive(r, hq, hkv, d, W, used, dlen, n):
    g = torch.Generator().manual_seed(r + W + n)
    q = torch.randn(r, hq, d, generator=g)
    kr, vr = (torch.randn(W + 1, hkv, d, generator=g) for _ in range(2))
    kn, vn = (torch.randn(r, hkv, d, generator=g) for _ in range(2))
    ring = torch.full((W + 1,), -1, dtype=torch.long)
    p = torch.arange(dlen - used, dlen)
    ring[p % W] = p
    q, kr, vr, kn, vn, ring = (t.to(DEV) for t in (q, kr, vr, kn, vn, ring))
    dl, nn = torch.tensor([dlen], device=DEV), torch.tensor([n], device=DEV)
    want = draft_attn_rows_naive(q.float(), kr.float(), vr.float(), ring, kn.float(), vn.float(), dl, nn, W)
    got = draft_attn_rows(q.to(DT), kr.to(DT), vr.to(DT), ring, kn.to(DT), vn.to(DT), dl, nn, W)
    assert got.dtype == DT and not got.isnan().any()
    torch.testing.assert_close(got.float(), want, **TOL)
    # the rows past n only see themselves among the new rows: changing a padded row's k / v moves
    # only that row's output
    if n < r:
        kn2 = kn.clone()
        kn2[n:] = torch.randn(r - n, hkv, d, generator=g).to(DEV)
        got2 = draft_attn_rows(q.to(DT), kr.to(DT), vr.to(DT), ring, kn2.to(DT), vn.to(DT), dl, nn, W)
        assert torch.equal(got2[:n], got[:n]) and not torch.equal(got2[n:], got[n:])


def test_draft_attn_rows_equals_the_drafters_commit_visibility():
    """The naive twin is the visibility `commit_rows` builds as tensors."""
    r, W, dlen, n = 6, 8, 21, 4
    ring = torch.full((W,), -1, dtype=torch.long)
    p = torch.arange(dlen - W, dlen)
    ring[p % W] = p
    pos = dlen + torch.arange(r)
    real = torch.arange(r) < n
    vis_ring = (ring[None] >= 0) & (ring[None] > pos[:, None] - W)
    vis_new = ((pos[None] <= pos[:, None]) & real[None]) | torch.eye(r, dtype=torch.bool)
    # one-hot values: o[i] over the visible keys' values is uniform, so the visible set shows in o
    q = torch.zeros(r, 1, 16)
    k = torch.zeros(W, 1, 16)
    v = torch.eye(W + r, 16).reshape(W + r, 1, 16)          # W + r <= 16: value s is one-hot at s
    o = draft_attn_rows_naive(q, k, v[:W], ring, torch.zeros(r, 1, 16), v[W:], torch.tensor([dlen]),
                              torch.tensor([n]), W)
    vis = torch.cat([vis_ring, vis_new], 1).float()
    torch.testing.assert_close(o[:, :W + r], vis / vis.sum(1, keepdim=True))


def test_draft_attn_rows_refuses_more_rows_than_the_window():
    q = torch.zeros(5, 2, 16, device=DEV)
    kr = torch.zeros(4, 1, 16, device=DEV)
    kn = torch.zeros(5, 1, 16, device=DEV)
    one = torch.ones(1, dtype=torch.long, device=DEV)
    with pytest.raises(ValueError, match="window"):
        draft_attn_rows(q, kr, kr, torch.zeros(4, dtype=torch.long, device=DEV), kn, kn, one, one, 4)


@pytest.mark.parametrize("splits", [1, 2, 3, 100])
def test_draft_attn_any_number_of_window_splits_matches_naive(splits):
    """The window cut into 1, 2, 3 or more splits than tiles (capped at one tile each): the merge of
    the splits' partial states is the whole window's softmax, for the level and the commit rows."""
    q, kr, vr, ring, ks, vs, path, dl = _case(3, 4, 2, 16, 70, 4, 3, 60, 500, splits)
    want = draft_attn_naive(q, kr, vr, ring, ks, vs, path, dl, 3, 70)
    got = draft_attn(q.to(DT), kr.to(DT), vr.to(DT), ring, ks.to(DT), vs.to(DT), path, dl, 3, 70, splits=splits)
    torch.testing.assert_close(got.float(), want, **TOL)
    kn, vn, nn = ks[:3], vs[:3], torch.tensor([2], device=DEV)
    want = draft_attn_rows_naive(q, kr, vr, ring, kn, vn, dl, nn, 70)
    got = draft_attn_rows(q.to(DT), kr.to(DT), vr.to(DT), ring, kn.to(DT), vn.to(DT), dl, nn, 70, splits=splits)
    torch.testing.assert_close(got.float(), want, **TOL)


@pytest.mark.parametrize("window,bk,splits", [(512, 64, 8), (512, 64, 3), (70, 64, 8), (3, 16, 1), (100, 16, 4),
                                              (1000, 64, 7), (64, 64, 2)])
def test_window_splits_cover_every_tile_once_with_none_empty(window, bk, splits):
    from ssv.ops.draft_attn.policy import window_splits
    ns, tps = window_splits(window, bk, splits)
    tiles = -(-window // bk)
    assert 1 <= ns <= splits and ns * tps >= tiles and (ns - 1) * tps < tiles


def test_window_splits_refuses_nonsense():
    from ssv.ops.draft_attn.policy import window_splits
    with pytest.raises(ValueError, match="window_splits"):
        window_splits(512, 64, 0)
