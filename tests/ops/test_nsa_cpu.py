"""`nsa_cpu` (the CPU's batched NSA) against `nsa_naive` on fresh random inputs: chains and draft trees
(also out of parent-first order), odd head counts and dims, prefixes shorter than a compression block,
path blocks that complete inside the tree, the cache's compressed blocks or none, reused routing,
gated gating; outputs pre-filled with NaN must be fully written, slots after the step never read.
Every test runs twice: the prefix scored whole and the prefix's needed blocks gathered."""
from __future__ import annotations

import random

import pytest
import torch

from ssv.config import NSAConfig
from ssv.ops.nsa.cpu import CpuStep, nsa_cpu, supported
from ssv.ops.nsa.naive import compress_mean, nsa_naive, num_cmp_blocks
from tests.ops.test_nsa_naive import chain, make_inputs, permute_tree, random_parents, tree_from_parents

TOL = dict(atol=2e-5, rtol=2e-5)
SMALL = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=8, n_select=4, window=12)


@pytest.fixture(autouse=True, params=["scored whole", "gathered"])
def prefix_path(request, monkeypatch):
    import ssv.ops.nsa.cpu as cpu
    monkeypatch.setattr(cpu, "GATHER_SKIPS", 10 ** 9 if request.param == "scored whole" else -(10 ** 9))
    return request.param


def _tree(seed: int, P: int, N: int):
    rng = random.Random(seed)
    pos, mask = tree_from_parents(P, random_parents(rng, N, roots=1, bushy=0.5))
    perm = list(range(N))
    rng.shuffle(perm)
    return permute_tree(pos, mask, perm)


def _check(seed, P, N, hkv, g, D, cfg, tree=True, use_cmp=True, gated=False):
    cfg = NSAConfig(**{**vars(cfg), "gating": "gated" if gated else cfg.gating})
    q, k, v, gates = make_inputs(seed, P, N, hkv, g, D, extra=5)
    k[:, P + N:], v[:, P + N:] = float("nan"), float("nan")           # after the step: never read
    pos, mask = _tree(seed, P, N) if tree else chain(P, N)
    nb = num_cmp_blocks(P, cfg)
    kc = compress_mean(k[:, :P], nb, cfg) if use_cmp else None
    vc = compress_mean(v[:, :P], nb, cfg) if use_cmp else None
    want = nsa_naive(q, k, v, P, pos, mask, cfg, gates=gates, k_cmp=kc, v_cmp=vc)
    step = CpuStep(P, pos, mask, cfg)
    if not tree and step.n_path:   # a chain's path blocks are pooled once for all its queries
        assert step.w_shared is not None and step.w is None
    out = torch.full((N, hkv * g, D), float("nan"))
    got, idx = nsa_cpu(q, k, v, step, kc, vc, gates=gates, out=out)
    assert got.data_ptr() == out.data_ptr() and not out.isnan().any()
    torch.testing.assert_close(got, want.o, **TOL)
    assert torch.equal(idx, want.block_indices)
    # a reused routing (another layer's, or a group's) is taken as given
    other = want.block_indices.flip(0)
    again = nsa_naive(q, k, v, P, pos, mask, cfg, gates=gates, block_indices=other, k_cmp=kc, v_cmp=vc)
    got2, idx2 = nsa_cpu(q, k, v, step, kc, vc, gates=gates, block_indices=other)
    torch.testing.assert_close(got2, again.o, **TOL)
    assert torch.equal(idx2, other)


@pytest.mark.parametrize("seed", range(6))
def test_random_trees_small_blocks(seed):
    rng = random.Random(100 + seed)
    P, N = rng.randrange(0, 90), rng.randrange(1, 14)
    hkv, g, D = rng.choice([1, 2, 3]), rng.choice([1, 3, 4]), rng.choice([8, 24])
    _check(seed, P, N, hkv, g, D, SMALL, tree=seed % 3 != 0, use_cmp=seed % 2 == 0)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("P,N", [(0, 1), (5, 3), (31, 2), (200, 1), (203, 7), (333, 17)])
def test_default_config(P, N, gated):
    _check(P + N, P, N, 3, 3, 16, NSAConfig(window=64), tree=N > 2, gated=gated)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("P,N", [(0, 9), (13, 1), (29, 3), (61, 40), (64, 16)])
def test_chains_pool_their_path_blocks_once(P, N, gated):
    # chains whose tokens complete compression blocks (and some that complete none): the shared
    # pooling gives the reference's outputs, the cache's compressed prefix given or not
    for use_cmp in (True, False):
        _check(P * 7 + N, P, N, 2, 3, 8, SMALL, tree=False, use_cmp=use_cmp, gated=gated)


@pytest.mark.parametrize("gated", [False, True])
def test_a_step_with_every_candidate_selected_skips_routing(monkeypatch, gated):
    # SMALL selects 4 blocks of 8: up to position 31 every candidate block is taken, and "union"
    # attends to every visible slot without routing (the reference's outputs and block indices, as
    # `_check` asserts); one block more and routing runs; "gated" always needs the compressed branch
    import ssv.ops.nsa.cpu as cpu
    calls = []
    real = cpu.select_blocks_cpu
    monkeypatch.setattr(cpu, "select_blocks_cpu", lambda *a: calls.append(1) or real(*a))
    for P, N, routed in ((20, 12, gated), (3, 5, gated), (21, 12, True), (40, 3, True)):
        calls.clear()
        for tree in (False, True):
            _check(P + N, P, N, 2, 3, 8, SMALL, tree=tree, gated=gated)
        assert CpuStep(P, *chain(P, N), SMALL).all_selected == (P + N <= 32)
        assert bool(calls) == routed


def test_a_tree_keeps_per_query_path_blocks():
    # siblings inside one compression block: a node sees only its own path's slots there
    pos, mask = tree_from_parents(16, [-1, 0, 0, 1, 2, 3, 4, 5, 6])
    step = CpuStep(16, pos, mask, SMALL)
    assert step.n_path and step.w is not None and step.w_shared is None


def test_prefill_chunk_and_long_prefix():
    _check(7, 700, 64, 2, 2, 16, NSAConfig(window=128), tree=False)
    _check(8, 1100, 4, 3, 3, 64, NSAConfig(), tree=True)


@pytest.mark.parametrize("heads_rows", [1, 10 ** 9])   # the GQA group as the call's heads: always, never
@pytest.mark.parametrize("block", [1, 4152, 1 << 21])   # rows a block: 1; 4 and 6 (N = 23, 11); all
@pytest.mark.parametrize("gated", [False, True])
def test_token_branches_in_row_blocks(monkeypatch, block, gated, heads_rows):
    """Long chunks attend in blocks of rows (SCORE_BLOCK scores each): one row a block, blocks of a few
    rows that do not divide N, and one block give the reference's outputs, and the same as unblocked,
    in either layout of the attention call."""
    import ssv.ops.nsa.cpu as cpu
    monkeypatch.setattr(cpu, "SCORE_BLOCK", block)
    monkeypatch.setattr(cpu, "GROUP_HEADS_ROWS", heads_rows)
    for seed, P, N, tree in ((3, 150, 23, False), (4, 90, 11, True)):
        _check(seed, P, N, 2, 3, 16, NSAConfig(window=40, gating="gated" if gated else "union"), tree=tree,
               gated=gated)


def test_supported():
    assert supported(NSAConfig(), "cpu") and supported(NSAConfig(gating="gated"), "cpu")
    assert not supported(NSAConfig(gating="union_cmp"), "cpu") and not supported(NSAConfig(), "meta")


@pytest.mark.parametrize("block", [1 << 21, 1])   # the step's rows at once; one row a block, each gathering its own
def test_the_gathered_prefix_reads_only_needed_blocks(prefix_path, monkeypatch, block):
    # a long prefix with a short window: the gathered path must give the reference's outputs with every
    # prefix block no query of a head selects (and no window reaches) poisoned with NaN; the whole-prefix
    # path reads them (0 x NaN in p @ v), which shows the poison reaches any path that reads them
    import ssv.ops.nsa.cpu as cpu
    monkeypatch.setattr(cpu, "SCORE_BLOCK", block)
    cfg = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=8, n_select=3, window=10)
    P, N, hkv, g, D = 160, 5, 2, 2, 16
    q, k, v, _ = make_inputs(11, P, N, hkv, g, D, extra=3)
    pos, mask = _tree(11, P, N)
    nb = num_cmp_blocks(P, cfg)
    kc, vc = compress_mean(k[:, :P], nb, cfg), compress_mean(v[:, :P], nb, cfg)
    want = nsa_naive(q, k, v, P, pos, mask, cfg, k_cmp=kc, v_cmp=vc)
    step = CpuStep(P, pos, mask, cfg)
    need = torch.zeros(hkv, P // 8, dtype=torch.bool)
    for h in range(hkv):
        for b in want.block_indices[:, h].flatten().tolist():
            if 0 <= b < P // 8:
                need[h, b] = True
    need[:, max(0, int(pos.min()) - cfg.window + 1) // 8:] = True   # the blocks a window reaches
    assert (~need).sum() > 4            # some blocks are not read at all
    k2, v2 = k.clone(), v.clone()
    for h in range(hkv):
        for b in (~need[h]).nonzero().flatten().tolist():
            k2[h, b * 8:(b + 1) * 8] = float("nan")
            v2[h, b * 8:(b + 1) * 8] = float("nan")
    got, idx = nsa_cpu(q, k2, v2, step, kc, vc, block_indices=want.block_indices)
    if prefix_path == "gathered":
        torch.testing.assert_close(got, want.o, **TOL)
    else:
        assert got.isnan().any()


def test_strict_rounds_emit_ar_tokens_with_the_prefix_gathered_or_not(prefix_path):
    # the device round on the CPU (verify passes of 4 and 6 rows, AR steps, one gather buffer a step
    # reused by every layer) gives ar's greedy text token for token either way
    from ssv.engine.device_round import DeviceEngine
    from ssv.engine.generate import generate_ar
    from ssv.engine.runner import Runner
    from ssv.engine.spec import SpecOptions, generate_spec
    from ssv.spec.accept import SamplingParams
    from ssv.spec.tree import TreeSpec

    from ..conftest import make_tiny_model
    from ..engine.test_device_round import NSA, OracleDeviceDrafter
    greedy = SamplingParams(temperature=0.0)
    r = Runner(make_tiny_model(4, vocab=64, n_layers=3), attention="nsa", nsa=NSA, max_len=300)
    prompt = torch.randint(0, 64, (130,), generator=torch.Generator().manual_seed(5)).tolist()
    ar = generate_ar(r, prompt, greedy, 40)
    for spec in ((2, 2, 4), (3, 2, 6)):
        d = OracleDeviceDrafter(ar.token_ids, len(prompt), 64)
        res = generate_spec(r, d, prompt, greedy, 40, opts=SpecOptions(tree=TreeSpec(*spec)),
                            engine=DeviceEngine(r, d))
        assert res.token_ids == ar.token_ids
        assert res.stats["mean_accepted_length"] > 1.3
