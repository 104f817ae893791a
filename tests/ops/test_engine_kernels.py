"""The device round through the Triton kernels (interpreter on the CPU, compiled on a GPU): the same
tokens as AR on the reference ops; on CUDA, graph replay equals the eager round."""
import pytest
import torch

from ssv.engine.device_round import DeviceEngine
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.engine.spec import SpecOptions, generate_spec
from ssv.spec.tree import TreeSpec

from ssv.draft import Eagle3Drafter

from ..conftest import make_tiny_model
from ..draft.helpers import tiny_head
from ..engine.test_device_round import GREEDY, NSA, OracleDeviceDrafter
from .test_nsa_kernels import DEV

CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_kernel_round_emits_reference_ar_tokens(attention):
    target = make_tiny_model(1, vocab=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16).to(DEV)
    ref = Runner(target, attention=attention, nsa=NSA, max_len=160, backend="reference")
    prompt = torch.randint(0, 64, (44,), generator=torch.Generator().manual_seed(2)).tolist()
    ar = generate_ar(ref, prompt, GREEDY, 7)
    r = Runner(target, attention=attention, nsa=NSA, max_len=160, backend="triton")
    assert generate_ar(r, prompt, GREEDY, 7, engine=DeviceEngine(r, graphs=False, check_sync=True)).token_ids == ar.token_ids
    d = OracleDeviceDrafter(ar.token_ids, len(prompt), 64, device=DEV)
    res = generate_spec(r, d, prompt, GREEDY, 7, opts=SpecOptions(tree=TreeSpec(4, 2, 8)),
                        engine=DeviceEngine(r, d, graphs=False, check_sync=True))
    assert res.token_ids == ar.token_ids and res.stats["mean_accepted_length"] > 1.5


def test_kernel_round_with_the_fused_eagle3_drafter_emits_ar_tokens():
    """The real drafter on its fused layer (glue kernels, top-k and accept kernels) in the kernel round:
    strict verification keeps AR's tokens whatever the draft proposes."""
    target = make_tiny_model(1, vocab=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16).to(DEV)
    ref = Runner(target, attention="nsa", nsa=NSA, max_len=200, backend="reference")
    prompt = torch.randint(0, 64, (33,), generator=torch.Generator().manual_seed(6)).tolist()
    ar = generate_ar(ref, prompt, GREEDY, 5)
    r = Runner(target, attention="nsa", nsa=NSA, max_len=200, backend="triton")
    d = Eagle3Drafter(tiny_head(target, draft_vocab=40), target, fused=True)
    res = generate_spec(r, d, prompt, GREEDY, 5, opts=SpecOptions(tree=TreeSpec(3, 2, 6)),
                        engine=DeviceEngine(r, d, graphs=False, check_sync=True))
    assert res.token_ids == ar.token_ids


def _bf16_eagle3_case(seed):
    """A bf16 target on CUDA, a 70-token prompt from `seed` and a tiny EAGLE-3 head (window 16)."""
    target = make_tiny_model(1, vocab=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16).cuda().to(torch.bfloat16)
    prompt = torch.randint(0, 64, (70,), generator=torch.Generator().manual_seed(seed)).tolist()
    return target, prompt, tiny_head(target, draft_vocab=40, window=16)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_graph_replay_equals_eager_eagle3_round():
    """The real drafter's three graphs (draft on the fused layer, verify, accept + commit) against the
    same rounds run eagerly: the same tokens, rounds and committed draft rows."""
    target, prompt, head = _bf16_eagle3_case(7)
    outs = {}
    for graphs in (False, True):
        r = Runner(target, attention="nsa", nsa=NSA, max_len=200)
        d = Eagle3Drafter(head, target)
        eng = DeviceEngine(r, d, graphs=graphs)
        sp = generate_spec(r, d, prompt, GREEDY, 80, opts=SpecOptions(tree=TreeSpec(5, 3, 16)), engine=eng)
        if graphs:
            assert not eng._eager and {k[0] for k in eng._graphs} == {"prefill", "draft", "verify", "accept"}
        outs[graphs] = (sp.token_ids, sp.stats["rounds"], d.k[:16].float().cpu(), d.slot_pos.cpu())
    assert outs[True][0] == outs[False][0] and outs[True][1] == outs[False][1]
    assert torch.equal(outs[True][3], outs[False][3])
    torch.testing.assert_close(outs[True][2], outs[False][2])


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_graph_replay_equals_eager_fallback_rounds():
    """Rounds interleaved with AR steps that keep the drafter's rows (their own graph, the ring caught
    up before each round): graphed equals eager, and the drafter ends where the eager one does."""
    from ssv.spec.fallback import ArFallback
    target, prompt, head = _bf16_eagle3_case(8)
    outs = {}
    for graphs in (False, True):
        r = Runner(target, attention="nsa", nsa=NSA, max_len=260)
        d = Eagle3Drafter(head, target)
        eng = DeviceEngine(r, d, graphs=graphs)
        fb = ArFallback(slack=0, min_ar=5, max_ar=20, prior_break_even=50.0)
        fb.break_even = lambda: 50.0
        sp = generate_spec(r, d, prompt, GREEDY, 90, opts=SpecOptions(tree=TreeSpec(5, 3, 16)), engine=eng,
                           fallback=fb)
        eng.catch_up()
        if graphs:
            assert not eng._eager and ("ar", None, True) in eng._graphs and ("catch-up", 3) in eng._graphs
        assert sp.stats["ar_steps"] > 40
        outs[graphs] = (sp.token_ids, sp.stats["rounds"], d.dlogp_buf.float().cpu(), d.slot_pos.cpu(), int(d.dlen))
    assert outs[True][0] == outs[False][0] and outs[True][1] == outs[False][1]
    assert torch.equal(outs[True][3], outs[False][3]) and outs[True][4] == outs[False][4] >= 70 + 89
    torch.testing.assert_close(outs[True][2], outs[False][2])


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_graph_replay_equals_eager_round(attention):
    """Rounds crossing compression- and selection-block boundaries, up to a tree depth of the context
    limit: the graphed engine emits what the eager one does, and its cache holds the same keys."""
    target = make_tiny_model(1, vocab=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16).cuda().to(torch.bfloat16)
    prompt = torch.randint(0, 64, (70,), generator=torch.Generator().manual_seed(2)).tolist()
    outs = {}
    for graphs in (False, True):
        r = Runner(target, attention=attention, nsa=NSA, max_len=150)
        ar = generate_ar(r, prompt, GREEDY, 40, engine=DeviceEngine(r, graphs=graphs))
        d = OracleDeviceDrafter(ar.token_ids, len(prompt), 64, device="cuda")
        eng = DeviceEngine(r, d, graphs=graphs)
        sp = generate_spec(r, d, prompt, GREEDY, 200, opts=SpecOptions(tree=TreeSpec(5, 2, 10)), engine=eng)
        if graphs:  # replayed, not the eager fallback (which would make this comparison vacuous)
            assert not eng._eager and {k[0] for k in eng._graphs} == {"prefill", "draft", "verify", "accept"}
        outs[graphs] = (ar.token_ids, sp.token_ids, sp.stats["stop"], r.cache.k[:, :, :r.length].float().cpu())
    assert outs[True][0] == outs[False][0]
    assert outs[True][1] == outs[False][1] and outs[True][2] == "context"
    assert torch.equal(outs[True][3], outs[False][3])


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("where", ["warm-up", "capture"])
def test_capture_failure_falls_back_and_later_captures_work(monkeypatch, where):
    """A host sync in the AR body: found by the guard in the warm-up (`.item()`), or only inside the
    capture (a device synchronize, which the guard cannot see). Either way the engine warns, runs the
    step eagerly with the right tokens, and a later engine in the same process captures and replays."""
    target = make_tiny_model(1, vocab=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16).cuda().to(torch.bfloat16)
    prompt = torch.randint(0, 64, (50,), generator=torch.Generator().manual_seed(5)).tolist()
    r = Runner(target, attention="nsa", nsa=NSA, max_len=150)
    ref = generate_ar(r, prompt, GREEDY, 20, engine=DeviceEngine(r, graphs=False)).token_ids
    body = DeviceEngine._ar_body

    def bad(self, *args):
        body(self, *args)
        if where == "warm-up":
            int(self.tok[0])
        elif torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()
    monkeypatch.setattr(DeviceEngine, "_ar_body", bad)
    eng = DeviceEngine(r)
    with pytest.warns(UserWarning, match=f"CUDA graph {where} of ar failed"):
        assert generate_ar(r, prompt, GREEDY, 20, engine=eng).token_ids == ref
    assert ("ar", None, False) in eng._eager and set(eng._graphs) == {("prefill", ())}   # the prompt's chunks
    monkeypatch.setattr(DeviceEngine, "_ar_body", body)
    again = DeviceEngine(r)
    assert generate_ar(r, prompt, GREEDY, 20, engine=again).token_ids == ref
    assert ("ar", None, False) in again._graphs and not again._eager


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_sampled_graph_replay_equals_eager():
    """Sampled AR steps and spec rounds (temperature 0.8, top-p 0.9): the graphs, replayed with the
    coins drawn before each replay, emit what the eager rounds emit for the same seed."""
    from ssv.spec.accept import SamplingParams
    target = make_tiny_model(1, vocab=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16).cuda().to(torch.bfloat16)
    prompt = torch.randint(0, 64, (60,), generator=torch.Generator().manual_seed(8)).tolist()
    params = SamplingParams(temperature=0.8, top_p=0.9)
    outs = {}
    for graphs in (False, True):
        r = Runner(target, attention="nsa", nsa=NSA, max_len=200)
        ar = generate_ar(r, prompt, GREEDY, 40, engine=DeviceEngine(r, graphs=graphs))
        eng = DeviceEngine(r, graphs=graphs)
        sa = generate_ar(r, prompt, params, 30, seed=3, engine=eng)
        d = OracleDeviceDrafter(ar.token_ids, len(prompt), 64, device="cuda")
        eng = DeviceEngine(r, d, graphs=graphs)
        sp = generate_spec(r, d, prompt, params, 40, opts=SpecOptions(tree=TreeSpec(4, 2, 8)), seed=3, engine=eng)
        if graphs:
            assert not eng._eager and {k[0] for k in eng._graphs} == {"prefill", "draft", "verify", "accept"}
        outs[graphs] = (sa.token_ids, sp.token_ids)
    assert outs[True] == outs[False]


def _lookup_case(device, dtype=torch.float32):
    """A target whose greedy text repeats its prompt's phrases (a 24-token vocabulary, head_dim 16 for
    tl.dot), a prompt of one repeated phrase and a tiny EAGLE-3 head: a round's chain from the context
    reaches deeper than the head's 2 levels."""
    from ..draft.helpers import tiny_target
    target = tiny_target(vocab=24, layers=4, head_dim=16).to(device).to(dtype)
    base = [3, 7, 1, 9, 4, 4, 2, 8, 5, 1, 6]
    prompt = (base * 7)[:70]
    return target, prompt, tiny_head(target, draft_vocab=16, window=64).to(device).to(dtype)


def test_kernel_round_with_lookup_emits_ar_tokens():
    """A context lookup on the kernel round (the CUDA round's form: spares, fixed rows): the verify plan
    holds the chain's rows after the tree, the accept walk goes deeper than the tree and the commit
    kernel moves the longer path; tokens are AR's on the reference ops."""
    target, prompt, head = _lookup_case(DEV)
    prompt = prompt[:40]
    ref = Runner(target, attention="nsa", nsa=NSA, max_len=64, backend="reference")
    ar = generate_ar(ref, prompt, GREEDY, 12)
    r = Runner(target, attention="nsa", nsa=NSA, max_len=64, backend="triton")
    d = Eagle3Drafter(head, target, fused=False)   # the fused layer's kernels: the test above
    res = generate_spec(r, d, prompt, GREEDY, 12, opts=SpecOptions(tree=TreeSpec(2, 3, 3), lookup=5),
                        engine=DeviceEngine(r, d, graphs=False, check_sync=True))
    assert res.token_ids == ar.token_ids
    assert len(res.stats["acceptance_by_depth"]) > 2   # some round accepted past the head's depth


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_graph_replay_equals_eager_lookup_round():
    """The lookup's draft graph (head pool, spares, chain attached in fixed shapes), the verify graph
    on T + K rows and the accept graph's deeper walk: graphed equals eager, chains accepted past the
    tree's depth; a compact lookup (rows that depend on the data) is refused with graphs."""
    target, prompt, head = _lookup_case("cuda", torch.bfloat16)
    outs = {}
    for graphs in (False, True):
        r = Runner(target, attention="nsa", nsa=NSA, max_len=260)
        d = Eagle3Drafter(head, target)
        eng = DeviceEngine(r, d, graphs=graphs)
        sp = generate_spec(r, d, prompt, GREEDY, 120, opts=SpecOptions(tree=TreeSpec(3, 3, 8), lookup=8), engine=eng)
        if graphs:
            assert not eng._eager and {k[0] for k in eng._graphs} == {"prefill", "draft", "verify", "accept"}
            with pytest.raises(ValueError, match="compact"):
                eng.launch_spec(SpecOptions(tree=TreeSpec(3, 3, 8), lookup=8, spares=False))
        assert len(sp.stats["acceptance_by_depth"]) > 3
        outs[graphs] = (sp.token_ids, sp.stats["rounds"], d.slot_pos.cpu(), r.cache.k[:, :, :r.length].float().cpu())
    assert outs[True][0] == outs[False][0] and outs[True][1] == outs[False][1]
    assert torch.equal(outs[True][2], outs[False][2]) and torch.equal(outs[True][3], outs[False][3])


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_graph_replay_equals_eager_root_only_lookup_round():
    """A root-only head tree beside the chain (prompt-lookup decoding: the fused lookup launches on a
    tree of one node): graphed equals eager, and both equal the AR steps of the same runner."""
    target, prompt, head = _lookup_case("cuda", torch.bfloat16)
    outs = {}
    for graphs in (False, True):
        r = Runner(target, attention="nsa", nsa=NSA, max_len=260)
        ar = generate_ar(r, prompt, GREEDY, 60, engine=DeviceEngine(r, graphs=graphs))
        d = Eagle3Drafter(head, target)
        sp = generate_spec(r, d, prompt, GREEDY, 60, opts=SpecOptions(tree=TreeSpec(3, 3, 1), lookup=8),
                           engine=DeviceEngine(r, d, graphs=graphs))
        assert sp.token_ids == ar.token_ids and sp.stats["mean_accepted_length"] > 1.5
        outs[graphs] = (sp.token_ids, sp.stats["rounds"])
    assert outs[True] == outs[False]


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_graph_replay_equals_eager_sampled_lookup_round():
    """A sampled round with the chain (its accept walk one child wider and past the head's depth, the
    coins [T + K, top_k + 2]): graphed equals eager for the same seed, and the history the lookup
    reads holds the text (a sampled round once wrote it at positions named by its tokens)."""
    from ssv.spec.accept import SamplingParams
    target, prompt, head = _lookup_case("cuda", torch.bfloat16)
    hot = SamplingParams(temperature=0.7)
    outs = {}
    for graphs in (False, True):
        r = Runner(target, attention="nsa", nsa=NSA, max_len=260)
        d = Eagle3Drafter(head, target)
        eng = DeviceEngine(r, d, graphs=graphs)
        sp = generate_spec(r, d, prompt, hot, 80, opts=SpecOptions(tree=TreeSpec(3, 3, 8), lookup=8), seed=11,
                           engine=eng)
        if graphs:
            assert not eng._eager and {k[0] for k in eng._graphs} == {"prefill", "draft", "verify", "accept"}
        assert eng.hist[:len(prompt) + len(sp.token_ids)].tolist() == prompt + sp.token_ids
        outs[graphs] = (sp.token_ids, sp.stats["rounds"], d.slot_pos.cpu())
    assert outs[True][0] == outs[False][0] and outs[True][1] == outs[False][1]
    assert torch.equal(outs[True][2], outs[False][2])
