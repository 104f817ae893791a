"""Dense tree verification (`ssv.ops.dense.dense_verify`) against the fp32 reference `dense_naive`.

CPU: Triton's interpreter, fp32 inputs. GPU: compiled, bf16 / fp16 inputs against the reference on the
same rounded inputs (METHOD.md: bf16 relative error below 1e-2); a captured graph replays at other lengths.
"""
import pytest
import torch

from ssv.ops.dense import dense_naive, dense_verify
from ssv.ops.dense.policy import merge_chunk, plan_dense

from .test_nsa_kernels import CUDA, DEV, DTYPES, rand_tree, rel_err, tol

CASES = [
    # seed, P, N, Hkv, G, D, n_split, chain
    (0, 150, 7, 2, 3, 16, None, False),
    (1, 0, 5, 1, 4, 32, 3, False),       # no prefix: the step's tokens alone
    (2, 301, 9, 3, 1, 64, 2, False),
    (3, 37, 12, 2, 2, 16, 1, True),      # one split, a chain (causal)
    (4, 900, 48, 1, 3, 64, None, False),  # the default model's GQA group, a 48-node tree
    (5, 513, 1, 2, 4, 128, 5, False),    # one query (the AR step), the Llama head dim
    (6, 200, 33, 1, 16, 16, 7, False),   # rows past one tile: 33 x 16
    (7, 64, 3, 2, 5, 32, 40, False),     # more splits asked than tiles: clamped
    (8, 2100, 4, 1, 2, 16, 20, False),   # 17 + 1 states merged in one tile
    (9, 2600, 2, 1, 2, 128, 40, False),  # 40 + 1 states of 128 merged 32 at a time (policy.merge_chunk)
]


def make_case(seed, P, N, hkv, G, D, dtype, chain, extra=3, fill=float("nan")):
    gen = torch.Generator().manual_seed(seed)
    L = P + N + extra
    k = torch.randn(hkv, L, D, generator=gen).to(dtype)
    v = torch.randn(hkv, L, D, generator=gen).to(dtype)
    k[:, P + N:], v[:, P + N:] = fill, fill
    q = torch.randn(N, hkv * G, D, generator=gen).to(dtype)
    depth, mask = rand_tree(N, gen, chain)
    return q, k, v, P + depth, mask


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_dense_verify_matches_reference(case, dtype, tma):
    seed, P, N, hkv, G, D, ns, chain = case
    q, k, v, pos, mask = make_case(seed, P, N, hkv, G, D, dtype, chain)
    ref = dense_naive(q.float(), k.float(), v.float(), P, pos, mask)
    out = torch.full_like(q, float("nan")).to(DEV)   # every row must be written
    o = dense_verify(q.to(DEV), k.to(DEV), v.to(DEV), P, mask.to(DEV), out=out, n_split=ns, tma=tma)
    assert o.data_ptr() == out.data_ptr() and o.dtype == q.dtype
    assert rel_err(o, ref) < tol(dtype)


@pytest.mark.parametrize("tma", [False, True])
def test_dense_verify_reads_the_length_from_device_memory(tma):
    """A prefix length in device memory: the launch is sized for the cache's capacity (the same grid at
    every length, as a captured graph needs) and the cache's slots past the step hold large finite
    keys / values that must not leak in; the same launch at three lengths equals the reference each time."""
    dtype = DTYPES[0]
    q, k, v, pos, mask = make_case(11, 0, 6, 2, 3, 32, dtype, False, extra=400, fill=0.0)
    gen = torch.Generator().manual_seed(12)
    k.copy_(torch.randn(k.shape, generator=gen).to(dtype) * 30)
    v.copy_(torch.randn(v.shape, generator=gen).to(dtype) * 30)
    cap = k.shape[1]
    grids = {plan_dense(6, 6, 2, 32, cap - 6, 4)[1]}
    for P in (0, 97, 300):
        kp, vp = k.clone(), v.clone()
        kp[:, P:P + 6] = torch.randn(2, 6, 32, generator=gen).to(dtype)   # the step's own tokens
        ref = dense_naive(q.float(), kp.float(), vp.float(), P, P + pos, mask)
        plen = torch.tensor([P], dtype=torch.int32, device=DEV)
        out = torch.full_like(q, float("nan")).to(DEV)
        dense_verify(q.to(DEV), kp.to(DEV), vp.to(DEV), plen, mask.to(DEV), out=out, n_split=3, tma=tma)
        assert rel_err(out, ref) < tol(dtype)
    assert len(grids) == 1


def test_dense_verify_tree_mask_is_read():
    """Queries of two sibling branches: flipping one visibility bit changes exactly that query's rows."""
    dtype = DTYPES[0]
    q, k, v, pos, mask = make_case(13, 40, 5, 1, 2, 16, dtype, False)
    base = dense_verify(q.to(DEV), k.to(DEV), v.to(DEV), 40, mask.to(DEV), n_split=2)
    i = int(mask.sum(1).argmax())             # a query with at least one ancestor
    j = int(mask[i].nonzero()[0])
    flipped = mask.clone()
    flipped[i, j] = False
    got = dense_verify(q.to(DEV), k.to(DEV), v.to(DEV), 40, flipped.to(DEV), n_split=2)
    ref = dense_naive(q.float(), k.float(), v.float(), 40, pos, flipped, check=False)
    assert rel_err(got, ref) < tol(dtype)
    changed = (got.float() - base.float()).abs().amax((1, 2)) > 0
    assert changed.tolist() == [r == i for r in range(5)]


@pytest.mark.parametrize("bad, msg", [
    (dict(d=48), "head dim 48"),
    (dict(n=129), "1..128 queries"),
    (dict(mask_n=4), "tree mask"),
    (dict(hkv=3), "query heads"),
    (dict(P=100), "cannot hold prefix"),
])
def test_dense_verify_rejects_unsupported_shapes(bad, msg):
    n, d, hkv, P = bad.get("n", 5), bad.get("d", 16), bad.get("hkv", 2), bad.get("P", 10)
    q = torch.randn(n, 4, d, device=DEV)
    k = torch.randn(hkv, 40 if n < 100 else 200, d, device=DEV)
    mask = torch.ones(bad.get("mask_n", n), bad.get("mask_n", n), dtype=torch.bool, device=DEV).tril()
    with pytest.raises(ValueError, match=msg):
        dense_verify(q, k, k.clone(), P, mask)


def test_dense_plan_sizes_from_the_capacity_only():
    """Splits and tiles depend on the shapes and the capacity, at least one split, never more than tiles."""
    lp, grid = plan_dense(48, 32, 8, 128, 65536 + 208, 132)
    assert (lp.bm, lp.n_tiles, grid[:2]) == (64, 3, (3, 8)) and grid[2] == lp.n_split + 1 >= 2
    assert plan_dense(1, 4, 4, 16, 10, 132, n_split=99)[0].n_split == 1
    assert plan_dense(1, 32, 8, 128, 0, 132)[0].n_split == 1
    assert plan_dense(48, 9, 3, 64, 8192, 132)[0].bm == 64
    # the L2 prefetch where the launch is latency-bound: one row tile, or few key tiles a split
    assert lp.pf == 0 and plan_dense(1, 32, 8, 128, 65536 + 208, 132)[0].pf == 64
    assert plan_dense(48, 9, 3, 64, 4096 + 208, 132)[0].pf == 128
    # the merge loads all splits' values at once up to 4,096 elements, in chunks beyond
    assert (merge_chunk(64, 64), merge_chunk(64, 128), merge_chunk(16, 128), merge_chunk(8, 1024)) == (64, 32, 16, 4)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_dense_verify_graph_replay_equals_eager_at_other_lengths():
    q, k, v, pos, mask = make_case(21, 0, 48, 2, 4, 128, torch.bfloat16, False, extra=3000, fill=0.0)
    q, k, v, mask = q.cuda(), k.cuda().normal_(), v.cuda().normal_(), mask.cuda()
    plen = torch.tensor([100], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    dense_verify(q, k, v, plen, mask, out=out)   # compiles outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dense_verify(q, k, v, plen, mask, out=out)
    for P in (100, 1500, 2900):
        plen.fill_(P)
        g.replay()
        eager = dense_verify(q, k, v, plen.clone(), mask)   # the same launch, not captured
        assert torch.equal(out, eager)
        ref = dense_naive(q.float(), k.float(), v.float(), P, P + torch.zeros(48, dtype=torch.long, device="cuda"),
                          mask, check=False)
        assert rel_err(out, ref) < 1e-2


def test_dense_verify_row_stride_past_the_head_dim():
    """Keys and values as a view with a row stride past D (17 of 16 elements): pointer loads read them right,
    and tensor descriptors, which need 16-byte aligned row strides, are refused with a clear error."""
    dtype = DTYPES[0]
    q, k, v, pos, mask = make_case(31, 90, 4, 2, 2, 16, dtype, False)
    k17 = torch.zeros(2, k.shape[1], 17, dtype=dtype)
    v17 = torch.zeros_like(k17)
    k17[..., :16], v17[..., :16] = k, v
    kv, vv = k17.to(DEV)[..., :16], v17.to(DEV)[..., :16]
    ref = dense_naive(q.float(), k.float(), v.float(), 90, pos, mask)
    assert rel_err(dense_verify(q.to(DEV), kv, vv, 90, mask.to(DEV), tma=False), ref) < tol(dtype)
    with pytest.raises(ValueError, match="16-byte aligned"):
        dense_verify(q.to(DEV), kv, vv, 90, mask.to(DEV), tma=True)
