"""Triton NSA kernels (routing, grouped verification) against the fp32 reference.

CPU: Triton's interpreter, fp32 inputs. GPU: compiled, bf16/fp16 inputs against the reference on the
same rounded inputs (tolerances as METHOD.md: bf16 relative error below 1e-2).
"""
import os

import pytest
import torch
import triton
import triton.language as tl

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ssv.config import NSAConfig  # noqa: E402
from ssv.ops.nsa.naive import compress_mean, nsa_naive, num_cmp_blocks, select_blocks  # noqa: E402
from ssv.ops.nsa.route import nsa_route, path_block_weights  # noqa: E402
from ssv.ops.nsa.verify import nsa_verify  # noqa: E402
from ssv.ops.nsa.verify_kernels import _item_range  # noqa: E402

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
DTYPES = [torch.bfloat16, torch.float16] if CUDA else [torch.float32]


def rand_tree(n, gen, chain=False):
    """(depth, ancestor mask) of a random tree (a chain when chain=True), from ssv.spec.flatten."""
    from ssv.spec.flatten import tree_metadata
    from ssv.spec.tree import DraftTree
    par = [-1] + [(i - 1 if chain else int(torch.randint(0, i, (1,), generator=gen))) for i in range(1, n)]
    meta = tree_metadata(DraftTree(torch.zeros(n, dtype=torch.long), torch.tensor(par), torch.zeros(n)), 0)
    return meta.depth, meta.mask


def make_case(seed, P, N, hkv, G, D, dtype, cfg, chain=False):
    gen = torch.Generator().manual_seed(seed)
    L = P + N + 3
    k = torch.randn(hkv, L, D, generator=gen).to(dtype)
    v = torch.randn(hkv, L, D, generator=gen).to(dtype)
    k[:, P + N:], v[:, P + N:] = float("nan"), float("nan")  # cache slots past the step: never read
    q = torch.randn(N, hkv * G, D, generator=gen).to(dtype)
    depth, mask = rand_tree(N, gen, chain)
    gates = torch.rand(N, hkv * G, 3, generator=gen)
    return q, k, v, P + depth, mask, gates


def rel_err(a, b):
    a, b = a.float().cpu(), b.float().cpu()
    assert not torch.isnan(a).any(), "kernel output has NaN (unwritten or bad arithmetic)"
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def assert_lse(got, want, atol):
    got, fin = got.float().cpu(), torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin), "empty branches must give -inf exactly"
    if fin.any():
        assert (got[fin] - want[fin]).abs().max() < atol


def tol(dtype):
    return 1e-5 if dtype == torch.float32 else 1e-2


CFG = dict(cmp_block=8, cmp_stride=4, slc_block=16, n_select=4, window=20)
VERIFY_CASES = [
    # seed, P, N, Hkv, G, D, C, approx, cfg overrides
    (0, 150, 7, 2, 3, 16, 4, False, {}),
    (1, 150, 7, 2, 3, 16, 2, True, {}),
    (2, 301, 9, 1, 4, 32, 1, False, dict(window=0)),
    (3, 64, 5, 3, 1, 16, 8, False, dict(window=40)),
    (4, 37, 12, 2, 2, 16, 16, False, dict(window=8)),
    (5, 259, 33, 1, 16, 16, 4, True, dict(n_select=6)),
    (6, 0, 20, 2, 2, 16, 8, False, {}),
    (7, 97, 16, 2, 5, 64, 16, False, dict(forced_first=False, forced_local=1)),
    # selection blocks of 64 and 32 keys (the default model's are 64)
    (8, 700, 9, 2, 4, 32, 4, False, dict(cmp_block=16, cmp_stride=8, slc_block=64, window=64)),
    (9, 900, 17, 1, 4, 16, 4, True, dict(cmp_block=16, cmp_stride=8, slc_block=64, window=64, n_select=6)),
    (10, 333, 11, 2, 2, 16, 8, False, dict(cmp_block=16, cmp_stride=8, slc_block=32, window=64)),
]


PATHS = {  # nsa_verify options beyond the defaults; each case runs all four
    "default": {},      # the split heuristic (interpreter: 4 SMs, 3 programs each); CPU: pointer loads, Hopper: TMA
    "tma-fold2": dict(tma=True, n_split=2),                    # FOLD_MAX_SPLITS splits: folded by default
    "pointers-combine3": dict(tma=False, n_split=3),           # more: the combine launch by default
    "other-softmax-fold3": dict(tma=True, n_split=3, fold=True, lazy="other"),  # exact: online, approx: lazy
}


def _verify_case(case, gating, dtype, chain=False):
    """The case's inputs, the fp32 reference (approximate mode: each group's first query's selection) and a
    launcher of nsa_verify over them into NaN-poisoned outputs: run(**opts) -> (o, lse_a, lse_b, out)."""
    seed, P, N, hkv, G, D, C, approx, over = case
    cfg = NSAConfig(**{**CFG, **over, "gating": gating})
    q, k, v, pos, mask, gates = make_case(seed, P, N, hkv, G, D, dtype, cfg, chain=chain)
    ref = nsa_naive(q.float(), k.float(), v.float(), P, pos, mask, cfg, gates=gates)
    idx = ref.block_indices
    if approx:
        rep = torch.arange(N) // C * C
        ref = nsa_naive(q.float(), k.float(), v.float(), P, pos, mask, cfg, gates=gates, block_indices=idx[rep])
    gated = gating == "gated"

    def run(**opts):
        out = torch.full_like(q, float("nan")).to(DEV)
        o, lse_a, lse_b = nsa_verify(q.to(DEV), k.to(DEV), v.to(DEV), P, pos.to(DEV), mask.to(DEV), idx.to(DEV),
                                     cfg.slc_block, cfg.window, group_size=C, approx=approx,
                                     gates=gates.to(DEV) if gated else None,
                                     o_cmp=ref.o_cmp.to(DEV) if gated else None, out=out, **opts)
        return o, lse_a, lse_b, out
    return ref, run


def _assert_matches_reference(o, lse_a, lse_b, ref, gated, dtype):
    assert rel_err(o, ref.o) < tol(dtype)
    want_a = ref.lse_slc if gated else torch.logaddexp(ref.lse_slc, ref.lse_win)
    assert_lse(lse_a, want_a, 50 * tol(dtype))
    if gated:
        assert_lse(lse_b, ref.lse_win, 50 * tol(dtype))


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gating", ["union", "gated"])
@pytest.mark.parametrize("case", VERIFY_CASES)
def test_verify_matches_reference(case, gating, dtype, path):
    """Exact and approximate mode, C = 1..16, GQA groups 1..16, both gatings, both load paths, both
    softmaxes, one and several KV splits merged folded or by the combine launch, into NaN-poisoned
    outputs."""
    if dtype == torch.float16 and path != "default":
        pytest.skip("on the GPU the non-default paths are checked in bf16 only (compile time)")
    opts = dict(PATHS[path])
    if opts.get("lazy") == "other":
        opts["lazy"] = case[7]   # approx
    ref, run = _verify_case(case, gating, dtype, chain=(case[0] == 6))
    o, lse_a, lse_b, out = run(**opts)
    assert o.data_ptr() == out.data_ptr()
    _assert_matches_reference(o, lse_a, lse_b, ref, gating == "gated", dtype)


FOLD_CASES = [  # VERIFY_CASES' fields, then the KV splits, which one program merges (more splits than a
    # program group has items: some splits hold none and leave empty states)
    (0, 150, 7, 2, 3, 16, 4, False, {}, 11),               # strict's 11 splits at the default model's 4K
    (1, 150, 7, 2, 3, 16, 2, True, {}, 9),                 # approximate
    (20, 200, 12, 1, 4, 128, 4, False, {}, 10),            # head dim 128 (the Llama shape's)
    (7, 97, 16, 2, 5, 64, 16, False, dict(forced_first=False, forced_local=1), 5),  # 128-row tiles
]


@pytest.mark.parametrize("gating", ["union", "gated"])
@pytest.mark.parametrize("fold_case", FOLD_CASES)
def test_folded_merge_of_many_splits(fold_case, gating):
    """One program merging 5-11 KV splits (some with no item) gives the reference's output and
    log-sum-exps, and the combine launch's, into NaN-poisoned outputs."""
    dtype = DTYPES[0]
    ref, run = _verify_case(fold_case[:-1], gating, dtype)
    o, lse_a, lse_b, _ = run(n_split=fold_case[-1], fold=True)
    o_c, lse_ca, _, _ = run(n_split=fold_case[-1], fold=False)
    _assert_matches_reference(o, lse_a, lse_b, ref, gating == "gated", dtype)
    assert rel_err(o, o_c) < tol(dtype)
    assert_lse(lse_a, lse_ca.float().cpu(), 50 * tol(dtype))


def _disjoint(idx):
    """Every query of a group selects blocks no other query of it selects: the union is C*n entries."""
    n_q, hkv, n = idx.shape
    return torch.stack([torch.stack([torch.arange(n) + n * ((i * hkv + h) % 16) for h in range(hkv)])
                        for i in range(n_q)]).to(idx.dtype)


EDGE_CASES = {  # name: (seed, P, N, Hkv, G, C, approx, cfg overrides, chain, max_rows)
    "window 0, C=8, deep tree": (8, 150, 40, 2, 2, 8, False, dict(window=0), False, 128),
    "window tiles at their bound": (9, 350, 9, 1, 2, 4, False, dict(window=240), False, 128),
    "union at its bound (disjoint)": (10, 600, 13, 2, 2, 4, False, {}, False, 128),
    "C=16, partial last group": (11, 700, 37, 1, 2, 16, False, dict(n_select=8), False, 128),
    "C=16 approx, partial last group": (12, 700, 37, 1, 2, 16, True, dict(n_select=8), False, 128),
    "empty last row split": (13, 200, 19, 1, 16, 16, False, {}, False, 128),
    "row splits of 16": (14, 200, 19, 2, 2, 16, False, {}, False, 16),
    "P = BS-1 mod BS, chain over 3 blocks": (15, 159, 40, 1, 2, 4, False, {}, True, 128),
    "P = 0, window 0": (16, 0, 40, 1, 2, 8, False, dict(window=0), True, 128),
    "window longer than the context": (17, 300, 20, 1, 1, 16, False, dict(window=70000, n_select=16), False, 128),
    "128 queries (the most supported)": (18, 260, 128, 1, 3, 4, False, {}, False, 128),
}


def test_ctas_per_sm_counts_registers_shared_memory_and_threads():
    from ssv.ops.utils import ctas_per_sm
    # the verify kernel's two Llama C = 4 variants compiled for sm_90 (scripts/inspect_verify_ttgir.py):
    # 168 registers (combine kernel) fit 3 programs of 4 warps, 178 (folded merge) only 2
    assert ctas_per_sm(168, 70000, 4) == 3
    assert ctas_per_sm(178, 70000, 4) == 2
    assert ctas_per_sm(32, 150000, 4) == 1            # shared memory decides
    assert ctas_per_sm(16, 0, 32) == 2                # threads decide (2048 a SM)
    assert ctas_per_sm(255, 0, 16, limits=(65536, 233472, 2048)) == 1


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (reads a compiled kernel's registers)")
def test_verify_occupancy_of_the_compiled_variant():
    """The default KV splits fill one wave of the programs that fit on an SM, read from the compiled
    kernel; the result is cached per variant. 8 programs here: the folded variant would need more
    than FOLD_MAX_SPLITS splits, so the combine launch's variant is read too (two entries)."""
    from ssv.ops.nsa import verify_policy as VP
    cfg = NSAConfig(**CFG)
    q, k, v, pos, mask, _ = make_case(3, 3000, 16, 2, 4, 64, DTYPES[0], cfg)
    idx = nsa_naive(q.float(), k.float(), v.float(), 3000, pos, mask, cfg).block_indices
    VP._OCCUPANCY.clear()
    o, _, _ = nsa_verify(q.to(DEV), k.to(DEV), v.to(DEV), 3000, pos.to(DEV), mask.to(DEV), idx.to(DEV),
                         cfg.slc_block, cfg.window, group_size=4)
    assert sorted(key[-1] for key in VP._OCCUPANCY) == [False, True]      # folded, then not
    assert all(1 <= fit <= 32 for fit in VP._OCCUPANCY.values())
    ref = nsa_naive(q.float(), k.float(), v.float(), 3000, pos, mask, cfg, block_indices=idx)
    assert rel_err(o, ref.o) < tol(DTYPES[0])


def test_verify_folded_merge_counters_are_left_zero_and_reused():
    """The folded split merge counts arrivals in caller-owned counters: every call leaves them at zero,
    so one buffer serves consecutive calls (layers) with other inputs; a buffer too small is refused."""
    from ssv.ops.nsa.verify import num_counters
    cfg = NSAConfig(**{**CFG, "gating": "gated"})
    P, N, hkv, G, C = 150, 9, 2, 3, 2
    cnt = torch.zeros(num_counters(N, hkv * G, hkv, C), dtype=torch.int32, device=DEV)
    assert cnt.numel() == 5 * 2
    assert num_counters(N, hkv * G, hkv) == N * hkv          # any C: here the per-query launch needs the most
    assert num_counters(1, 16, 1) == num_counters(1, 16, 1, 16) == 2   # C = 16 of 16 heads: two row splits
    for seed in (50, 51, 52):
        q, k, v, pos, mask, gates = make_case(seed, P, N, hkv, G, 16, DTYPES[0], cfg)
        ref = nsa_naive(q.float(), k.float(), v.float(), P, pos, mask, cfg, gates=gates)
        o, _, _ = nsa_verify(q.to(DEV), k.to(DEV), v.to(DEV), P, pos.to(DEV), mask.to(DEV),
                             ref.block_indices.to(DEV), cfg.slc_block, cfg.window, group_size=C,
                             gates=gates.to(DEV), o_cmp=ref.o_cmp.to(DEV), out=torch.full_like(q, float("nan")).to(DEV),
                             n_split=2 + seed % 2, fold=True, counters=cnt)
        assert rel_err(o, ref.o) < tol(DTYPES[0])
        assert int(cnt.abs().sum()) == 0
    with pytest.raises(ValueError, match="counters must be 10"):
        nsa_verify(q.to(DEV), k.to(DEV), v.to(DEV), P, pos.to(DEV), mask.to(DEV), ref.block_indices.to(DEV),
                   cfg.slc_block, cfg.window, group_size=C, n_split=2, fold=True, counters=cnt[:9])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on purpose: exp2 overflow, inf * 0
@pytest.mark.parametrize("gating, extreme", [("union", "overflow"), ("gated", "overflow"), ("gated", "underflow")])
def test_verify_lazy_softmax_falls_back_when_exp2_leaves_range(gating, extreme):
    """The lazy softmax measures scores against each row's own token: when the prefix scores are
    hundreds of bits above it (exp2 overflows) or below it (the prefix sums underflow, which matters
    for a gated branch the own token is not in: here the selected one, with no block past the
    prefix selected), the kernel must redo the prefix with the online softmax."""
    cfg = NSAConfig(**{**CFG, "gating": gating})
    P, N = 150, 7
    q, k, v, pos, mask, gates = make_case(20, P, N, 2, 2, 16, DTYPES[0], cfg)
    q = q.float() * 8
    own = q.view(N, 2, 2, 16).mean(2).transpose(0, 1)           # [Hkv, N, D], each query's direction
    k = k.float()
    k[:, P:P + N] = (-30.0 if extreme == "overflow" else 60.0) * own / own.norm(dim=-1, keepdim=True)
    q, k = q.to(DTYPES[0]), k.to(DTYPES[0])
    ref = nsa_naive(q.float(), k.float(), v.float(), P, pos, mask, cfg, gates=gates)
    if extreme == "underflow":
        idx = ref.block_indices
        idx = torch.where(idx >= P // cfg.slc_block, 1 << 20, idx).sort(-1).values
        idx = torch.where(idx == 1 << 20, -1, idx)
        ref = nsa_naive(q.float(), k.float(), v.float(), P, pos, mask, cfg, gates=gates, block_indices=idx)
    gated = gating == "gated"
    o, lse_a, _ = nsa_verify(q.to(DEV), k.to(DEV), v.to(DEV), P, pos.to(DEV), mask.to(DEV),
                             ref.block_indices.to(DEV), cfg.slc_block, cfg.window, group_size=4,
                             gates=gates.to(DEV) if gated else None, o_cmp=ref.o_cmp.to(DEV) if gated else None,
                             out=torch.full_like(q, float("nan")).to(DEV), lazy=True)
    assert rel_err(o, ref.o) < tol(DTYPES[0])
    assert_lse(lse_a, ref.lse_slc if gated else torch.logaddexp(ref.lse_slc, ref.lse_win), 50 * tol(DTYPES[0]))


@pytest.mark.parametrize("gating", ["union", "gated"])
@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_verify_edge_cases(name, gating):
    """Bounds of the kernel's per-program work list, row splits, and degenerate windows and prefixes;
    each case with one KV split in one gating and three in the other."""
    seed, P, N, hkv, G, C, approx, over, chain, max_rows = EDGE_CASES[name]
    n_split = 1 if (seed + (gating == "gated")) % 2 == 0 else 3
    cfg = NSAConfig(**{**CFG, **over, "gating": gating})
    q, k, v, pos, mask, gates = make_case(seed, P, N, hkv, G, 16, DTYPES[0], cfg, chain=chain)
    ref = nsa_naive(q.float(), k.float(), v.float(), P, pos, mask, cfg, gates=gates)
    idx = _disjoint(ref.block_indices) if name.startswith("union at") else ref.block_indices
    if approx:
        idx = idx[torch.arange(N) // C * C]
    ref = nsa_naive(q.float(), k.float(), v.float(), P, pos, mask, cfg, gates=gates, block_indices=idx)
    gated = gating == "gated"
    tma = seed % 2 == 0 if not CUDA else None  # both load paths on the CPU; the default one on the GPU
    lazy = None if seed % 3 else approx        # and the other softmax in a third of the cases
    o, lse_a, lse_b = nsa_verify(q.to(DEV), k.to(DEV), v.to(DEV), P, pos.to(DEV), mask.to(DEV), idx.to(DEV),
                                 cfg.slc_block, cfg.window, group_size=C, approx=approx,
                                 gates=gates.to(DEV) if gated else None, o_cmp=ref.o_cmp.to(DEV) if gated else None,
                                 out=torch.full_like(q, float("nan")).to(DEV), n_split=n_split, tma=tma,
                                 max_rows=max_rows, lazy=lazy)
    assert rel_err(o, ref.o) < tol(DTYPES[0])
    assert_lse(lse_a, ref.lse_slc if gated else torch.logaddexp(ref.lse_slc, ref.lse_win), 50 * tol(DTYPES[0]))
    if gated:
        assert_lse(lse_b, ref.lse_win, 50 * tol(DTYPES[0]))


@pytest.mark.parametrize("C", [1, 4])
def test_verify_repeated_block_in_one_list_counts_once(C):
    """A list such as [a, a, c, ...] (ascending, not strictly) attends to block a once, like the reference."""
    cfg = NSAConfig(**CFG)
    q, k, v, pos, mask, _ = make_case(3, 150, 7, 2, 2, 16, DTYPES[0], cfg)
    idx = nsa_naive(q.float(), k.float(), v.float(), 150, pos, mask, cfg).block_indices.clone()
    idx[..., 1] = torch.where(idx[..., 1] >= 0, idx[..., 0], idx[..., 1])
    ref = nsa_naive(q.float(), k.float(), v.float(), 150, pos, mask, cfg, block_indices=idx)
    o, _, _ = nsa_verify(q.to(DEV), k.to(DEV), v.to(DEV), 150, pos.to(DEV), mask.to(DEV), idx.to(DEV),
                         cfg.slc_block, cfg.window, group_size=C, out=torch.full_like(q, float("nan")).to(DEV))
    assert rel_err(o, ref.o) < tol(DTYPES[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [
    (0, 150, 7, 2, 3, 16, None, {}),
    (1, 301, 9, 1, 4, 32, 3, {}),
    (2, 40, 5, 3, 1, 16, None, dict(forced_first=False, forced_local=1)),
    (3, 7, 4, 2, 2, 16, None, {}),
    (4, 200, 12, 2, 2, 16, 2, dict(cmp_block=16, cmp_stride=16, slc_block=16)),
    (5, 517, 40, 2, 8, 64, None, dict(n_select=5)),
    (6, 300, 6, 1, 2, 16, 2, dict(cmp_block=24, cmp_stride=8, slc_block=16, n_select=6)),  # A - 1 = R
    (7, 1100, 5, 1, 2, 16, 2, {}),   # 5 tiles of 64 compression blocks over 2 splits: several tile maxima a program
])
@pytest.mark.parametrize("form", ["split", "split, bisection", "split, two sweeps", "split, two sweeps, bisection"])
def test_route_matches_reference(case, dtype, form, monkeypatch):
    """Every launch form (KV splits, then a merging top-n launch, or an importance sweep and a top-n
    launch); the top-n of short rows (bitonic) and of long ones (bisection)."""
    import ssv.ops.nsa.route_policy as policy
    if "bisection" in form:
        monkeypatch.setattr(policy, "SORTED_MAX_BLOCKS", 0)
    if "two sweeps" in form:
        monkeypatch.setattr(policy, "ONE_SWEEP_MAX_BLOCKS", 0)
    seed, P, N, hkv, G, D, split, over = case
    tma = (seed + len(form)) % 2 == 0   # the tiles through descriptors or pointers, each form both ways
    cfg = NSAConfig(**{**CFG, **over})
    q, k, v, pos, mask, _ = make_case(seed, P, N, hkv, G, D, dtype, cfg)
    ref = nsa_naive(q.float(), k.float(), v.float(), P, pos, mask, cfg)
    nbpre = num_cmp_blocks(P, cfg)
    if nbpre:
        kc, vc = compress_mean(k.float(), nbpre, cfg), compress_mean(v.float(), nbpre, cfg)
    else:  # the kernels still need a real (never read) buffer
        kc = vc = torch.zeros(hkv, 1, D)
    w, s0, npath = path_block_weights(P, pos, mask, cfg)
    idx, imp, lse, o_cmp = nsa_route(q.to(DEV), kc.to(dtype).to(DEV), vc.to(dtype).to(DEV), nbpre, k.to(DEV),
                                     v.to(DEV), w.to(DEV), s0, npath.to(DEV), pos.to(DEV), cfg, want_o=True,
                                     n_split=split, tma=tma)
    idx, imp, lse, o_cmp = idx.cpu().long(), imp.cpu(), lse.cpu(), o_cmp.cpu()
    cand = torch.isfinite(ref.importance)
    assert torch.equal(torch.isfinite(imp), cand)
    assert (imp[cand] - ref.importance[cand]).abs().max() < 10 * tol(dtype)
    # the kernel's selection is exactly the tie-broken top-n of its own importance ...
    assert torch.equal(idx, select_blocks(imp, pos, cfg))
    # ... and equals the reference wherever the reference's n-th / (n+1)-th margin is clear
    if dtype == torch.float32:
        assert torch.equal(idx, ref.block_indices)
    assert_lse(lse, ref.lse_cmp, 50 * tol(dtype))
    assert rel_err(o_cmp, ref.o_cmp) < tol(dtype) or ref.o_cmp.norm() == 0


def test_route_without_path_blocks_matches_reference():
    """A step whose queries complete no path-specific block (host weights [N, 0, S]): routing over the
    committed blocks alone, with one sweep of the keys and with two."""
    cfg = NSAConfig(**{**CFG, **dict(cmp_block=32, cmp_stride=16)})
    P, N = 96, 9
    q, k, v, pos, mask, _ = make_case(3, P, N, 2, 2, 16, DTYPES[0], cfg)
    w, s0, npath = path_block_weights(P, pos, mask, cfg)
    assert w.shape[1] == 0
    ref = nsa_naive(q.float(), k.float(), v.float(), P, pos, mask, cfg)
    nb = num_cmp_blocks(P, cfg)
    kc, vc = compress_mean(k.float(), nb, cfg), compress_mean(v.float(), nb, cfg)
    for one_sweep in (True, False):
        idx, imp, lse, o_cmp = nsa_route(q.to(DEV), kc.to(DTYPES[0]).to(DEV), vc.to(DTYPES[0]).to(DEV), nb, k.to(DEV),
                                         v.to(DEV), w.to(DEV), s0, npath.to(DEV), pos.to(DEV), cfg, want_o=True,
                                         one_sweep=one_sweep)
        assert torch.equal(idx.cpu().long(), select_blocks(imp.cpu(), pos, cfg))
        assert_lse(lse.cpu(), ref.lse_cmp, 50 * tol(DTYPES[0]))
        assert rel_err(o_cmp, ref.o_cmp) < tol(DTYPES[0])


@pytest.mark.parametrize("dtype", [torch.float16] + ([torch.bfloat16] if CUDA else []))
@pytest.mark.parametrize("one_sweep", [True, False])
def test_route_scores_a_path_block_near_its_committed_twin(dtype, one_sweep):
    """On a half-precision cache the AR step at position t reads a block committed (kept in the cache's
    dtype), while a tree node at t scores it as a path-specific block in fp32 (a weighted sum of its
    slots' scores, never rounded). The two differ by the cache dtype's rounding of one key, no more:
    the last node of a chain over [P0, t] gets the AR step's importance to a few units of that rounding.
    (Rounding the path key as committing does closes the gap exactly but made a routing call 1.2-1.7x
    slower on the H200, bench/NOTES.md "Rounded path keys"; bf16 arithmetic elsewhere in a tree pass
    perturbs scores as much.)"""
    cfg = NSAConfig(**{**CFG, **dict(cmp_block=16, cmp_stride=8, slc_block=32, n_select=3, window=16)})
    gen = torch.Generator().manual_seed(11)
    t, m, hkv, G, D = 203, 40, 2, 3, 32
    k = (torch.randn(hkv, t + 1, D, generator=gen) * 3).to(dtype)
    v = torch.randn(hkv, t + 1, D, generator=gen).to(dtype)
    q = (torch.randn(1, hkv * G, D, generator=gen) * 3).to(dtype)

    def route(P, n):   # the step holds the last n tokens, a chain; the committed blocks as `commit` leaves them
        nb = num_cmp_blocks(P, cfg)
        kc = compress_mean(k.float(), max(nb, 1), cfg).to(dtype)
        vc = compress_mean(v.float(), max(nb, 1), cfg).to(dtype)
        pos = torch.arange(P, P + n)
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        w, s0, npath = path_block_weights(P, pos, mask, cfg)
        qq = torch.cat([torch.zeros(n - 1, hkv * G, D, dtype=dtype), q])
        idx, imp, _, _ = nsa_route(qq.to(DEV), kc.to(DEV), vc.to(DEV), nb, k.to(DEV), v.to(DEV), w.to(DEV), s0,
                                   npath.to(DEV), pos.to(DEV), cfg, one_sweep=one_sweep)
        return idx[-1].cpu(), imp[-1].cpu(), int(npath[-1])
    idx_ar, imp_ar, np_ar = route(t, 1)
    idx_tree, imp_tree, np_tree = route(t - m, m + 1)
    assert np_tree >= 4 > np_ar   # blocks committed for the AR step are path-specific for the node
    fin = torch.isfinite(imp_ar)
    assert torch.equal(fin, torch.isfinite(imp_tree))
    rel = ((imp_tree[fin] - imp_ar[fin]).abs() / imp_ar[fin].abs().clamp_min(1e-6)).max()
    assert rel < 16 * torch.finfo(dtype).eps   # a dropped or misweighted path block is off by O(1)
    if dtype == torch.float16:
        assert torch.equal(idx_tree, idx_ar)


def test_runner_triton_backend_matches_reference():
    """A whole tree step through the model: Triton plan == reference plan (strict), refresh/reuse too."""
    from ssv.attention import StepMeta, VerifyOptions
    from ssv.config import ModelConfig
    from ssv.engine.runner import Runner
    from ssv.model import Transformer

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, hidden_size=48, intermediate_size=64, n_layers=3, n_heads=6, n_kv_heads=2,
                      head_dim=16, max_seq_len=256)
    model = Transformer(cfg).to(DEV).eval()
    nsa = NSAConfig(**CFG)
    ids = torch.randint(0, 64, (150,)).tolist()
    gen = torch.Generator().manual_seed(1)
    depth, mask = rand_tree(11, gen)
    toks = torch.randint(0, 64, (11,))
    outs = {}
    for backend in ("reference", "triton"):
        for refresh in (None, (True, False, False)):
            r = Runner(model, attention="nsa", nsa=nsa, backend="reference")
            r.prefill(ids, chunk=64)  # the prefix is not under test; the interpreter is slow
            r.backend = backend
            meta = StepMeta(r.length, r.length + depth, mask)
            logits, _ = r.forward(toks, meta, VerifyOptions(group_size=4, refresh=refresh))
            outs[backend, refresh] = logits.cpu()
    for refresh in (None, (True, False, False)):
        assert rel_err(outs["triton", refresh], outs["reference", refresh]) < (1e-4 if not CUDA else 2e-2)
    assert rel_err(outs["reference", (True, False, False)], outs["reference", None]) > 0  # reuse changes routing


@pytest.mark.parametrize("bad, msg", [
    (dict(D=24), "head dim"),
    (dict(G=17), "GQA group size"),
    (dict(C=3), "group size C"),
    (dict(N=129), "verification queries"),
])
def test_verify_rejects_unsupported_shapes(bad, msg):
    p = dict(D=16, G=2, C=2, N=5)
    p.update(bad)
    q = torch.randn(p["N"], p["G"], p["D"])
    k = torch.randn(1, 200, p["D"])
    pos = torch.arange(100, 100 + p["N"])
    mask = torch.ones(p["N"], p["N"], dtype=torch.bool).tril()
    idx = torch.zeros(p["N"], 1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=msg):
        nsa_verify(q, k, k, 100, pos, mask, idx, 16, 20, group_size=p["C"])


def test_verify_default_launch_is_the_fixed_table():
    from ssv.ops.nsa.verify_policy import launch_config
    assert launch_config(16, 128, False) == dict(num_warps=4, num_stages=3)   # C = 4 at G = 4
    assert launch_config(32, 128, False)["num_warps"] == 4                    # 8 warps measured slower
    assert launch_config(64, 128, False)["num_warps"] == 8                    # exact 64-row tiles
    assert launch_config(64, 128, True)["num_warps"] == 4                     # approximate ones
    assert launch_config(128, 64, False)["num_warps"] == 8
    assert launch_config(128, 128, False) == dict(num_warps=8, num_stages=2)  # unmeasured: the old fallback


def test_verify_launch_plan_sizes_its_scratch():
    """One plan sizes the grid, the counters (folded merges only) and the partial states (KV splits only)."""
    from ssv.ops.nsa.verify_policy import num_counters, plan_launch
    # 9 queries, 6 query heads over 2 KV heads, d = 16, 4 selected 16-key blocks, window 20, P = 300, C = 2
    args = (9, 6, 2, 16, 4, 16, 20, 300, 2, False, False, False, True)
    for n_split, fold, states in ((1, False, 0), (2, True, 2 * 9 * 6 * 2), (3, False, 3 * 9 * 6 * 2)):
        lp = plan_launch(*args, n_split=n_split)
        assert lp.grid == (5, 2, n_split) and lp.n_split == n_split and lp.fold == fold
        assert lp.counters == (num_counters(9, 6, 2, 2) if fold else 0) and lp.states == states
        assert (lp.consts["SPLIT"], lp.consts["FOLD"]) == (n_split > 1, fold)
    assert plan_launch(*args, n_split=3, fold=True).counters == 10
    # the heuristic: one wave of the programs that fit on the 4 SMs given (10 programs, 11 items at most)
    assert plan_launch(*args).n_split == 1                                   # 3 per SM (the interpreter's)
    lp = plan_launch(*args, fit=lambda consts, cfg, folded: 6)               # 24 // 10: folded
    assert (lp.n_split, lp.fold) == (2, True)
    lp = plan_launch(*args, fit=lambda consts, cfg, folded: 9 if folded else 12)
    assert (lp.n_split, lp.fold) == (4, False)   # folded 36 // 10 = 3 > FOLD_MAX_SPLITS: unfolded, 48 // 10


@triton.jit
def _ranges_kernel(out, n_it, n_tree, NSPLIT, TREE_COST: tl.constexpr):
    i_k = tl.program_id(0)
    lo, hi = _item_range(n_it, n_tree, i_k, NSPLIT, TREE_COST)
    tl.store(out + 2 * i_k, lo)
    tl.store(out + 2 * i_k + 1, hi)


def test_verify_item_ranges_cover_the_items_once_and_lighten_split_zero():
    """The KV splits' runs of work items (the kernel's `_item_range` against the policy's `item_ranges`):
    every item in exactly one run, split 0 (which also takes the tree's tiles) at most its balanced
    share, no other split more than one item above another's."""
    from ssv.ops.nsa.verify_policy import item_ranges
    gen = torch.Generator().manual_seed(5)
    cases = [(0, 1, 3, 4), (5, 1, 3, 4), (33, 1, 11, 4), (72, 1, 2, 4), (7, 2, 1, 4), (40, 3, 6, 0), (3, 1, 8, 2)]
    cases += [tuple(int(x) for x in (torch.randint(0, 90, (1,), generator=gen), torch.randint(1, 4, (1,), generator=gen),
                                     torch.randint(1, 14, (1,), generator=gen), torch.randint(0, 7, (1,), generator=gen)))
              for _ in range(12)]
    for n_it, n_tree, S, cost in cases:
        want = item_ranges(n_it, n_tree, S, cost)
        out = torch.full((2 * S,), -7, dtype=torch.int32, device=DEV)
        _ranges_kernel[(S,)](out, n_it, n_tree, S, TREE_COST=cost)
        got = [tuple(r) for r in out.view(S, 2).cpu().tolist()]
        assert got == want, (n_it, n_tree, S, cost)
        covered = [i for lo, hi in got for i in range(lo, hi)]
        assert covered == list(range(n_it)), (n_it, n_tree, S, cost)   # in order, each once
        share = -(-(n_it + cost * n_tree) // S)
        assert got[0][1] - got[0][0] <= max(share - cost * n_tree, 0)
        sizes = [hi - lo for lo, hi in got[1:]]
        if sizes:
            assert max(sizes) - min(sizes) <= 1


def test_verify_folds_only_few_splits_by_default(monkeypatch):
    """Default merge: folded for at most FOLD_MAX_SPLITS KV splits, a combine launch beyond (one
    program merging many splits measured slower than the launch); fold=True/False override."""
    from ssv.ops.nsa import verify as V
    launched = []
    real = V.nsa_verify_combine_kernel

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            return real[grid]
    monkeypatch.setattr(V, "nsa_verify_combine_kernel", Spy())
    cfg = NSAConfig(**CFG)
    q, k, v, pos, mask, _ = make_case(70, 300, 9, 2, 2, 16, DTYPES[0], cfg)
    ref = nsa_naive(q.float(), k.float(), v.float(), 300, pos, mask, cfg)
    for n_split, fold, combine in ((2, None, False), (3, None, True), (3, True, False), (2, False, True)):
        launched.clear()
        o, _, _ = nsa_verify(q.to(DEV), k.to(DEV), v.to(DEV), 300, pos.to(DEV), mask.to(DEV),
                             ref.block_indices.to(DEV), cfg.slc_block, cfg.window, group_size=4,
                             out=torch.full_like(q, float("nan")).to(DEV), n_split=n_split, fold=fold)
        assert bool(launched) == combine, (n_split, fold)
        assert rel_err(o, ref.o) < tol(DTYPES[0])


def test_verify_lazy_split_that_holds_none_of_a_rows_keys_does_not_redo():
    """A KV split holds a few of its group's items; a row of a query that selected none of them has an
    empty sum there, which is no underflow. Until a7158b8 the lazy check asked about the group's items
    and sent such splits through the online redo (18 of 108 programs here, 138 of 396 at 4K / 48);
    scripts/verify_redo_count.py counts the programs that redo, in the interpreter."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PROBE_T": "1024", "PROBE_N": "24", "N_SPLIT": "6",
           "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, os.path.join(root, "scripts", "verify_redo_count.py"), "--one"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "grid (6, 3, 6): 0 of 108 programs redo" in r.stdout, r.stdout
