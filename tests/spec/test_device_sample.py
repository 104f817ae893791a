"""Sampling acceptance on the device: the host rule's path and bonus for the same coins, on random
trees with duplicate siblings, one-hot and zero-probability targets, top-p; and its emitted
sequences pass the chi-square tests against the exact target distribution."""
import pytest
import torch

from ssv.spec.accept import AcceptResult, SamplingParams, accept_sample
from ssv.spec.device import DeviceTree
from ssv.spec.device_accept import accept_sample_device
from ssv.spec.tree import TreeSpec

from .test_accept import ALPHA, FAST_TRIALS, goodness_of_fit, make_case, run_trials


def _device(tree):
    k = max(1, tree.max_children)
    spec = TreeSpec(depth=max(1, int(tree.depth.max())), top_k=k, total_tokens=tree.n)
    dt = DeviceTree(tree.tokens.clone(), tree.parents.clone(), tree.scores.float(), tree.depth.clone())
    return dt, spec, k


def _host_coins(coins, tree):
    return torch.cat([coins[:, : tree.max_children], coins[:, -1:]], 1)


def _as_result(tree, path, n, bonus):
    p = path[: int(n)].tolist()
    return AcceptResult(path=p, tokens=[int(tree.tokens[i]) for i in p[1:]], bonus=int(bonus))


@pytest.mark.parametrize("seed", range(40))
def test_accept_sample_device_equals_host_for_the_same_coins(seed):
    tree, logits, params = make_case(seed)
    dt, spec, k = _device(tree)
    g = torch.Generator().manual_seed(seed)
    for _ in range(6):
        coins = torch.rand(tree.n, k + 1, generator=g)
        want = accept_sample(tree, logits, params, _host_coins(coins, tree))
        path, n, bonus = accept_sample_device(dt, logits, params, coins, spec.depth, k)
        assert path.shape == (spec.depth + 1,) and bool((path[int(n):] == -1).all())
        got = _as_result(tree, path, n, bonus)
        assert (got.path, got.bonus) == (want.path, want.bonus)


@pytest.mark.parametrize("seed", range(3))
def test_accept_sample_device_distribution(seed):
    tree, logits, params = make_case(1000 + seed)
    dt, spec, k = _device(tree)

    def accept_fn(tree_, logits_, params_, coins):
        # run_trials draws host-shaped coins [T, max_children + 1]; the device takes [T, k + 1]
        dev_coins = torch.cat([coins[:, :-1], torch.zeros(tree.n, k - tree.max_children), coins[:, -1:]], 1)
        return _as_result(tree, *accept_sample_device(dt, logits_, params_, dev_coins, spec.depth, k))
    seqs = run_trials(accept_fn, tree, logits, params, FAST_TRIALS, seed)
    pvals = goodness_of_fit(seqs, tree, logits, params, FAST_TRIALS)
    assert min(pvals.values()) > ALPHA, pvals


def test_accept_sample_device_top_p():
    tree, logits, _ = make_case(7)
    params = SamplingParams(temperature=0.7, top_p=0.8)
    dt, spec, k = _device(tree)
    coins = torch.rand(tree.n, k + 1, generator=torch.Generator().manual_seed(1))
    want = accept_sample(tree, logits, params, _host_coins(coins, tree))
    got = _as_result(tree, *accept_sample_device(dt, logits, params, coins, spec.depth, k))
    assert (got.path, got.bonus) == (want.path, want.bonus)


def test_accept_sample_device_never_takes_a_duplicate_second():
    from ssv.spec.tree import DraftTree
    tree = DraftTree(torch.tensor([0, 1, 1, 2]), torch.tensor([-1, 0, 0, 0]), torch.tensor([0.0, -1, -2, -3]))
    logits = torch.log(torch.tensor([[0.1, 0.5, 0.3, 0.1]] * 4))
    dt, spec, k = _device(tree)
    params = SamplingParams(temperature=1.0)
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        coins = torch.rand(4, k + 1, generator=g)
        coins[0, 0] = 0.9                     # the first token-1 child is rejected
        path, n, bonus = accept_sample_device(dt, logits, params, coins, spec.depth, k)
        assert int(path[1]) != 2              # ... and its duplicate is never accepted
        want = accept_sample(tree, logits, params, _host_coins(coins, tree))
        assert _as_result(tree, path, n, bonus).path == want.path


def test_accept_sample_device_takes_the_last_token_with_mass():
    """Children carrying all of p: once the first is rejected the second holds all that is left and is
    accepted whatever the coin (the host's p[x] = a / a = 1), never a zero-probability bonus."""
    from ssv.spec.tree import DraftTree
    tree = DraftTree(torch.tensor([0, 1, 2]), torch.tensor([-1, 0, 0]), torch.tensor([0.0, -1, -2]))
    p = torch.tensor([[0.0, 0.3, 0.7, 0.0]] * 3, dtype=torch.float64)
    logits = torch.log(p).float()
    dt, spec, k = _device(tree)
    params = SamplingParams(temperature=1.0)
    for c in (0.7, 0.99, 1 - 1e-7):
        coins = torch.tensor([[0.999, c, 0.5]] * 3)
        path, n, bonus = accept_sample_device(dt, logits, params, coins, spec.depth, k)
        assert path[:2].tolist() == [0, 2] and int(n) == 2
        assert accept_sample(tree, logits, params, _host_coins(coins, tree)).path == [0, 2]
