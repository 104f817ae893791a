"""Block-major selected branch of exact verification (opt-in: `nsa_verify(..., block_major=True)`).

Grouped verification loads a group's union once, but C queries' union is still re-read by every other
group, and a C = 16 program computes rows that did not select the block. Here the selected blocks
below the step's window region are walked once per KV head over *all* queries: a plan kernel builds,
per head, the list of blocks and for each block the (query, slot) pairs that selected it (a CSR made
with a histogram, prefix sums and atomic slot counters: no sort), cut into work items of QC queries;
one program per item loads the block once, computes only its selecting rows, and writes one exact
partial (base-2 log-sum-exp and normalized output) per (query, head, slot). The window pass
(`nsa_verify_fwd_kernel` with BMERGE) then covers the window region and the tree and absorbs each
row's partials in slot order, so the result does not depend on scheduling. See README.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ssv.ops.nsa.verify import _entries
from ssv.ops.utils import pow2


@triton.jit
def nsa_bm_plan_fwd_kernel(
    blk, pos, ctr, csr, it_blk, it_chk, b_eo, b_cnt, n_items, N, W, s_bn, s_bh,
    NP: tl.constexpr, NSEL: tl.constexpr, NSELP: tl.constexpr, NB: tl.constexpr, BS: tl.constexpr,
    QC: tl.constexpr, CMAX: tl.constexpr,
):
    # one program per KV head
    i_h = tl.program_id(0)
    o_n = tl.arange(0, NP)
    minpos = tl.min(tl.load(pos + o_n, mask=o_n < N, other=1 << 30))
    lim = tl.maximum(minpos - W + 1, 0) // BS  # blocks below this are outside every query's window
    o_eq, b_e, m_e = _entries(blk, 0, N, i_h, s_bn, s_bh, NP, NSEL, NSELP)
    m_v = m_e & (b_e < lim)
    b_n = tl.histogram(b_e, NB, mask=m_v)  # [NB] selections per block
    b_c = (b_n + QC - 1) // QC  # work items per block
    b_io = tl.cumsum(b_c, 0) - b_c
    b_o = tl.cumsum(b_n, 0) - b_n
    o_b = tl.arange(0, NB)
    p_b = i_h.to(tl.int64) * NB + o_b
    tl.store(ctr + p_b, b_o)
    tl.store(b_eo + p_b, b_o)
    tl.store(b_cnt + p_b, b_n)
    tl.debug_barrier()
    # each selection takes the next free place of its block's range
    b_slot = tl.atomic_add(ctr + i_h.to(tl.int64) * NB + b_e, 1, mask=m_v)
    p_h = i_h.to(tl.int64) * (NP * NSELP)
    tl.store(csr + p_h + b_slot, tl.arange(0, NP * NSELP), mask=m_v)  # query * NSELP + slot
    for c in range(CMAX):
        tl.store(it_blk + p_h + b_io + c, o_b, mask=b_c > c)
        tl.store(it_chk + p_h + b_io + c, o_b * 0 + c, mask=b_c > c)
    tl.store(n_items + i_h, tl.sum(b_c))


@triton.jit
def nsa_bm_sel_fwd_kernel(
    q, k, v, k_desc, v_desc, csr, it_blk, it_chk, b_eo, b_cnt, n_items, plse, po, P, scale,
    s_qn, s_qh, s_kh, s_kt, HQ,
    G: tl.constexpr, QC: tl.constexpr, RB: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
    NB: tl.constexpr, E: tl.constexpr, NSELP: tl.constexpr, TMA: tl.constexpr,
):
    # one program per (KV head, work item); items past the head's count do nothing
    i_h, i_i = tl.program_id(0), tl.program_id(1)
    if i_i < tl.load(n_items + i_h):
        p_h = i_h.to(tl.int64) * E
        j = tl.load(it_blk + p_h + i_i)
        c = tl.load(it_chk + p_h + i_i)
        p_b = i_h.to(tl.int64) * NB + j
        start = tl.load(b_eo + p_b) + c * QC
        cnt = tl.minimum(tl.load(b_cnt + p_b) - c * QC, QC)
        o_r = tl.arange(0, RB)
        m_r = (o_r // G < cnt) & (o_r < QC * G)
        b_pk = tl.load(csr + p_h + start + o_r // G, mask=m_r, other=0)
        b_qi = (b_pk // NSELP).to(tl.int64)
        b_hq = i_h * G + o_r % G
        o_d = tl.arange(0, D)
        # [RB, D] the selecting queries' rows, scale and log2(e) folded in
        b_q = tl.load(q + b_qi[:, None] * s_qn + b_hq[:, None] * s_qh + o_d[None, :], mask=m_r[:, None], other=0.0)
        b_q = (b_q * (scale * 1.4426950408889634)).to(b_q.dtype)
        o_t = j * BS + tl.arange(0, BS)
        m_t = o_t < P
        if TMA:  # the verify kernel's descriptors: rows past the step read as zeros
            b_k = k_desc.load([i_h, j * BS, 0]).reshape(BS, D)
            b_v = v_desc.load([i_h, j * BS, 0]).reshape(BS, D)
        else:
            p_t = i_h.to(tl.int64) * s_kh + o_t.to(tl.int64)[:, None] * s_kt + o_d[None, :]
            b_k = tl.load(k + p_t, mask=m_t[:, None], other=0.0)
            b_v = tl.load(v + p_t, mask=m_t[:, None], other=0.0)
        b_s = tl.dot(b_q, tl.trans(b_k), input_precision="ieee")  # [RB, BS]
        b_s = tl.where(m_t[None, :], b_s, float("-inf"))
        b_m = tl.max(b_s, 1)
        b_p = tl.exp2(b_s - b_m[:, None])
        b_l = tl.sum(b_p, 1)
        b_o = tl.dot(b_p.to(b_v.dtype), b_v, input_precision="ieee") / b_l[:, None]
        p_s = (b_qi * HQ + b_hq) * NSELP + b_pk % NSELP  # (query, head, slot)
        tl.store(plse + p_s, b_m + tl.log2(b_l), mask=m_r)
        tl.store(po + p_s[:, None] * D + o_d[None, :], b_o.to(po.dtype.element_ty), mask=m_r[:, None])


@dataclass
class BlockMajorPlan:
    """One step's selections laid out block-major per KV head (block -> selecting (query, slot), cut
    into items of `qc` queries). It depends only on the selections and positions, so a refresh layer
    builds it (`block_major_plan`) and the layers that reuse its selections pass it to `nsa_verify`."""
    csr: torch.Tensor
    it_blk: torch.Tensor
    it_chk: torch.Tensor
    b_eo: torch.Tensor
    b_cnt: torch.Tensor
    n_items: torch.Tensor
    n: int
    hkv: int
    g: int
    nsel: int
    nb: int
    qc: int
    e: int
    prefix_len: int
    window: int
    slc_block: int

    def check(self, n: int, hkv: int, g: int, nsel: int, prefix_len: int, window: int, slc_block: int):
        want = (n, hkv, g, nsel, prefix_len, window, slc_block)
        got = (self.n, self.hkv, self.g, self.nsel, self.prefix_len, self.window, self.slc_block)
        if want != got:
            raise ValueError(f"block-major plan made for (N, Hkv, G, n, P, window, block) = {got}, used for {want}")


def block_major_plan(bi, pos, prefix_len: int, window: int, slc_block: int, g: int) -> BlockMajorPlan:
    """The block-major layout of selections bi [N, Hkv, n] (ascending, -1 padded) at positions pos [N]
    for GQA groups of g query heads: one launch, one program per KV head."""
    n, hkv, nsel = bi.shape
    nselp, np_ = pow2(nsel, 1), pow2(n, 1)
    nb = pow2(-(-max(prefix_len, 1) // slc_block) + 1, 1)
    qc = max(1, 16 // g)  # queries per item: ~16 rows
    e = np_ * nselp
    i32 = dict(device=bi.device, dtype=torch.int32)
    ctr, b_eo, b_cnt = (torch.empty(hkv * nb, **i32) for _ in range(3))
    csr, it_blk, it_chk = (torch.empty(hkv * e, **i32) for _ in range(3))
    n_items = torch.empty(hkv, **i32)
    nsa_bm_plan_fwd_kernel[(hkv,)](
        bi, pos, ctr, csr, it_blk, it_chk, b_eo, b_cnt, n_items, n, int(window), bi.stride(0), bi.stride(1),
        NP=np_, NSEL=nsel, NSELP=nselp, NB=nb, BS=slc_block, QC=qc, CMAX=triton.cdiv(np_, qc), num_warps=8)
    return BlockMajorPlan(csr, it_blk, it_chk, b_eo, b_cnt, n_items, n, hkv, g, nsel, nb, qc, e,
                          int(prefix_len), int(window), slc_block)


def block_major_partials(q, k, v, plan: BlockMajorPlan, scale: float, descs=None):
    """Per (query, head, slot) partials of the selected blocks below the step's window region:
    (lse2 [N, Hq, NSELP] base-2, o [N, Hq, NSELP, D] in q's dtype; unwritten slots are never read).
    descs: the verify kernel's (k, v) tensor descriptors, for TMA loads; None: pointer loads."""
    n, hq, d = q.shape
    nselp = pow2(plan.nsel, 1)
    plse = torch.empty(n * hq * nselp, device=q.device, dtype=torch.float32)
    po = torch.empty(n * hq * nselp * d, device=q.device, dtype=q.dtype)
    nsa_bm_sel_fwd_kernel[(plan.hkv, n * plan.nsel)](
        q, k, v, *(descs or (k, v)), plan.csr, plan.it_blk, plan.it_chk, plan.b_eo, plan.b_cnt, plan.n_items,
        plse, po, plan.prefix_len, float(scale), q.stride(0), q.stride(1), k.stride(0), k.stride(1), hq,
        G=plan.g, QC=plan.qc, RB=pow2(plan.qc * plan.g), D=d, BS=plan.slc_block, NB=plan.nb, E=plan.e,
        NSELP=nselp, TMA=descs is not None, num_warps=4)
    return plse, po
