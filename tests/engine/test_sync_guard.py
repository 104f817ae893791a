"""The host-sync guard catches what a CUDA graph cannot hold, on the CPU; whole device rounds (AR, the
oracle drafter, the real EAGLE-3 drafter) run under it and still emit AR's tokens."""
import pytest
import torch

from ssv.draft import Eagle3Drafter
from ssv.engine.device_round import DeviceEngine
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.engine.spec import SpecOptions, generate_spec
from ssv.engine.sync_guard import HostSyncError, NoHostSync, host_read
from ssv.spec.device import grow_tree
from ssv.spec.device_accept import accept_greedy_device
from ssv.spec.tree import TreeSpec

from ..conftest import make_tiny_model
from ..draft.helpers import tiny_head
from ..draft.helpers import tiny_target as draft_target
from .test_device_round import GREEDY, NSA, OracleDeviceDrafter


@pytest.mark.parametrize("bad", [
    lambda x, i: x[i[0]],                       # a 0-dim index is read on the host
    lambda x, i: x.sum().item(),
    lambda x, i: bool(x.any()),
    lambda x, i: x[x > 0],                      # a boolean mask: data-dependent shape
    lambda x, i: x.nonzero(),
    lambda x, i: torch.repeat_interleave(i),
    lambda x, i: x.unique(),
])
def test_guard_refuses_host_syncs(bad):
    x, i = torch.randn(6), torch.tensor([2, 1])
    with pytest.raises(HostSyncError):
        with NoHostSync():
            bad(x, i)


def test_guard_lets_fixed_shape_work_through():
    x, i = torch.randn(6), torch.tensor([2, 1])
    with NoHostSync():
        y = x[i] + torch.where(x > 0, x, 0.0).cumsum(0)[i] * torch.tensor(2.0)
        x.index_copy_(0, i, y)
        torch.topk(x, 3)
        torch.repeat_interleave(i, output_size=3)
        with host_read():
            assert int(i[0]) == 2
    torch.testing.assert_close(x[i], y)


def test_device_accept_is_sync_free():
    """The regression the guard found on the H200: the accept walk indexed with 0-dim tensors."""
    spec = TreeSpec(3, 2, 6)
    tab = torch.randn(80, 40).log_softmax(-1)
    tree = grow_tree(lambda lv, t, p, r: tab[t], torch.tensor(5), tab[0], spec)
    with NoHostSync():
        path, n, bonus = accept_greedy_device(tree, torch.randn(6, 40), spec.depth)
    assert path.shape == (4,) and n.shape == (1,) and bonus.shape == (1,)


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_guarded_rounds_emit_ar_tokens(attention):
    target = make_tiny_model(1, vocab=64, n_layers=3)
    r = Runner(target, attention=attention, nsa=NSA, max_len=300)
    prompt = torch.randint(0, 64, (45,), generator=torch.Generator().manual_seed(3)).tolist()
    ar = generate_ar(r, prompt, GREEDY, 30)
    assert generate_ar(r, prompt, GREEDY, 30, engine=DeviceEngine(r, check_sync=True)).token_ids == ar.token_ids
    d = OracleDeviceDrafter(ar.token_ids, len(prompt), 64)
    res = generate_spec(r, d, prompt, GREEDY, 30, opts=SpecOptions(tree=TreeSpec(4, 2, 8)),
                        engine=DeviceEngine(r, d, check_sync=True))
    assert res.token_ids == ar.token_ids and res.stats["mean_accepted_length"] > 1.5


def test_guarded_eagle3_round_matches_host_round():
    """The real drafter's device round (growth over the draft vocabulary, commit rows) under the guard:
    the host round's tokens, which are AR's."""
    target = draft_target()
    head = tiny_head(target, draft_vocab=40, window=9)
    r = Runner(target, attention="nsa", nsa=NSA, max_len=300)
    prompt = torch.randint(3, target.cfg.vocab_size, (41,), generator=torch.Generator().manual_seed(4)).tolist()
    ar = generate_ar(r, prompt, GREEDY, 24)
    d = Eagle3Drafter(head, target)
    opts = SpecOptions(tree=TreeSpec(4, 3, 12))
    host = generate_spec(r, d, prompt, GREEDY, 24, opts=opts)
    dev = generate_spec(r, d, prompt, GREEDY, 24, opts=opts, engine=DeviceEngine(r, d, check_sync=True))
    assert dev.token_ids == host.token_ids == ar.token_ids
    assert dev.stats["rounds"] == host.stats["rounds"]


def test_sampled_device_rounds_are_seeded_and_lossless_in_the_limit():
    """Sampled AR steps and spec rounds on the device, under the guard: the same seed gives the same
    tokens, another seed other tokens at temperature 1; at a temperature near 0 they are AR's greedy
    tokens (the tiny model's top-2 gaps are far wider than the temperature)."""
    from ssv.spec.accept import SamplingParams
    target = make_tiny_model(1, vocab=64, n_layers=3)
    r = Runner(target, attention="nsa", nsa=NSA, max_len=300)
    prompt = torch.randint(0, 64, (45,), generator=torch.Generator().manual_seed(3)).tolist()
    ar = generate_ar(r, prompt, GREEDY, 24)
    d = OracleDeviceDrafter(ar.token_ids, len(prompt), 64)
    eng = DeviceEngine(r, d, check_sync=True)
    opts = SpecOptions(tree=TreeSpec(4, 2, 8))
    cold = SamplingParams(temperature=1e-3)
    assert generate_ar(r, prompt, cold, 24, engine=DeviceEngine(r, check_sync=True)).token_ids == ar.token_ids
    res = generate_spec(r, d, prompt, cold, 24, opts=opts, engine=eng)
    assert res.token_ids == ar.token_ids and res.stats["mean_accepted_length"] > 1.5
    hot = SamplingParams(temperature=1.0)
    runs = [generate_spec(r, d, prompt, hot, 24, opts=opts, seed=s, engine=eng).token_ids for s in (5, 5, 6)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    ar_runs = [generate_ar(r, prompt, hot, 24, seed=s, engine=DeviceEngine(r)).token_ids for s in (5, 5, 6)]
    assert ar_runs[0] == ar_runs[1] and ar_runs[0] != ar_runs[2]
