"""The sampled tree-walk kernel (`ssv.ops.accept.accept_sample_round`) against its tensor twin
(`accept_sample_device` + `round_record_naive`), interpreter on the CPU, compiled on a GPU: random
trees with tied scores, siblings sharing tokens, tokens of zero probability, rows whose mass sits on
one token, vocabularies across the kernel's 1,024-token chunks, NaN-free poisoned record buffers."""
import pytest
import torch

from ssv.ops.accept.naive import round_record_naive
from ssv.ops.accept.ops import accept_sample_round
from ssv.spec.accept import SamplingParams, probs_unchecked
from ssv.spec.device import DeviceTree
from ssv.spec.device_accept import accept_sample_device

from .test_nsa_kernels import DEV


def _case(t, v, k, seed, peaked=False):
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((t,), -1, dtype=torch.long)
    kids = torch.zeros(t, dtype=torch.long)
    depth = torch.zeros(t, dtype=torch.long)
    for u in range(1, t):   # at most k children a node, as a tree of top-k expansions
        while True:
            p = int(torch.randint(0, u, (1,), generator=g))
            if kids[p] < k:
                break
        parents[u], depth[u] = p, depth[p] + 1
        kids[p] += 1
    tokens = torch.randint(0, min(v, 6), (t,), generator=g)   # few tokens: siblings share them
    tokens[torch.rand(t, generator=g) < 0.3] = v - 1          # and the vocabulary's last chunk
    scores = -torch.randint(0, 3, (t,), generator=g).float()  # ties between siblings
    logits = torch.randn(t, v, generator=g) * 3
    logits[:, 3] = float("-inf")                              # a token no row can sample
    tokens[torch.rand(t, generator=g) < 0.1] = 3
    if peaked:   # the mass on one token: the walk must take it whatever the coin
        logits[:, :] = float("-inf")
        logits[torch.arange(t), tokens[torch.randint(0, t, (t,), generator=g)]] = 0.0
        logits[0, 0] = 0.0
    coins = torch.rand(t + 3, k + 1, generator=g)             # a bucket's rows: more than the tree's
    return DeviceTree(tokens, parents, scores, depth), logits, coins


@pytest.mark.parametrize("t,v,k,d,seed", [(1, 37, 2, 3, 0), (9, 37, 3, 4, 1), (48, 1100, 9, 6, 2),
                                          (48, 2050, 4, 8, 3), (130, 300, 5, 9, 4), (33, 1024, 2, 12, 5)])
@pytest.mark.parametrize("temperature,top_p", [(0.7, 1.0), (1.3, 0.8)])
def test_accept_sample_kernel_matches_twin(t, v, k, d, seed, temperature, top_p):
    params = SamplingParams(temperature=temperature, top_p=top_p)
    for i in range(4):
        tree, logits, coins = _case(t, v, k, seed * 10 + i, peaked=i == 3)
        tree = DeviceTree(*(x.to(DEV) for x in (tree.tokens, tree.parents, tree.scores, tree.depth)))
        logits, coins = logits.to(DEV), coins.to(DEV)
        want_path, want_n, want_b = accept_sample_device(tree, logits, params, coins, d, k)
        want_rows, want_nxt = round_record_naive(tree.tokens, want_path, want_n, want_b)
        rec = torch.full((d + 4,), -777, dtype=torch.long, device=DEV)   # a view into a larger record
        bonus = torch.full((1,), -777, dtype=torch.long, device=DEV)
        probs = probs_unchecked(logits, params).contiguous()
        path, rows = accept_sample_round(tree.parents, tree.tokens, tree.scores, probs, coins, d, k, rec[0:1],
                                         rec[1:d + 2], bonus)
        assert torch.equal(path, want_path) and torch.equal(rows, want_rows)
        assert torch.equal(rec[0:1], want_n) and torch.equal(rec[1:d + 2], want_nxt) and torch.equal(bonus, want_b)
        assert (rec[d + 2:] == -777).all()
        assert float(probs[int(path[int(want_n) - 1]), int(bonus)]) > 0 or i == 3


@pytest.mark.parametrize("v", [5, 9])
def test_accept_sample_kernel_matches_twin_on_small_vocabularies(v):
    """Few tokens, so siblings often share one after a rejection (its second copy must never be
    taken) and the bonus's removed tokens carry most of the mass."""
    params = SamplingParams(temperature=1.0)
    t, k, d = 40, 4, 6
    for i in range(16):
        tree, logits, coins = _case(t, v, k, 100 + i)
        tree = DeviceTree(*(x.to(DEV) for x in (tree.tokens, tree.parents, tree.scores, tree.depth)))
        logits, coins = logits.to(DEV), coins.to(DEV)
        want = accept_sample_device(tree, logits, params, coins, d, k)
        rec = torch.zeros(d + 2, dtype=torch.long, device=DEV)
        bonus = torch.zeros(1, dtype=torch.long, device=DEV)
        path, _ = accept_sample_round(tree.parents, tree.tokens, tree.scores,
                                      probs_unchecked(logits, params).contiguous(), coins, d, k, rec[0:1], rec[1:],
                                      bonus)
        assert torch.equal(path, want[0]) and torch.equal(rec[0:1], want[1]) and torch.equal(bonus, want[2])


def test_accept_sample_kernel_walks_past_the_first_level():
    """A chain whose every token has all the mass: the whole chain is accepted (a twin that stopped
    at the root would also agree with a kernel that stopped there)."""
    t, v, k, d = 6, 50, 2, 5
    parents = torch.arange(-1, t - 1)
    tokens = torch.tensor([0, 7, 8, 9, 10, 11])
    logits = torch.full((t, v), float("-inf"))
    logits[torch.arange(t - 1), tokens[1:]] = 0.0
    logits[t - 1, 12] = 0.0
    tree = DeviceTree(*(x.to(DEV) for x in (tokens, parents, torch.zeros(t), torch.arange(t))))
    rec = torch.zeros(d + 2, dtype=torch.long, device=DEV)
    bonus = torch.zeros(1, dtype=torch.long, device=DEV)
    probs = probs_unchecked(logits.to(DEV), SamplingParams(temperature=1.0)).contiguous()
    path, _ = accept_sample_round(tree.parents, tree.tokens, tree.scores, probs, torch.rand(t, k + 1, device=DEV),
                                  d, k, rec[0:1], rec[1:], bonus)
    assert path.tolist() == list(range(t)) and int(rec[0]) == t and int(bonus) == 12


def test_accept_sample_round_refuses_bad_shapes():
    z = torch.zeros(5, dtype=torch.long, device=DEV)
    probs = torch.rand(5, 10, device=DEV)
    one = torch.zeros(1, dtype=torch.long, device=DEV)
    with pytest.raises(ValueError, match="coins"):
        accept_sample_round(z, z, z.float(), probs, torch.rand(5, 3, device=DEV), 3, 3, one, z[:4].clone(), one)
    with pytest.raises(ValueError, match="probs"):
        accept_sample_round(z, z, z.float(), probs.double(), torch.rand(5, 4, device=DEV), 3, 3, one,
                            z[:4].clone(), one)


@pytest.mark.parametrize("t,v", [(1, 1), (3, 37), (1, 4097), (51, 300), (5, 9000)])
@pytest.mark.parametrize("temperature", [0.7, 1.3])
@pytest.mark.parametrize("device_scalar", [False, True])
def test_probs_rows_matches_twin(t, v, temperature, device_scalar):
    """softmax(logits / temperature) by rows and their fp64 masses in one launch against `probs_unchecked`:
    rows with -inf tokens (zero, exactly), one finite token, large logits, across the 4,096-token tiles; the
    outputs poisoned first (NaN), a row-strided view of wider logits."""
    from ssv.ops.accept.ops import probs_rows
    g = torch.Generator().manual_seed(t * 7 + v)
    wide = torch.randn(t, v + 5, generator=g) * 4
    wide[torch.rand(t, v + 5, generator=g) < 0.2] = float("-inf")
    wide[:, 0] = 0.5
    if t > 2:
        wide[1, 1:] = float("-inf")          # one token holds the row
        wide[2] *= 2000                      # exp would overflow without the max
    logits = wide.to(DEV)[:, :v]
    params = SamplingParams(temperature=temperature)
    inv = torch.full((1,), params.inv_temperature, device=DEV) if device_scalar else params.inv_temperature
    probs = torch.full((t, v), float("nan"), device=DEV)
    total = torch.full((t,), float("nan"), dtype=torch.float64, device=DEV)
    got, mass = probs_rows(logits, inv, probs=probs, total=total)
    assert got.data_ptr() == probs.data_ptr() and mass.data_ptr() == total.data_ptr()
    want = probs_unchecked(logits, params)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-9)
    assert torch.equal(got == 0, want == 0)                  # -inf tokens exactly 0, no others
    torch.testing.assert_close(mass, got.double().sum(1), rtol=1e-12, atol=0)
    torch.testing.assert_close(mass, torch.ones_like(mass), rtol=1e-5, atol=0)


def test_accept_sample_round_takes_the_masses_probs_rows_gives():
    """The walk with `probs_rows`' masses (three launches) against the same walk computing them (four)."""
    from ssv.ops.accept.ops import probs_rows
    params = SamplingParams(temperature=0.8)
    for seed in range(6):
        tree, logits, coins = _case(48, 2050, 4, seed)
        tree = DeviceTree(*(x.to(DEV) for x in (tree.tokens, tree.parents, tree.scores, tree.depth)))
        probs, total = probs_rows(logits.to(DEV), params.inv_temperature)
        outs = []
        for tot in (total, None):
            rec = torch.full((10,), -777, dtype=torch.long, device=DEV)
            path, rows = accept_sample_round(tree.parents, tree.tokens, tree.scores, probs.clone(), coins.to(DEV), 8,
                                             4, rec[0:1], rec[1:], rec[9:10], total=tot)
            outs.append((path.tolist(), rows.tolist(), rec.tolist()))
        assert outs[0] == outs[1]
    with pytest.raises(ValueError, match="total"):
        accept_sample_round(tree.parents, tree.tokens, tree.scores, probs, coins.to(DEV), 8, 4, rec[0:1], rec[1:],
                            rec[9:10], total=total.float())


def test_probs_rows_refuses_bad_input():
    from ssv.ops.accept.ops import probs_rows
    x = torch.randn(3, 10, device=DEV)
    with pytest.raises(ValueError, match="logits"):
        probs_rows(x[0], 1.0)
    with pytest.raises(ValueError, match="logits"):
        probs_rows(x.t(), 1.0)
    with pytest.raises(ValueError, match="inv_temperature"):
        probs_rows(x, 0.0)
    with pytest.raises(ValueError, match="inv_temperature"):
        probs_rows(x, torch.ones(2, device=DEV))
    with pytest.raises(ValueError, match="total"):
        probs_rows(x, 1.0, total=torch.zeros(3, device=DEV))
    with pytest.raises(ValueError, match="probs"):
        probs_rows(x, 1.0, probs=torch.zeros(3, 9, device=DEV))


@pytest.mark.parametrize("v", [1, 37, 1024, 1025, 2050, 5000])
def test_sample_row_matches_twin(v):
    """An AR step's sampled token (`sample_row`, the bonus's two launches) against `sample_device`: random
    rows with zero-probability tokens (the last ones too), one-token rows, coins at 0 and just under 1,
    across the 1,024-token chunks; both outputs poisoned first, the buffers beside them untouched."""
    from ssv.ops.accept.ops import sample_row
    from ssv.spec.device_accept import sample_device
    g = torch.Generator().manual_seed(v)
    for i in range(12):
        p = torch.rand(v, generator=g) ** 4
        p[torch.rand(v, generator=g) < 0.3] = 0.0
        if i % 3 == 1:
            p[-(v // 3 + 1):] = 0.0                      # the tail without mass: the cap is the last with mass
        if i % 4 == 3:
            p.zero_()
            p[int(torch.randint(0, v, (1,), generator=g))] = 0.5   # one token holds it all
        if not (p > 0).any():
            p[0] = 1.0
        coin = torch.rand(1, generator=g)
        coin = [torch.zeros(1), torch.full((1,), 1.0 - 2 ** -24), coin][min(i, 2)]
        p, coin = p.to(DEV), coin.to(DEV)
        want = sample_device(p, coin)
        buf = torch.full((6,), -777, dtype=torch.long, device=DEV)   # views into larger buffers
        out = sample_row(p[None].contiguous(), coin, out=buf[1:2], out2=buf[4:5])
        assert out.data_ptr() == buf[1:2].data_ptr()
        assert int(buf[1]) == int(buf[4]) == int(want) and float(p[int(want)]) > 0
        assert buf[[0, 2, 3, 5]].eq(-777).all()


def test_sample_row_follows_the_coin():
    """Two tokens of equal mass: a coin under one half takes the first, over it the second (a kernel that
    ignored the coin, or read it as other bits, would not)."""
    from ssv.ops.accept.ops import sample_row
    p = torch.zeros(1, 3000, device=DEV)
    p[0, 5], p[0, 2500] = 1.0, 1.0
    got = []
    for c in (0.1, 0.49, 0.51, 0.9):
        out = torch.zeros(1, dtype=torch.long, device=DEV)
        sample_row(p, torch.full((1,), c, device=DEV), out=out, out2=torch.zeros_like(out))
        got.append(int(out))
    assert got == [5, 5, 2500, 2500]


def test_sample_row_refuses_bad_input():
    from ssv.ops.accept.ops import sample_row
    one = torch.zeros(1, dtype=torch.long, device=DEV)
    coin = torch.rand(1, device=DEV)
    with pytest.raises(ValueError, match="probs"):
        sample_row(torch.rand(2, 10, device=DEV), coin, one, one.clone())
    with pytest.raises(ValueError, match="probs"):
        sample_row(torch.rand(1, 10, device=DEV).double(), coin, one, one.clone())
    with pytest.raises(ValueError, match="coin"):
        sample_row(torch.rand(1, 10, device=DEV), torch.rand(2, device=DEV), one, one.clone())
    with pytest.raises(ValueError, match="out2"):
        sample_row(torch.rand(1, 10, device=DEV), coin, one, torch.zeros(1, device=DEV))


@pytest.mark.parametrize("v", [1, 37, 1024, 1025, 5000])
@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_sample_logits_row_matches_twin(v, temperature):
    """An AR step's token straight from its logits (two launches over chunks) against `sample_device` of
    `probs_unchecked`: -inf tokens (a tail of them: the cap is the last with mass), one-token rows, a chunk of
    -inf alone, coins at 0, just under 1 and at 1 (the caps); outputs poisoned, views into larger buffers."""
    from ssv.ops.accept.ops import sample_logits_row
    from ssv.spec.device_accept import sample_device
    params = SamplingParams(temperature=temperature)
    inv = torch.full((1,), params.inv_temperature, device=DEV)
    g = torch.Generator().manual_seed(v * 3 + int(temperature * 10))
    for i in range(12):
        x = torch.randn(v, generator=g) * 3
        x[torch.rand(v, generator=g) < 0.3] = float("-inf")
        if i % 3 == 1:
            x[-(v // 3 + 1):] = float("-inf")            # the tail without mass
        if i % 4 == 3:
            x.fill_(float("-inf"))
            x[int(torch.randint(0, v, (1,), generator=g))] = 2.0   # one token holds it all
        if v > 1024 and i % 5 == 2:
            x[:1024] = float("-inf")                     # a whole chunk without mass
        if not torch.isfinite(x).any():
            x[0] = 0.0
        # a coin of 1 (past the range) puts the target at the total, where only the caps can answer
        coin = [torch.zeros(1), torch.full((1,), 1.0 - 2 ** -24), torch.ones(1), torch.rand(1, generator=g)][min(i, 3)]
        if i == 4:
            coin = torch.ones(1)
        logits, coin = x.to(DEV)[None], coin.to(DEV)
        want = sample_device(probs_unchecked(logits, params)[0], coin)
        buf = torch.full((6,), -777, dtype=torch.long, device=DEV)
        out = sample_logits_row(logits, inv, coin, out=buf[1:2], out2=buf[4:5])
        assert out.data_ptr() == buf[1:2].data_ptr()
        assert int(buf[1]) == int(buf[4]) == int(want) and torch.isfinite(x[int(want)])
        assert buf[[0, 2, 3, 5]].eq(-777).all()


def test_sample_logits_row_follows_the_coin_and_the_temperature():
    """Two tokens of equal logits: the coin picks which; a third token's share moves with the temperature."""
    from ssv.ops.accept.ops import sample_logits_row
    x = torch.full((1, 3000), float("-inf"), device=DEV)
    x[0, 5], x[0, 2500] = 1.0, 1.0
    got = []
    for c in (0.1, 0.49, 0.51, 0.9):
        out = torch.zeros(1, dtype=torch.long, device=DEV)
        sample_logits_row(x, torch.ones(1, device=DEV), torch.full((1,), c, device=DEV), out, torch.zeros_like(out))
        got.append(int(out))
    assert got == [5, 5, 2500, 2500]
    x[0, 2500] = 0.0           # e^1 : e^0 at temperature 1 (coin 0.6 takes token 5); at temperature 0.1, e^10 : 1
    picks = []
    for inv in (1.0, 10.0):
        out = torch.zeros(1, dtype=torch.long, device=DEV)
        sample_logits_row(x, torch.full((1,), inv, device=DEV), torch.full((1,), 0.8, device=DEV), out,
                          torch.zeros_like(out))
        picks.append(int(out))
    assert picks == [2500, 5]


def test_sample_logits_row_refuses_bad_input():
    from ssv.ops.accept.ops import sample_logits_row
    one = torch.zeros(1, dtype=torch.long, device=DEV)
    f = torch.ones(1, device=DEV)
    with pytest.raises(ValueError, match="logits"):
        sample_logits_row(torch.randn(2, 10, device=DEV), f, f * 0.5, one, one.clone())
    with pytest.raises(ValueError, match="logits"):
        sample_logits_row(torch.randn(1, 20, device=DEV)[:, ::2], f, f * 0.5, one, one.clone())
    with pytest.raises(ValueError, match="inv_temperature"):
        sample_logits_row(torch.randn(1, 10, device=DEV), 1.0, f * 0.5, one, one.clone())
    with pytest.raises(ValueError, match="coin"):
        sample_logits_row(torch.randn(1, 10, device=DEV), f, torch.rand(2, device=DEV), one, one.clone())
    with pytest.raises(ValueError, match="out2"):
        sample_logits_row(torch.randn(1, 10, device=DEV), f, f * 0.5, one, torch.zeros(1, device=DEV))
