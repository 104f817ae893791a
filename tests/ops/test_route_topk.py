"""The routing top-n (one packed-key top-k) on importance full of exact ties, negative and -inf
scores, forced blocks (as many as n too) and fewer candidates than n, and on distinct scores (the
bisection's early stop and its bracket from the row's largest finite key): the reference's
selection, ties to the lower block."""
import pytest
import torch

from ssv.config import NSAConfig
from ssv.ops.nsa.naive import select_blocks
from ssv.ops.nsa.route_split_kernels import nsa_route_merge_topk_fwd_kernel, nsa_route_topk_fwd_kernel
from ssv.ops.utils import pow2

from .test_nsa_kernels import CUDA, DEV


ROWS = [(0, 4, 13, 3), (1, 16, 70, 2), (2, 5, 9, 1), (3, 16, 300, 5), (4, 3, 2, 2), (5, 16, 300, 0), (6, 7, 130, 0),
        (7, 2, 40, 0),    # as many forced blocks as n
        (8, 5, 300, -1), (9, 16, 70, -2), (10, 7, 130, -2)]   # rows built for the bisection's tail tile
FORMS = [(qc, srt, False, merge) for qc in (1, 4) for srt in (True, False) for merge in (False, True)] + [
    (1, False, True, False), (4, False, True, False), (8, False, True, False)]


@pytest.mark.parametrize("seed,nsel,nbs,levels,qc,srt,tail,merge",
                         [r + f for r in ROWS for f in FORMS if r[3] >= 0 or not f[1]])
def test_topk_kernel_takes_tie_broken_top_n(seed, nsel, nbs, levels, qc, srt, tail, merge):
    """Both selections: the bitonic top-k (short rows) and the bisection (long rows), the latter
    also over a row split into a power-of-two tile and a tail tile (the row's last blocks, where the
    forced local ones and the widest candidates fall); both top-n launches: the two-sweep one reads
    the importance, the one-sweep one first merges per-head sums (whole rows only: route_policy)."""
    cfg = NSAConfig(cmp_block=16, cmp_stride=16, slc_block=16, n_select=nsel, forced_local=1, window=16)
    gen = torch.Generator().manual_seed(seed)
    n, hkv = 6, 2
    # with cmp = slc blocks of 16 (R = A = 1) a selection block's importance is one committed entry:
    # few distinct values (levels), some negative, so most comparisons are exact ties
    nb = nbs
    psum = (torch.randint(0, max(levels, 1), (n, hkv, nb), generator=gen).float() - (levels // 2)) * 0.25
    if levels == 0:   # distinct values: the bisection stops at a threshold with exactly n above it
        psum = torch.rand(n, hkv, nb, generator=gen) ** 4
        psum[1, 0, 5:9] = psum[1, 0, 9]   # one row with a tie, beside rows without
    if levels == -1:   # the largest scores in the row's last blocks (a tail tile's), a few ties
        noise = torch.randint(0, 3, (n, hkv, nb), generator=gen) * 0.01
        psum = (torch.arange(nb).float() / nb + noise).round(decimals=2)
    if levels == -2:   # two levels: ties that overflow n across a tail tile's boundary
        psum = torch.randint(0, 2, (n, hkv, nb), generator=gen).float()
    pos = torch.randint(0, nbs * 16, (n,), generator=gen)
    if levels < 0:     # full rows: every block a candidate
        pos = nbs * 16 - 1 - torch.randint(0, 16, (n,), generator=gen)
    pos[0] = 3                      # one candidate block only: fewer than n selected
    npath = torch.zeros(n, dtype=torch.int32)
    nbpre = torch.tensor([nb], dtype=torch.int32)
    pp = torch.full((n, hkv, 1), float("nan"))   # no path-specific blocks: never read
    idx = torch.full((n, hkv, nsel), 99, dtype=torch.int32)
    want_imp = torch.where(torch.arange(nbs)[None, None] * 16 <= pos[:, None, None], psum, float("-inf"))
    bj, bt = pow2(max(nbs, nsel)), 0
    if tail:   # the policy's split (route_policy.plan_route), taken here at any width
        bj //= 2
        bj, bt = max(bj, pow2(nsel)), pow2(max(nbs - bj, 1), 16)
    top = dict(QC=qc, LS=16, R=1, A=1, BJ=bj, NSEL=nsel, NSELP=pow2(nsel, 1), SORTED=srt,
               FORCED_FIRST=cfg.forced_first, FORCED_LOCAL=cfg.forced_local, NBPP=1, NW=2,
               num_warps=4 if tail else 1,   # the policy's: one warp miscompiled the tail (session 38)
               **({"BT": bt} if tail else {}))
    if not merge:
        own = psum.clone().to(DEV)   # R = A = 1: no tail; the importance is written over it
        t = [x.to(DEV) for x in (pp, npath, nbpre, pos, idx)]
        nsa_route_topk_fwd_kernel[(-(-n // qc), hkv)](
            own, own, *t, n, nbs, own.stride(0), own.stride(1), t[0].stride(0), t[0].stride(1), t[4].stride(0),
            t[4].stride(1), **top)
        imp_k, idx_k = own.cpu(), t[4].cpu().long()
        assert torch.equal(imp_k, want_imp)
        assert torch.equal(idx_k, select_blocks(want_imp, pos, cfg))
        return
    # one head a KV head whose per-head sums are the importance: tile maxima 0 and one softmax state
    # with lse 0 scale every tile by exp2(0 - 0) = 1 (the GPU's exp2 / log2 may round it: one
    # factor for the whole row, so ties stay ties)
    own_h = psum.clone()
    mt = torch.zeros(n, hkv, -(-nb // 64))
    m_in, l_in = torch.zeros(1, n, hkv), torch.ones(1, n, hkv)
    own = torch.full((n, hkv, nbs), float("nan"))   # the importance is written here
    lse = torch.full((n, hkv), float("nan"))
    own_h, mt, pp, m_in, l_in, own, npath, nbpre, pos_d, idx, lse = (
        x.to(DEV) for x in (own_h, mt, pp, m_in, l_in, own, npath, nbpre, pos, idx, lse))
    nsa_route_merge_topk_fwd_kernel[(-(-n // qc), hkv)](
        own_h, own_h, mt, pp, m_in, l_in, m_in, own, own, pp, npath, nbpre, pos_d, idx, lse, lse,
        n, 0, nbs, 1, hkv, own_h.stride(1), mt.stride(1), own.stride(0), own.stride(1), pp.stride(0), pp.stride(1),
        idx.stride(0), idx.stride(1), G=1, D=16, BC=64, WANT_O=False, NSP=2, **top)
    imp_k, idx_k = own.cpu(), idx.cpu().long()
    assert lse.abs().max().item() < 1e-6
    fin = torch.isfinite(want_imp)
    assert torch.equal(torch.isfinite(imp_k), fin)
    assert torch.allclose(imp_k[fin], want_imp[fin], rtol=1e-6, atol=0)
    assert torch.equal(idx_k, select_blocks(imp_k, pos, cfg))
    if not CUDA:   # the interpreter's exp2 / log2 are exact here: the reference's selection itself
        assert torch.equal(idx_k, select_blocks(want_imp, pos, cfg))


def test_route_refuses_block_shapes_the_kernels_cannot_sum():
    from ssv.ops.nsa.route_policy import check_blocks
    assert check_blocks(NSAConfig()) == (4, 2)
    assert check_blocks(NSAConfig(cmp_block=24, cmp_stride=8, slc_block=16, n_select=6)) == (2, 3)   # A - 1 = R
    for bad in (dict(cmp_block=48, cmp_stride=16, slc_block=48),      # R = 3
                dict(cmp_block=64, cmp_stride=16, slc_block=32)):     # A - 1 = 3 > R = 2
        with pytest.raises(ValueError, match="Triton routing kernels need"):
            check_blocks(NSAConfig(**bad, n_select=6))


def test_plan_route_sweeps_once_up_to_its_row_width():
    """One sweep (per-head sums, merged by the top-n launch) for rows up to ONE_SWEEP_MAX_BLOCKS
    selection blocks, two past them (measured: the per-head sums' traffic grows with the row), short
    caches included; an explicit choice wins."""
    from ssv.ops.nsa.route_policy import ONE_SWEEP_MAX_BLOCKS, plan_route
    cfg = NSAConfig()
    nb = 4096   # a long cache: the split form
    short = plan_route(64, 32, 8, nb, ONE_SWEEP_MAX_BLOCKS, cfg, 132)
    wide = plan_route(64, 32, 8, nb, ONE_SWEEP_MAX_BLOCKS + 1, cfg, 132)
    assert short.one_sweep and short.bj <= ONE_SWEEP_MAX_BLOCKS
    assert not wide.one_sweep
    assert plan_route(64, 32, 8, nb, ONE_SWEEP_MAX_BLOCKS + 1, cfg, 132, one_sweep=True).one_sweep
    tiny = plan_route(1, 9, 3, 8, 2, cfg, 132)   # a short cache: one sweep, one split a 64-block tile
    assert tiny.one_sweep and tiny.n_split == 1


def test_plan_route_splits_rows_just_past_a_power_of_two():
    """Bisection rows just past a power of two take that power's half and a tail tile (1,025 blocks:
    1,024 + 16, not 2,048); rows that nearly fill their power, the bitonic top-k's short rows and the
    one-sweep merge's rows do not; topk_tail=False keeps the whole power."""
    from ssv.ops.nsa.route_policy import TAIL_MIN, plan_route
    cfg = NSAConfig()
    nb = 4096
    lp = plan_route(64, 32, 8, nb, 1025, cfg, 132)
    assert (lp.bj, lp.bt, lp.one_sweep, lp.sorted_topk) == (1024, TAIL_MIN, False, False)
    assert (plan_route(64, 32, 8, nb, 1025, cfg, 132, topk_tail=False).bj, ) == (2048, )
    assert plan_route(64, 32, 8, 8192, 2049 + 300, cfg, 132).bt == 512    # 2,048 + 512 of 4,096
    assert plan_route(64, 32, 8, 8192, 2048 + 1500, cfg, 132).bt == 0     # 3,548 of 4,096: no gain
    assert plan_route(64, 32, 8, nb, 1000, cfg, 132).bt == 0              # one sweep
    assert plan_route(48, 9, 3, 128, 129, cfg, 132, one_sweep=False).bt == 0   # bitonic (256 wide)


def test_plan_route_tail_never_takes_one_warp(monkeypatch):
    """One warp for small bisection tiles, never with a tail tile (Triton 3.6 miscompiled that form
    on an H100, session 38), and an explicit one-warp request with a tail is refused."""
    import ssv.ops.nsa.route_policy as policy
    from ssv.ops.nsa.route_policy import plan_route
    monkeypatch.setattr(policy, "SORTED_MAX_BLOCKS", 0)   # the routing test's forced bisection
    cfg = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=16, n_select=4, window=20)
    # 8 queries, rows of 69 blocks with two sweeps: 64 + a 16-block tail (8 x 80 <= 1,024 elements)
    lp = plan_route(5, 2, 1, 280, 69, cfg, 132, one_sweep=False)
    assert (lp.bj, lp.bt, lp.qc, lp.sorted_topk) == (64, 16, 8, False) and lp.topk_warps == 4
    no_tail = plan_route(5, 2, 1, 280, 69, cfg, 132, one_sweep=False, topk_tail=False)
    assert (no_tail.bj, no_tail.bt, no_tail.topk_warps) == (128, 0, 1)
    assert plan_route(5, 2, 1, 280, 69, cfg, 132, one_sweep=False, topk_warps=2).topk_warps == 2
    with pytest.raises(ValueError, match="at least 2 warps"):
        plan_route(5, 2, 1, 280, 69, cfg, 132, one_sweep=False, topk_warps=1)
