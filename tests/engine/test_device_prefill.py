"""`DeviceEngine.prefill`: the prompt as fixed chunks of PREFILL_CHUNK rows (graphed on CUDA) leaves
the cache, the logits and the taps as `Runner.prefill` does."""
import pytest
import torch

from ssv.config import NSAConfig
from ssv.draft import Eagle3Drafter
from ssv.engine.device_round import PREFILL_CHUNK, DeviceEngine
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.engine.spec import SpecOptions, generate_spec
from ssv.spec.accept import SamplingParams
from ssv.spec.tree import TreeSpec

from ..draft.helpers import tiny_head, tiny_target

# compressed blocks of 8 at stride 4: a chunk completes many, and its edges cut blocks
NSA = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=16, n_select=4, forced_local=1, window=16)
GREEDY = SamplingParams(temperature=0.0)
def CUDA(fn):   # CUDA-only: marked (pytest -m cuda) and skipped without a GPU
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")(fn))


def _runner(device, attention="nsa", dtype=torch.float32, layers=3):
    target = tiny_target(vocab=80, layers=layers, head_dim=16).to(device, dtype)
    return target, Runner(target, attention=attention, nsa=NSA, max_len=420)


def _check_same_cache(a: Runner, b: Runner, tol):
    assert a.length == b.length == int(b.cache.dlen)   # b: the device prefill
    L = a.length
    torch.testing.assert_close(a.cache.k[:, :, :L], b.cache.k[:, :, :L], **tol)
    torch.testing.assert_close(a.cache.v[:, :, :L], b.cache.v[:, :, :L], **tol)
    if a.cache.nsa is not None:
        nb = a.cache.n_cmp
        assert nb == b.cache.n_cmp and (nb > 0) == (L >= NSA.cmp_block)
        torch.testing.assert_close(a.cache.k_cmp[:, :, :nb], b.cache.k_cmp[:, :, :nb], **tol)
        torch.testing.assert_close(a.cache.v_cmp[:, :, :nb], b.cache.v_cmp[:, :, :nb], **tol)


def _prefill_pair(device, n, attention="nsa", graphs=False, dtype=torch.float32, start=0):
    target, host = _runner(device, attention, dtype)
    _, dev_r = _runner(device, attention, dtype)
    taps = (0, 2)
    ids = torch.randint(0, 80, (start + n,), generator=torch.Generator().manual_seed(n)).tolist()
    eng = DeviceEngine(dev_r, graphs=graphs)
    if start:   # a cache that already holds text (the chunks start mid-block)
        host.prefill(ids[:start])
        dev_r.prefill(ids[:start])
    # the device run's slots NaN past what the host wrote: every slot it keeps must be its own
    dev_r.cache.k[:, :, dev_r.length:].fill_(float("nan"))
    dev_r.cache._cmp.fill_(float("nan")) if start == 0 and attention == "nsa" else None
    want, want_taps = host.prefill(ids[start:], taps=taps)
    got, got_taps = eng.prefill(ids[start:], taps=taps)
    return host, dev_r, (want, want_taps), (got, got_taps)


@pytest.mark.parametrize("n", [1, 37, PREFILL_CHUNK, 2 * PREFILL_CHUNK + 45])
@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_device_prefill_equals_the_host_prefill(n, attention):
    host, dev, (want, want_taps), (got, got_taps) = _prefill_pair("cpu", n, attention)
    tol = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, want, **tol)
    _check_same_cache(host, dev, tol)
    got_t = [torch.cat([c[i] for c in got_taps]) for i in range(2)]
    want_t = [torch.cat([c[i] for c in want_taps]) for i in range(2)]
    for g, w in zip(got_t, want_t):
        assert g.shape == w.shape == (n, w.shape[-1])
        torch.testing.assert_close(g, w, **tol)


def test_device_prefill_after_text_and_refusals():
    host, dev, (want, _), (got, _) = _prefill_pair("cpu", 150, start=61)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    _check_same_cache(host, dev, dict(rtol=1e-4, atol=1e-4))
    eng = DeviceEngine(dev, graphs=False)
    with pytest.raises(ValueError, match="empty prompt"):
        eng.prefill([])
    with pytest.raises(ValueError, match="does not fit"):
        eng.prefill([1] * (dev.context_limit - dev.length + 1))
    assert dev.length == 211 and int(dev.cache.dlen) == 211   # nothing moved
    _, small = _runner("cpu")
    small.cache.scratch = 64
    with pytest.raises(ValueError, match="scratch"):
        DeviceEngine(small, graphs=False).prefill([1, 2, 3])


@CUDA
@pytest.mark.parametrize("n", [5, PREFILL_CHUNK, 3 * PREFILL_CHUNK - 1])
@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_cuda_graphed_prefill_equals_the_host_prefill(n, attention):
    """Graph replay (one capture, replayed per chunk) against the host's prefill (NSA: eager kernels;
    dense: the reference)."""
    host, dev, (want, want_taps), (got, got_taps) = _prefill_pair("cuda", n, attention, graphs=True)
    tol = dict(rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(got, want, **tol)
    _check_same_cache(host, dev, tol)
    for i in range(2):   # the chunks differ (the host's dense prefill takes 256 rows a chunk)
        g, w = (torch.cat([c[i] for c in t]) for t in (got_taps, want_taps))
        assert g.shape == w.shape == (n, w.shape[-1])
        torch.testing.assert_close(g, w, **tol)


@CUDA
def test_cuda_generation_with_the_graphed_prefill_keeps_the_ar_tokens():
    target, r = _runner("cuda", layers=4)   # an EAGLE-3 head taps 3 distinct layers
    prompt = torch.randint(3, 80, (300,), generator=torch.Generator().manual_seed(9)).tolist()
    ar = generate_ar(r, prompt, GREEDY, 40)                       # host prefill, host steps
    eng = DeviceEngine(r)
    assert generate_ar(r, prompt, GREEDY, 40, engine=eng).token_ids == ar.token_ids
    assert any(k[0] == "prefill" for k in eng._graphs)
    d = Eagle3Drafter(tiny_head(target, draft_vocab=40).cuda(), target)
    eng = DeviceEngine(r, d)
    res = generate_spec(r, d, prompt, GREEDY, 40, opts=SpecOptions(tree=TreeSpec(3, 2, 6)), engine=eng)
    assert res.token_ids == ar.token_ids


@CUDA
def test_cuda_prefill_graphs_with_and_without_taps_keep_their_own_outputs():
    """Two prefill graphs (AR's without taps, speculation's with them) on one engine, alternating:
    each reads its own graph's logits (a shared output slot once returned the other graph's)."""
    target, r = _runner("cuda")
    eng = DeviceEngine(r)
    a = torch.randint(0, 80, (200,), generator=torch.Generator().manual_seed(1)).tolist()
    b = torch.randint(0, 80, (170,), generator=torch.Generator().manual_seed(2)).tolist()
    want = {}
    for ids in (a, b):
        for taps in ((), (0, 2)):
            r.reset()
            want[len(ids), taps] = r.prefill(ids, taps=taps)[0]
    for ids, taps in ((a, ()), (a, (0, 2)), (b, ()), (b, (0, 2)), (a, ())):
        r.reset()
        got = eng.prefill(ids, taps=taps)[0]
        torch.testing.assert_close(got, want[len(ids), taps], rtol=1e-3, atol=1e-3)
    assert {k for k in eng._graphs} == {("prefill", ()), ("prefill", (0, 2))}


def test_which_prefill_a_generation_takes():
    """The engine's chunks on CUDA (graphs on or off) when the scratch holds a chunk; the runner's
    prefill on the CPU, without an engine, or with a smaller scratch."""
    from types import SimpleNamespace

    from ssv.engine.generate import prefill_of

    def runner(dev, scratch):
        return SimpleNamespace(device=torch.device(dev), cache=SimpleNamespace(scratch=scratch), prefill="runner")
    eng = SimpleNamespace(prefill="engine")
    assert prefill_of(runner("cuda", PREFILL_CHUNK), eng) == "engine"
    assert prefill_of(runner("cuda", PREFILL_CHUNK - 1), eng) == "runner"
    assert prefill_of(runner("cuda", 256), None) == "runner"
    assert prefill_of(runner("cpu", 256), eng) == "runner"
