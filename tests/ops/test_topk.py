"""The vocabulary top-k kernel against its stable-sort twin (interpreter on the CPU, compiled on a GPU)."""
import pytest
import torch

from ssv.ops.topk.naive import vocab_topk_naive
from ssv.ops.topk.ops import vocab_topk
from ssv.spec.device import _vocab_top

from .test_nsa_kernels import DEV


@pytest.mark.parametrize("r,v,k", [(1, 40, 3), (8, 8192, 8), (5, 1000, 16), (3, 7, 7)])
def test_vocab_topk_matches_stable_sort(r, v, k):
    g = torch.Generator().manual_seed(v + k)
    x = torch.randn(r, v, generator=g).log_softmax(-1)
    x = torch.round(x * 4) / 4                        # many ties: the lower id must come first
    x[:, torch.randperm(v, generator=g)[: v // 3]] = float("-inf")   # ids off the vocabulary
    x = x.to(DEV)
    want_v, want_i = vocab_topk_naive(x, k)
    got_v, got_i = vocab_topk(x, k)
    assert torch.equal(got_i, want_i) and torch.equal(got_v, want_v)
    cpu_v, cpu_i = _vocab_top(x.cpu(), k)               # the torch path the CPU round takes
    assert torch.equal(cpu_i, want_i.cpu())


def test_vocab_topk_maps_ids_and_clamps():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 300, generator=g)
    x[:, 5] = 0.25                                   # above 0: capped
    id_map = torch.randperm(1000, generator=g)[:300].sort().values
    x, id_map = x.to(DEV), id_map.to(DEV)
    want_v, want_i = vocab_topk_naive(x, 6, id_map, clamp=True)
    got_v, got_i = vocab_topk(x, 6, id_map, clamp=True)
    assert torch.equal(got_i, want_i) and torch.equal(got_v, want_v) and (got_v <= 0).all()
    assert torch.equal(want_i, id_map[vocab_topk_naive(x, 6)[1]])


def test_vocab_topk_refuses_bad_shapes():
    with pytest.raises(ValueError, match="vocab_topk"):
        vocab_topk(torch.zeros(2, 5, device=DEV), 6)
    with pytest.raises(ValueError, match="vocab_topk"):
        vocab_topk(torch.zeros(2, 20000, device=DEV), 4)
    with pytest.raises(ValueError, match="id_map"):
        vocab_topk(torch.zeros(2, 50, device=DEV), 4, torch.arange(49, device=DEV))
