"""The one-launch step metadata (`nsa_plan`) against its torch twin (`path_block_weights_device`), on
random trees around compression-block boundaries, into buffers poisoned with NaN and garbage."""
import pytest
import torch

from ssv.config import NSAConfig
from ssv.ops.nsa.plan import PlanBuffers, nsa_plan
from ssv.ops.nsa.route import path_block_weights_device

from .test_nsa_kernels import DEV, rand_tree

CASES = [  # seed, P, N, cmp_block, cmp_stride
    (0, 0, 1, 8, 4), (1, 7, 1, 8, 4), (2, 8, 1, 8, 4), (3, 150, 7, 8, 4), (4, 63, 12, 8, 4),
    (5, 301, 16, 16, 8), (6, 5, 9, 8, 4), (7, 4096, 48, 32, 16), (8, 1000, 33, 16, 16),
]


def _poison(buf: PlanBuffers, gen) -> None:
    buf.w.fill_(float("nan"))
    for t in (buf.s0, buf.nbpre, buf.n_path):
        t.copy_(torch.randint(-99, 99, t.shape, generator=gen).to(t))
    buf.tmask.fill_(7)
    buf.slots.fill_(-5)


@pytest.mark.parametrize("case", CASES)
def test_plan_kernel_equals_torch_twin(case):
    seed, P, N, l, d = case
    cfg = NSAConfig(cmp_block=l, cmp_stride=d, slc_block=max(16, l), n_select=4, forced_local=1, window=16)
    gen = torch.Generator().manual_seed(seed)
    depth, mask = rand_tree(N, gen, chain=seed % 3 == 0)
    pos, mask = (P + depth).to(DEV), mask.to(DEV)
    plen = torch.tensor([P], dtype=torch.int32, device=DEV)
    buf = PlanBuffers(N, cfg, DEV)
    for it in range(2):   # a refill must not depend on what the previous step left
        P, pos = P + 3 * it, pos + 3 * it
        plen.fill_(P)
        _poison(buf, gen)
        nsa_plan(plen, pos, mask, cfg, buf)
        w, s0, n_path = path_block_weights_device(plen, pos, mask, cfg)
        assert torch.equal(buf.w.cpu(), w.cpu())
        assert torch.equal(buf.s0.cpu(), s0.cpu()) and torch.equal(buf.n_path.cpu(), n_path.cpu())
        nb = (P - l) // d + 1 if P >= l else 0
        assert int(buf.nbpre) == nb
        assert torch.equal(buf.tmask.cpu(), mask.to(torch.uint8).cpu())
        assert torch.equal(buf.slots.cpu(), P + torch.arange(N))


def test_plan_kernel_refuses_mismatched_buffers():
    cfg = NSAConfig(cmp_block=8, cmp_stride=4, slc_block=16, n_select=4, forced_local=1, window=16)
    buf = PlanBuffers(4, cfg, DEV)
    plen = torch.zeros(1, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="buffers for 4 queries"):
        nsa_plan(plen, torch.arange(5, device=DEV), torch.ones(5, 5, dtype=torch.bool, device=DEV), cfg, buf)
