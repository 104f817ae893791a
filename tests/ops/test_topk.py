"""The vocabulary top-k kernel against its stable-sort twin (interpreter on the CPU, compiled on a GPU)."""
import pytest
import torch

from ssv.ops.topk.naive import vocab_topk_naive
from ssv.ops.topk.ops import vocab_topk
from ssv.spec.device import _vocab_top

from .test_nsa_kernels import DEV


@pytest.mark.parametrize("r,v,k", [(1, 40, 3), (8, 8192, 8), (5, 1000, 16), (3, 7, 7)])
def test_vocab_topk_matches_stable_sort(r, v, k):
    g = torch.Generator().manual_seed(v + k)
    x = torch.randn(r, v, generator=g).log_softmax(-1)
    x = torch.round(x * 4) / 4                        # many ties: the lower id must come first
    x[:, torch.randperm(v, generator=g)[: v // 3]] = float("-inf")   # ids off the vocabulary
    x = x.to(DEV)
    want_v, want_i = vocab_topk_naive(x, k)
    got_v, got_i = vocab_topk(x, k)
    assert torch.equal(got_i, want_i) and torch.equal(got_v, want_v)
    cpu_v, cpu_i = _vocab_top(x.cpu(), k)               # the torch path the CPU round takes
    assert torch.equal(cpu_i, want_i.cpu())


def test_vocab_topk_orders_signed_zeros_and_extremes_as_a_stable_sort():
    """The kernel ranks by an integer key made from the float's bits: -0.0 and +0.0 must tie (the
    lower id first, whichever zero it holds), negatives order by value and not by their bits, and
    -inf, the smallest normal and subnormal values keep their places."""
    tiny = torch.finfo(torch.float32).tiny
    row = torch.tensor([-0.0, -1.5, 0.0, -tiny, -0.0, float("-inf"), -tiny / 4, -1.25, 0.0, -3e38, tiny / 8])
    x = torch.stack([row, row.flip(0), -row.abs()]).to(DEV)
    for k in (4, row.numel()):
        want_v, want_i = vocab_topk_naive(x, k)
        got_v, got_i = vocab_topk(x, k)
        assert torch.equal(got_i, want_i) and torch.equal(got_v, want_v)


@pytest.mark.parametrize("r,v,k", [(1, 40, 3), (8, 8192, 8), (5, 1000, 16), (3, 7, 7)])
@pytest.mark.parametrize("folded", [False, True])
def test_vocab_topk_of_logits_matches_log_softmax(r, v, k, folded):
    """logits=True: the row's log_softmax taken in the launch, then the same ranking: against the twin
    (float32 log_softmax, stable sort) with ties (logits on a grid of quarters), -inf entries, a large
    offset (what the max subtraction is for), ids mapped and values clamped; folded: each row first
    scaled by another tensor's 1 / rms (a norm folded into the GEMM before; rows of scales 1 to 2^(r-1),
    one factor a row, so its ties stay ties); and `_vocab_top` of `Logits` against `_vocab_top` of
    their log-probs, the CPU's torch path included. Values to 1e-4: the GPU's exp / log are approximate."""
    from ssv.ops.glue.naive import row_rsqrt
    from ssv.spec.device import Logits
    g = torch.Generator().manual_seed(v * 3 + k + folded)
    x = torch.round(torch.randn(r, v, generator=g) * 8) / 4 + 100.0
    x[:, torch.randperm(v, generator=g)[: v // 3]] = float("-inf")
    id_map = torch.randperm(3 * v, generator=g)[:v].sort().values
    xn = torch.randn(r, 24, generator=g) * 2.0 ** torch.arange(r)[:, None] if folded else None
    x, id_map = x.to(DEV), id_map.to(DEV)
    norm = (xn.to(DEV), 1e-6) if folded else None
    want_v, want_i = vocab_topk_naive(x, k, id_map, clamp=True, logits=True, norm=norm)
    got_v, got_i = vocab_topk(x, k, id_map, clamp=True, logits=True, norm=norm)
    assert torch.equal(got_i, want_i)
    torch.testing.assert_close(got_v, want_v, rtol=0, atol=1e-4)
    lp = x.float() * (row_rsqrt(*norm) if folded else 1.0)
    assert torch.equal(want_i, vocab_topk_naive(lp.log_softmax(-1), k, id_map)[1])
    for dev in {x.device, torch.device("cpu")}:
        nd = None if norm is None else (norm[0].to(dev), norm[1])
        a_v, a_i = _vocab_top(Logits(x.to(dev), nd), k, id_map.to(dev), clamp=True)
        b_v, b_i = _vocab_top(lp.to(dev).log_softmax(-1), k, id_map.to(dev), clamp=True)
        assert torch.equal(a_i, b_i)
        torch.testing.assert_close(a_v, b_v, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="norm"):
        vocab_topk(x, k, norm=(torch.ones(r, 24, device=DEV), 1e-6))


def test_vocab_topk_maps_ids_and_clamps():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 300, generator=g)
    x[:, 5] = 0.25                                   # above 0: capped
    id_map = torch.randperm(1000, generator=g)[:300].sort().values
    x, id_map = x.to(DEV), id_map.to(DEV)
    want_v, want_i = vocab_topk_naive(x, 6, id_map, clamp=True)
    got_v, got_i = vocab_topk(x, 6, id_map, clamp=True)
    assert torch.equal(got_i, want_i) and torch.equal(got_v, want_v) and (got_v <= 0).all()
    assert torch.equal(want_i, id_map[vocab_topk_naive(x, 6)[1]])


def test_vocab_topk_refuses_bad_shapes():
    with pytest.raises(ValueError, match="vocab_topk"):
        vocab_topk(torch.zeros(2, 5, device=DEV), 6)
    with pytest.raises(ValueError, match="vocab_topk"):
        vocab_topk(torch.zeros(2, 20000, device=DEV), 4)
    with pytest.raises(ValueError, match="id_map"):
        vocab_topk(torch.zeros(2, 50, device=DEV), 4, torch.arange(49, device=DEV))


@pytest.mark.parametrize("r,n,k", [(1, 64, 8), (1, 327, 47), (3, 1, 1), (2, 700, 700), (4, 48, 48), (5, 33, 5)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int64])
@pytest.mark.parametrize("largest,by_index", [(True, False), (True, True), (False, False)])
def test_rank_topk_matches_stable_sort(r, n, k, dtype, largest, by_index):
    """Ties (rounded values), -inf and NaN entries, odd lengths, k = N; outputs NaN-/sentinel-poisoned
    before the call, so an unwritten slot fails the comparison."""
    from ssv.ops.topk.naive import rank_topk_naive
    from ssv.ops.topk.ops import rank_topk
    g = torch.Generator().manual_seed(n * 7 + k)
    x = torch.round(torch.randn(r, n, generator=g, dtype=torch.float64) * 3)
    if dtype.is_floating_point:
        x[:, torch.randperm(n, generator=g)[: n // 5]] = float("-inf")
        x[:, torch.randperm(n, generator=g)[: n // 7]] = float("nan")
    x = x.to(dtype).to(DEV)
    want_v, want_i = rank_topk_naive(x, k, largest, by_index)
    poison = torch.full_like(want_v, float("nan") if dtype.is_floating_point else -5)
    got_v, got_i = rank_topk(x, k, largest, by_index, out=(poison, torch.full_like(want_i, -1)))
    assert torch.equal(got_i, want_i)
    assert torch.equal(got_v.isnan(), want_v.isnan()) if dtype.is_floating_point else True
    assert torch.equal(torch.nan_to_num(got_v, nan=7.5), torch.nan_to_num(want_v, nan=7.5))


def test_rank_topk_refuses_bad_shapes():
    from ssv.ops.topk.ops import rank_topk
    with pytest.raises(ValueError, match="rank_topk"):
        rank_topk(torch.zeros(2, 5, device=DEV), 6)
    with pytest.raises(ValueError, match="rank_topk"):
        rank_topk(torch.zeros(2, 2000, device=DEV), 4)
    with pytest.raises(ValueError, match="rank_topk"):
        rank_topk(torch.zeros(5, device=DEV), 1)


@pytest.mark.parametrize("r,v", [(1, 49152), (1, 1000), (3, 4097), (48, 49152), (5, 17), (6, 8193)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_argmax_matches_torch(r, v, dtype):
    """row_argmax against torch.argmax on fresh random rows with ties across and within chunks (values on
    a coarse grid, the row's max planted again later), -inf entries, a row of -inf only, NaN in one row
    (the first NaN wins, even over +inf), odd widths (a partial last chunk), both chunk sizes; the
    outputs poisoned first (every row overwritten), out2 a copy, out a view of a larger buffer."""
    from ssv.ops.topk.naive import row_argmax_naive
    from ssv.ops.topk.ops import row_argmax
    g = torch.Generator().manual_seed(r * 7 + v)
    x = torch.round(torch.randn(r, v, generator=g) * 2) / 2
    x[:, torch.randperm(v, generator=g)[: v // 4]] = float("-inf")
    if v > 8:   # the max again at a later column, in another chunk when the row is wide
        x[0, v - 3] = x[0].max()
    if r >= 3:
        x[1] = float("-inf")
        x[2, v // 2] = float("inf")
        x[2, v - 1] = float("nan")
        x[2, v - 2] = float("nan")
    x = x.to(dtype).to(DEV)
    buf = torch.full((r + 2,), -7, dtype=torch.long, device=DEV)
    out2 = torch.full((r,), -7, dtype=torch.long, device=DEV)
    got = row_argmax(x, out=buf[1:r + 1], out2=out2)
    want = row_argmax_naive(x.cpu().float()).to(DEV)
    assert torch.equal(got, want) and torch.equal(out2, want)
    assert buf[0].item() == -7 and buf[-1].item() == -7            # nothing written around the view
    assert torch.equal(row_argmax(x), want)
    if r >= 3:
        assert want[1].item() == 0 and want[2].item() == v - 2


def test_row_argmax_refuses_bad_shapes():
    from ssv.ops.topk.ops import row_argmax
    x = torch.randn(4, 100, device=DEV)
    with pytest.raises(ValueError, match="contiguous rows"):
        row_argmax(x.t())
    with pytest.raises(ValueError, match="V > 0"):
        row_argmax(torch.empty(3, 0, device=DEV))
    with pytest.raises(ValueError, match="out must be"):
        row_argmax(x, out=torch.empty(4, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="out2 must be"):
        row_argmax(x, out2=torch.empty(8, dtype=torch.long, device=DEV)[::2])
