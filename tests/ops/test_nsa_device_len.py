"""The kernels with the prefix length in device memory (the graphed round's launches): sized for the
cache's capacity, reading P, s0 and the committed compressed blocks from tensors, they equal the reference."""
import pytest
import torch

from ssv.config import NSAConfig
from ssv.ops.dense.naive import dense_naive
from ssv.ops.nsa.naive import compress_mean, nsa_naive, num_cmp_blocks
from ssv.ops.nsa.route import nsa_route, path_block_weights, path_block_weights_device, path_blocks_torch
from ssv.ops.nsa.verify import nsa_verify

from .test_nsa_kernels import DEV, DTYPES, rand_tree, rel_err, tol

CFG = dict(cmp_block=8, cmp_stride=4, slc_block=16, n_select=4, forced_local=1, window=20)
CASES = [  # seed, P, N, Hkv, G, D, C, cfg overrides
    (0, 150, 7, 2, 3, 16, 4, {}),
    (1, 0, 9, 1, 4, 32, 1, {}),
    (2, 63, 12, 2, 2, 16, 8, dict(window=8)),
    (3, 301, 16, 1, 2, 16, 4, dict(cmp_block=16, cmp_stride=8)),
    (4, 7, 1, 2, 2, 16, 1, {}),
]


def _case(seed, P, N, hkv, G, D, dtype, extra=40):
    """A cache of P + N + extra slots whose slots past the step hold large finite garbage."""
    gen = torch.Generator().manual_seed(seed)
    L = P + N + extra
    k = torch.randn(hkv, L, D, generator=gen)
    v = torch.randn(hkv, L, D, generator=gen)
    k[:, P + N:] *= 1e3
    v[:, P + N:] *= 1e3
    q = torch.randn(N, hkv * G, D, generator=gen)
    depth, mask = rand_tree(N, gen)
    return q.to(dtype), k.to(dtype), v.to(dtype), P + depth, mask


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("one_sweep", [True, False])
@pytest.mark.parametrize("tma", [False, True])
def test_device_length_route_and_verify_match_reference(case, one_sweep, tma):
    seed, P, N, hkv, G, D, C, over = case
    cfg = NSAConfig(**{**CFG, **over})
    dtype = DTYPES[0]
    q, k, v, pos, mask = _case(seed, P, N, hkv, G, D, dtype)
    ref = nsa_naive(q.float(), k.float(), v.float(), P, pos, mask, cfg)
    plen = torch.tensor([P], dtype=torch.int32, device=DEV)
    # capacity blocks: the committed ones, then NaN, which the pointer loads never read and the
    # descriptors' tiles (tma) read and mask
    cap = num_cmp_blocks(k.shape[1], cfg)
    nb = num_cmp_blocks(P, cfg)
    kc = torch.full((hkv, cap, D), float("nan"))
    vc = torch.full((hkv, cap, D), float("nan"))
    kc[:, :nb], vc[:, :nb] = compress_mean(k.float(), nb, cfg), compress_mean(v.float(), nb, cfg)
    w, s0, npath = path_block_weights_device(plen, pos.to(DEV), mask.to(DEV), cfg)
    hw, hs0, hnpath = path_block_weights(P, pos, mask, cfg)
    assert int(s0) == hs0 and torch.equal(npath.cpu(), hnpath)
    # the device weights over the fixed l + N slots form the host weights' path blocks
    kp, _ = path_blocks_torch(w.cpu(), int(s0), k.float(), v.float(), int(s0) + w.shape[2] - N, N)
    hkp, _ = path_blocks_torch(hw, hs0, k.float(), v.float(), P, N)
    for i in range(N):  # the blocks each query's path completes
        m = int(hnpath[i])
        assert rel_err(kp[i, :, :m], hkp[i, :, :m]) < 1e-5 if m else True
    nbpre = torch.tensor([nb], dtype=torch.int32, device=DEV)
    idx, _, lse, o_cmp = nsa_route(q.to(DEV), kc.to(dtype).to(DEV), vc.to(dtype).to(DEV), nbpre, k.to(DEV), v.to(DEV),
                               w, s0, npath, pos.to(DEV), cfg, max_pos=k.shape[1] - 1, one_sweep=one_sweep, tma=tma,
                               want_o=True)
    assert torch.equal(idx.cpu().long(), ref.block_indices)
    assert not lse.isnan().any() and not o_cmp.isnan().any()
    assert rel_err(o_cmp.cpu(), ref.o_cmp) < tol(dtype)
    o, lse_a, _ = nsa_verify(q.to(DEV), k.to(DEV), v.to(DEV), plen, pos.to(DEV), mask.to(DEV), idx, cfg.slc_block,
                             cfg.window, group_size=C, out=torch.full_like(q, float("nan")).to(DEV))
    assert rel_err(o, ref.o) < tol(dtype)


@pytest.mark.parametrize("one_sweep", [True, False])
@pytest.mark.parametrize("want_o", [False, True])
def test_route_path_blocks_ignore_the_slots_they_do_not_weigh(one_sweep, want_o):
    """The device plan's path weights span l + N slots from s0, past the step's last one while P - s0 < l:
    NaN there (and in the step's slots no query's path holds) leaves the routing's output unchanged."""
    seed, P, N, hkv, G, D = 5, 150, 7, 2, 3, 16
    cfg = NSAConfig(**CFG)
    dtype = DTYPES[0]
    q, k, v, pos, mask = _case(seed, P, N, hkv, G, D, dtype)
    plen = torch.tensor([P], dtype=torch.int32, device=DEV)
    nb = num_cmp_blocks(P, cfg)
    kc, vc = compress_mean(k.float(), nb, cfg).to(dtype), compress_mean(v.float(), nb, cfg).to(dtype)
    w, s0, npath = path_block_weights_device(plen, pos.to(DEV), mask.to(DEV), cfg)
    assert int(s0) + w.shape[2] > P + N   # the weights reach past the step
    nbpre = torch.tensor([nb], dtype=torch.int32, device=DEV)
    outs = []
    for poison in (False, True):
        kk, vv = k.clone(), v.clone()
        if poison:
            kk[:, P + N:], vv[:, P + N:] = float("nan"), float("nan")
            unused = (w.cpu() == 0).all(1).all(0)   # slots no query's block weighs
            sl = int(s0) + torch.nonzero(unused[: P + N - int(s0)]).flatten()
            kk[:, sl], vv[:, sl] = float("nan"), float("nan")
        outs.append(nsa_route(q.to(DEV), kc.to(DEV), vc.to(DEV), nbpre, kk.to(DEV), vv.to(DEV), w, s0, npath,
                              pos.to(DEV), cfg, want_o=want_o, max_pos=k.shape[1] - 1, one_sweep=one_sweep))
    for a, b in zip(*outs):
        if a is not None:
            assert not b.float().isnan().any() and torch.equal(a, b)


@pytest.mark.parametrize("split", [None, 12])
@pytest.mark.parametrize("case", [(0, 150, 7, 2, 3, 16), (1, 0, 5, 1, 2, 32), (2, 200, 1, 2, 4, 16)])
def test_dense_attention_on_the_verify_kernel(case, split):
    """A window over the whole cache and no selected blocks is dense attention (the window branch over every
    key; the dense plan's form before ssv/ops/dense); also
    with more KV splits than the prefix has tiles (empty splits merged), as the AR step's launch at
    a short length in a long cache has."""
    seed, P, N, hkv, G, D = case
    dtype = DTYPES[0]
    q, k, v, pos, mask = _case(seed, P, N, hkv, G, D, dtype)
    want = dense_naive(q.float(), k.float(), v.float(), P, pos, mask)
    none = torch.full((N, hkv, 1), -1, dtype=torch.int32, device=DEV)
    plen = torch.tensor([P], dtype=torch.int32, device=DEV)
    o, _, _ = nsa_verify(q.to(DEV), k.to(DEV), v.to(DEV), plen, pos.to(DEV), mask.to(DEV), none, 16, k.shape[1],
                         out=torch.full_like(q, float("nan")).to(DEV), n_split=split)
    assert rel_err(o, want) < tol(dtype)



def test_step_table_recorded_selections_replace_the_routings_output():
    """`ssv bench e2e`'s step table: a plan under `recorded_selections` still routes, but its verify
    reads the given selections: its output equals the verify kernel's on them, not the routed plan's."""
    from ssv.attention import VerifyOptions
    from ssv.attention_device import device_plan
    from ssv.bench.e2e_steps import fill_cache, recorded_selections
    from ssv.bench.synthetic import synthetic_selection
    from ssv.engine.runner import Runner
    from ..conftest import make_tiny_model
    cfg = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=16, n_select=4, window=16)
    r = Runner(make_tiny_model(0, n_layers=1).to(DEV), attention="nsa", nsa=cfg, max_len=200)
    fill_cache(r, 150, torch.Generator(device=DEV).manual_seed(0))
    n, c = 5, r.cache
    pos = c.dlen.long() + torch.tensor([0, 1, 1, 2, 3], device=DEV)
    mask = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]],
                        dtype=torch.bool, device=DEV)
    sel = synthetic_selection(pos.cpu(), 2, cfg, 0.5, torch.Generator().manual_seed(1)).to(DEV, torch.int32)
    q = torch.randn(n, 4, 16, generator=torch.Generator().manual_seed(2)).to(DEV)
    outs = []
    for recorded in (False, True):
        plan = device_plan("nsa", cfg, VerifyOptions(4), n, c, 4, True)
        if recorded:
            plan = recorded_selections(plan, sel)
        plan.plan(c.dlen, pos, mask)
        outs.append(plan.run(0, q, c))
    want, _, _ = nsa_verify(q, c.k[0], c.v[0], c.dlen, pos, mask.to(torch.uint8), sel, cfg.slc_block, cfg.window,
                            group_size=4)
    torch.testing.assert_close(outs[1], want)
    assert not torch.allclose(outs[0], outs[1])


@pytest.mark.parametrize("tail", [True, False])
def test_route_rows_just_past_a_power_of_two(tail):
    """Rows of 263 selection blocks (past the bitonic top-k's 256): with two sweeps the policy takes
    them as a 256-block tile and a 16-block tail (route_policy.TAIL_MIN), where the step's own blocks,
    the forced local ones, fall; the selection equals the reference's with the tail and without."""
    from ssv.ops.nsa.route_policy import plan_route
    cfg = NSAConfig(**{**CFG, **dict(cmp_block=16, cmp_stride=16)})
    P, N, hkv, G, D = 4190, 6, 1, 2, 16
    q, k, v, pos, mask = _case(7, P, N, hkv, G, D, DTYPES[0], extra=2)
    nbs = (k.shape[1] - 1) // cfg.slc_block + 1
    lp = plan_route(N, hkv * G, hkv, num_cmp_blocks(k.shape[1], cfg), nbs, cfg, 4, one_sweep=False)
    assert (lp.bj, lp.bt) == (256, 16) and not lp.sorted_topk
    ref = nsa_naive(q.float(), k.float(), v.float(), P, pos, mask, cfg)
    nb = num_cmp_blocks(P, cfg)
    kc, vc = compress_mean(k.float(), nb, cfg), compress_mean(v.float(), nb, cfg)
    w, s0, npath = path_block_weights(P, pos, mask, cfg)
    idx, imp, _, _ = nsa_route(q.to(DEV), kc.to(DTYPES[0]).to(DEV), vc.to(DTYPES[0]).to(DEV), nb, k.to(DEV),
                               v.to(DEV), w.to(DEV), s0, npath.to(DEV), pos.to(DEV), cfg, max_pos=k.shape[1] - 1,
                               one_sweep=False, topk_tail=tail)
    assert torch.equal(idx.cpu().long(), ref.block_indices)
    assert (idx.cpu() >= 256).any()   # the tail's blocks are taken
