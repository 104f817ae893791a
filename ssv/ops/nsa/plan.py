"""The step metadata of a device-resident NSA plan in one launch.

`path_block_weights_device` (route.py) is its plain-PyTorch twin: ~40 small tensor ops whose
launches, in a captured AR step of the default model, were 78 of its 533 graph nodes (~0.3 ms of
launch gaps per step on the H200). This kernel writes the same tensors, plus the committed
compressed-block count and the tree mask as uint8, from one program per query.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssv.config import NSAConfig
from ssv.ops.pdl import pdl_args, pdl_prologue


@triton.jit
def nsa_plan_fwd_kernel(
    plen, pos, tmask_in, w, s0_out, nbpre_out, npath_out, tmask_out, slots_out, N, s_mn, s_wn, s_wb,
    L_CMP: tl.constexpr, STRIDE: tl.constexpr, NBP: tl.constexpr, BS: tl.constexpr, BN: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # program n: row n of the path weights w[n, b, j] over slots s0 + j (j < l + N), its path's
    # block count, its tree-mask row, its cache slot P + n; program 0 also the shared s0 and
    # committed block count
    pdl_prologue(PDL)
    i_n = tl.program_id(0)
    P = tl.load(plen).to(tl.int64)
    nb_pre = tl.where(P >= L_CMP, (P - L_CMP) // STRIDE + 1, 0)
    s0 = nb_pre * STRIDE
    o_j = tl.arange(0, BS)
    m_j = o_j < L_CMP + N
    slot = s0 + o_j
    new = (slot >= P) & (slot < P + N)
    node = tl.minimum(tl.maximum(slot - P, 0), N - 1)
    b_pos = tl.load(pos + node, mask=m_j, other=0).to(tl.int64)
    pos_slot = tl.where(new, b_pos, slot)                                                # [BS]
    b_vis = tl.load(tmask_in + i_n * s_mn + node, mask=m_j, other=0) != 0
    vis = tl.where(new, b_vis, slot < P)                                                 # [BS]
    for b in range(0, NBP):
        start = s0 + b * STRIDE
        memb = (pos_slot >= start) & (pos_slot < start + L_CMP)
        b_w = tl.where(vis & memb, 1.0 / L_CMP, 0.0)
        tl.store(w + i_n * s_wn + b * s_wb + o_j, b_w, mask=m_j)
    p1 = tl.load(pos + i_n).to(tl.int64) + 1
    n_path = tl.where(p1 >= L_CMP, (p1 - L_CMP) // STRIDE + 1, 0) - nb_pre
    tl.store(npath_out + i_n, tl.maximum(n_path, 0).to(tl.int32))
    tl.store(slots_out + i_n, P + i_n)
    o_c = tl.arange(0, BN)
    b_row = tl.load(tmask_in + i_n * s_mn + o_c, mask=o_c < N, other=0)
    tl.store(tmask_out + i_n * N + o_c, (b_row != 0).to(tl.uint8), mask=o_c < N)
    if i_n == 0:
        tl.store(s0_out, s0.to(tl.int32))
        tl.store(nbpre_out, nb_pre.to(tl.int32))


class PlanBuffers:
    """The fixed outputs a plan of N queries refills every step (their addresses are a graph's)."""

    def __init__(self, n: int, cfg: NSAConfig, device):
        self.n, self.cfg = n, cfg
        nbp = n // cfg.cmp_stride + 1
        self.w = torch.zeros(n, nbp, cfg.cmp_block + n, device=device, dtype=torch.float32)
        self.s0 = torch.zeros(1, device=device, dtype=torch.int32)
        self.nbpre = torch.zeros(1, device=device, dtype=torch.int32)
        self.n_path = torch.zeros(n, device=device, dtype=torch.int32)
        self.tmask = torch.zeros(n, n, device=device, dtype=torch.uint8)
        self.slots = torch.zeros(n, device=device, dtype=torch.long)


def nsa_plan(plen: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor, cfg: NSAConfig,
             out: PlanBuffers) -> PlanBuffers:
    """plen [1] int32, positions [N] int, tree_mask [N, N] bool/uint8 -> `out` refilled: w [N, N // d + 1,
    l + N] fp32, s0 [1], nbpre [1], n_path [N] int32 (as `path_block_weights_device` and the committed
    compressed-block count), tmask [N, N] uint8, slots [N] int64 (the new tokens' cache rows P + i).
    One launch."""
    n = positions.numel()
    if out.n != n or out.cfg != cfg or tree_mask.shape != (n, n) or plen.numel() != 1:
        raise ValueError(f"nsa_plan: buffers for {out.n} queries, got {n} positions and a "
                         f"{tuple(tree_mask.shape)} mask")
    tm = tree_mask.view(torch.uint8) if tree_mask.dtype == torch.bool else tree_mask
    if tm.stride(1) != 1:
        tm = tm.contiguous()
    pos = positions.contiguous()
    w = out.w
    nsa_plan_fwd_kernel[(n,)](plen, pos, tm, w, out.s0, out.nbpre, out.n_path, out.tmask, out.slots, n,
                              tm.stride(0), w.stride(0), w.stride(1), L_CMP=cfg.cmp_block, STRIDE=cfg.cmp_stride,
                              NBP=w.shape[1], BS=triton.next_power_of_2(w.shape[2]),
                              BN=triton.next_power_of_2(n), **pdl_args(w.device), num_warps=1)
    return out
