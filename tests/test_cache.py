"""KVCache: in-place commits, draft-path compaction, incrementally maintained compressed K/V, errors."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ssv.cache import KVCache
from ssv.config import NSAConfig

LAYERS, HKV, D = 2, 2, 8


def rand_kv(n: int, gen: torch.Generator, dtype=torch.float32):
    """A step's new K and V for every layer: [Lyr, N, Hkv, D] each."""
    k = torch.randn(LAYERS, n, HKV, D, generator=gen).to(dtype)
    v = torch.randn(LAYERS, n, HKV, D, generator=gen).to(dtype)
    return k, v


def write_step(cache: KVCache, k: torch.Tensor, v: torch.Tensor) -> None:
    for layer in range(LAYERS):
        cache.write(layer, k[layer], v[layer])


def committed(cache: KVCache):
    """Committed K/V as [Lyr, Hkv, length, D]."""
    return cache.k[:, :, : cache.length], cache.v[:, :, : cache.length]


def expected_compressed(seq: torch.Tensor, cfg: NSAConfig) -> torch.Tensor:
    """Mean pooling written out block by block: seq [Lyr, Hkv, T, D] -> [Lyr, Hkv, n_blocks, D]."""
    t = seq.shape[2]
    blocks = []
    i = 0
    while i * cfg.cmp_stride + cfg.cmp_block <= t:
        lo = i * cfg.cmp_stride
        blocks.append(seq[:, :, lo: lo + cfg.cmp_block].double().mean(2))
        i += 1
    if not blocks:
        return seq.new_zeros(seq.shape[0], seq.shape[1], 0, seq.shape[3])
    return torch.stack(blocks, 2).to(seq.dtype)


def assert_compressed_ok(cache: KVCache, ref_k: torch.Tensor, ref_v: torch.Tensor, cfg: NSAConfig, atol=1e-6):
    want_k, want_v = expected_compressed(ref_k, cfg), expected_compressed(ref_v, cfg)
    assert cache.n_cmp == want_k.shape[2], (cache.n_cmp, want_k.shape[2], cache.length)
    torch.testing.assert_close(cache.k_cmp[:, :, : cache.n_cmp], want_k, atol=atol, rtol=0)
    torch.testing.assert_close(cache.v_cmp[:, :, : cache.n_cmp], want_v, atol=atol, rtol=0)


# ============================================================================ commit / commit_path
def test_commit_in_place_keeps_written_slots():
    gen = torch.Generator().manual_seed(torch.seed())
    cache = KVCache(LAYERS, HKV, D, max_len=64, scratch=16)
    k, v = rand_kv(10, gen)
    write_step(cache, k, v)
    assert cache.length == 0  # writing commits nothing
    cache.commit(7)
    assert cache.length == 7
    ck, cv = committed(cache)
    assert torch.equal(ck, k[:, :7].transpose(1, 2)) and torch.equal(cv, v[:, :7].transpose(1, 2))
    # the next step starts right after the committed tokens, overwriting the 3 uncommitted ones
    k2, v2 = rand_kv(3, gen)
    write_step(cache, k2, v2)
    assert torch.equal(cache.k[:, :, 7:10], k2.transpose(1, 2))
    assert torch.equal(cache.k[:, :, :7], ck) and torch.equal(cache.v[:, :, :7], cv)


@pytest.mark.parametrize("n_tree", [1, 7, 16])
def test_commit_path_compacts_accepted_nodes(n_tree):
    gen = torch.Generator().manual_seed(torch.seed())
    cache = KVCache(LAYERS, HKV, D, max_len=64, scratch=16)
    kp, vp = rand_kv(9, gen)
    write_step(cache, kp, vp)
    cache.commit(9)
    before_k, before_v = cache.k[:, :, :9].clone(), cache.v[:, :, :9].clone()
    k, v = rand_kv(n_tree, gen)  # a draft tree's nodes, in flattened order
    write_step(cache, k, v)
    size = int(torch.randint(0, n_tree, (), generator=gen))
    path = [0] + sorted((1 + torch.randperm(n_tree - 1, generator=gen)[:size]).tolist())  # root first
    cache.commit_path(path)
    a = len(path)
    assert cache.length == 9 + a
    assert torch.equal(cache.k[:, :, :9], before_k) and torch.equal(cache.v[:, :, :9], before_v)
    for j, node in enumerate(path):
        assert torch.equal(cache.k[:, :, 9 + j], k[:, node]), (path, j)
        assert torch.equal(cache.v[:, :, 9 + j], v[:, node]), (path, j)


def test_commit_path_example():
    gen = torch.Generator().manual_seed(torch.seed())
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, slc_block=4, n_select=2, forced_local=1, window=4)
    cache = KVCache(LAYERS, HKV, D, max_len=32, scratch=8, nsa=cfg)
    k0, v0 = rand_kv(5, gen)
    write_step(cache, k0, v0)
    cache.commit(5)
    k, v = rand_kv(7, gen)
    write_step(cache, k, v)
    cache.commit_path([0, 2, 5])
    want_k = torch.cat([k0, k[:, [0, 2, 5]]], 1).transpose(1, 2)
    want_v = torch.cat([v0, v[:, [0, 2, 5]]], 1).transpose(1, 2)
    ck, cv = committed(cache)
    assert torch.equal(ck, want_k) and torch.equal(cv, want_v)
    # compression blocks [0,4), [2,6): block 1 holds committed path nodes 0 (slot 5)
    assert cache.n_cmp == 3
    assert_compressed_ok(cache, want_k, want_v, cfg)


def test_commit_path_of_chain_prefix_equals_commit():
    gen = torch.Generator().manual_seed(torch.seed())
    cfg = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=8, n_select=2, forced_local=1, window=4)
    a = KVCache(LAYERS, HKV, D, max_len=40, scratch=8, nsa=cfg)
    b = KVCache(LAYERS, HKV, D, max_len=40, scratch=8, nsa=cfg)
    for n in (6, 8, 3, 8):
        k, v = rand_kv(n, gen)
        write_step(a, k, v)
        write_step(b, k, v)
        m = max(1, n - 2)
        a.commit(m)
        b.commit_path(list(range(m)))
        assert a.length == b.length and a.n_cmp == b.n_cmp
        assert torch.equal(a.k[:, :, : a.length], b.k[:, :, : b.length])
        assert torch.equal(a.k_cmp[:, :, : a.n_cmp], b.k_cmp[:, :, : b.n_cmp])
        assert torch.equal(a.v_cmp[:, :, : a.n_cmp], b.v_cmp[:, :, : b.n_cmp])


# ============================================================================ compressed K/V (property)
@st.composite
def nsa_configs(draw):
    stride = draw(st.sampled_from([1, 2, 3, 4, 8]))
    block = stride * draw(st.integers(1, 3))
    return NSAConfig(cmp_block=block, cmp_stride=stride, slc_block=stride * draw(st.integers(1, 3)),
                     n_select=4, forced_local=1, window=8)


@settings(max_examples=60, deadline=None)
@given(cfg=nsa_configs(), data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_compressed_blocks_are_mean_pools_after_any_commits(cfg, data, seed):
    gen = torch.Generator().manual_seed(seed)
    max_len, scratch = data.draw(st.integers(8, 60), label="max_len"), data.draw(st.integers(1, 12), label="scratch")
    cache = KVCache(LAYERS, HKV, D, max_len=max_len, scratch=scratch, nsa=cfg)
    assert cache.k_cmp.shape[2] == (0 if max_len < cfg.cmp_block else (max_len - cfg.cmp_block) // cfg.cmp_stride + 1)
    ref_k = torch.zeros(LAYERS, HKV, 0, D)
    ref_v = torch.zeros(LAYERS, HKV, 0, D)
    for _ in range(data.draw(st.integers(1, 12), label="steps")):
        room = max_len + scratch - cache.length
        n_new = data.draw(st.integers(1, min(scratch, room)), label="n_new")
        k, v = rand_kv(n_new, gen)
        write_step(cache, k, v)
        fits = max_len - cache.length
        if data.draw(st.booleans(), label="tree"):
            nodes = data.draw(st.lists(st.integers(0, n_new - 1), unique=True, max_size=min(n_new, fits)),
                              label="path")
            nodes = sorted(nodes)
            cache.commit_path(nodes)
        else:
            nodes = list(range(data.draw(st.integers(0, min(n_new, fits)), label="n_commit")))
            cache.commit(len(nodes))
        ref_k = torch.cat([ref_k, k[:, nodes].transpose(1, 2)], 2)
        ref_v = torch.cat([ref_v, v[:, nodes].transpose(1, 2)], 2)
        assert cache.length == ref_k.shape[2]
        ck, cv = committed(cache)
        assert torch.equal(ck, ref_k) and torch.equal(cv, ref_v)
        assert_compressed_ok(cache, ref_k, ref_v, cfg)
        if cache.length == max_len:
            break


def test_compressed_bf16_cache():
    gen = torch.Generator().manual_seed(torch.seed())
    cfg = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=8, n_select=2, forced_local=1, window=4)
    cache = KVCache(LAYERS, HKV, D, max_len=48, scratch=8, nsa=cfg, dtype=torch.bfloat16)
    for n in (5, 8, 8, 1, 7):
        k, v = rand_kv(n, gen, torch.bfloat16)
        write_step(cache, k, v)
        cache.commit(n)
    ck, cv = committed(cache)
    # means taken in fp32 of the stored bf16 values, then rounded once to bf16
    assert_compressed_ok(cache, ck, cv, cfg, atol=0)


def test_no_nsa_means_no_compressed_cache():
    cache = KVCache(LAYERS, HKV, D, max_len=32, scratch=4)
    write_step(cache, *rand_kv(20, torch.Generator().manual_seed(0)))
    cache.commit(20)
    assert cache.k_cmp.shape[2] == 0 and cache.n_cmp == 0


def test_reset():
    cfg = NSAConfig(cmp_block=4, cmp_stride=4, slc_block=4, n_select=2, forced_local=1, window=4)
    cache = KVCache(LAYERS, HKV, D, max_len=32, scratch=4, nsa=cfg)
    write_step(cache, *rand_kv(20, torch.Generator().manual_seed(torch.seed())))
    cache.commit(20)
    cache.reset()
    assert cache.length == 0 and cache.n_cmp == 0
    k, v = rand_kv(9, torch.Generator().manual_seed(torch.seed()))
    write_step(cache, k, v)
    cache.commit(9)
    ck, cv = committed(cache)
    assert_compressed_ok(cache, ck, cv, cfg)
    assert torch.equal(ck, k.transpose(1, 2))


# ============================================================================ errors
def _snapshot(cache: KVCache):
    return (cache.length, cache.n_cmp, cache.k.clone(), cache.v.clone(), cache.k_cmp.clone(), cache.v_cmp.clone())


def _assert_committed_unchanged(cache: KVCache, snap):
    length, n_cmp, k, v, kc, vc = snap
    assert cache.length == length and cache.n_cmp == n_cmp
    assert torch.equal(cache.k[:, :, :length], k[:, :, :length])
    assert torch.equal(cache.v[:, :, :length], v[:, :, :length])
    assert torch.equal(cache.k_cmp, kc) and torch.equal(cache.v_cmp, vc)


def _filled(max_len=16, scratch=8, n=10):
    cfg = NSAConfig(cmp_block=4, cmp_stride=2, slc_block=4, n_select=2, forced_local=1, window=4)
    cache = KVCache(LAYERS, HKV, D, max_len=max_len, scratch=scratch, nsa=cfg)
    write_step(cache, *rand_kv(n, torch.Generator().manual_seed(torch.seed())))
    cache.commit(n)
    return cache


def test_commit_past_max_len_rejected():
    cache = _filled()
    write_step(cache, *rand_kv(8, torch.Generator().manual_seed(1)))  # fits max_len + scratch
    snap = _snapshot(cache)
    with pytest.raises(ValueError, match=r"context limit: 10 \+ 7 tokens exceed 16"):
        cache.commit(7)
    _assert_committed_unchanged(cache, snap)
    with pytest.raises(ValueError, match="context limit"):
        cache.commit_path([0, 1, 2, 3, 4, 5, 6])
    assert cache.length == 10
    cache.commit(6)  # exactly up to max_len is fine
    assert cache.length == 16


@pytest.mark.parametrize("path", [[0, 2, 2], [1, 0], [0, 3, 1, 4]])
def test_commit_path_must_be_strictly_increasing(path):
    cache = _filled()
    write_step(cache, *rand_kv(5, torch.Generator().manual_seed(2)))
    snap = _snapshot(cache)
    with pytest.raises(ValueError, match="strictly increasing"):
        cache.commit_path(path)
    _assert_committed_unchanged(cache, snap)
    assert torch.equal(cache.k[:, :, 10:15], snap[2][:, :, 10:15])  # the tree is untouched too


def test_overflowing_scratch_rejected():
    cache = _filled(max_len=16, scratch=8, n=10)
    snap = _snapshot(cache)
    k, v = rand_kv(15, torch.Generator().manual_seed(3))  # 10 + 15 > 16 + 8
    with pytest.raises(ValueError, match=r"KV cache full: 10 committed \+ 15 new tokens exceed 16 \+ 8 scratch"):
        cache.write(0, k[0], v[0])
    with pytest.raises(ValueError, match="KV cache full"):
        cache.check_room(15)
    _assert_committed_unchanged(cache, snap)
    assert torch.equal(cache.k, snap[2]) and torch.equal(cache.v, snap[3])  # nothing written at all
    cache.check_room(14)  # 10 + 14 = 24 fits


def test_bad_construction():
    with pytest.raises(ValueError, match="max_len must be positive"):
        KVCache(1, 1, 8, max_len=0)
    with pytest.raises(ValueError, match="scratch non-negative"):
        KVCache(1, 1, 8, max_len=8, scratch=-1)
