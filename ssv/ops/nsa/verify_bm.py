"""Block-major selected branch of exact verification (opt-in: `nsa_verify(..., block_major=True)`).

Grouped verification loads a group's union once, but C queries' union is still re-read by every other
group, and a C = 16 program computes rows that did not select the block. Here the selected blocks
below the step's window region are walked once per KV head over *all* queries: a plan kernel sorts,
per head, the (block, query, slot) keys of the step's selections, so each block's selecting pairs form
one run, and cuts the runs into work items of QC queries (built once per refresh layer: `BlockMajorPlan`);
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
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def nsa_bm_plan_fwd_kernel(
    blk, pos, keys, it_start, n_items, N, W, s_bn, s_bh,
    NP: tl.constexpr, NSEL: tl.constexpr, NSELP: tl.constexpr, BS: tl.constexpr, QC: tl.constexpr,
):
    # one program per KV head. The selections below the step's window region, as keys block * E +
    # entry (entry = query * NSELP + slot), sorted: each block's selecting entries become one run, cut
    # into items of QC entries. A sort of the E = NP * NSELP keys, so the work does not grow with the
    # context (a histogram over all P / BS blocks did: Triton unrolls it per bin).
    E: tl.constexpr = NP * NSELP
    i_h = tl.program_id(0)
    o_n = tl.arange(0, NP)
    minpos = tl.min(tl.load(pos + o_n, mask=o_n < N, other=1 << 30))
    lim = tl.maximum(minpos - W + 1, 0) // BS  # blocks below this are outside every query's window
    o_eq, b_e, m_e = _entries(blk, 0, N, i_h, s_bn, s_bh, NP, NSEL, NSELP)
    m_v = m_e & (b_e < lim)
    o_e = tl.arange(0, E)
    b_k = tl.sort(tl.where(m_v, b_e * E + o_e, 0x7FFFFFFF))  # [E] the unused last
    b_b = b_k // E
    n_v = tl.sum(m_v.to(tl.int32))
    m_first = (o_e == 0) | (b_b != tl.gather(b_b, tl.maximum(o_e - 1, 0), 0))
    b_r = o_e - tl.associative_scan(tl.where(m_first, o_e, 0), 0, _max_combine)  # rank in its block's run
    m_it = (b_r % QC == 0) & (o_e < n_v)
    p_h = i_h.to(tl.int64) * E
    tl.store(keys + p_h + o_e, b_k)
    tl.store(it_start + p_h + tl.cumsum(m_it.to(tl.int32), 0) - 1, o_e, mask=m_it)
    tl.store(n_items + i_h, tl.sum(m_it.to(tl.int32)))


@triton.jit
def nsa_bm_sel_fwd_kernel(
    q, k, v, k_desc, v_desc, keys, it_start, n_items, plse, po, P, scale,
    s_qn, s_qh, s_kh, s_kt, HQ,
    G: tl.constexpr, QC: tl.constexpr, RB: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
    E: tl.constexpr, NSELP: tl.constexpr, TMA: tl.constexpr,
):
    # one program per (KV head, work item); items past the head's count do nothing
    i_h, i_i = tl.program_id(0), tl.program_id(1)
    if i_i < tl.load(n_items + i_h):
        p_h = i_h.to(tl.int64) * E
        start = tl.load(it_start + p_h + i_i)
        j = tl.load(keys + p_h + start) // E
        o_r = tl.arange(0, RB)
        m_r = (o_r < QC * G) & (start + o_r // G < E)
        b_key = tl.load(keys + p_h + start + o_r // G, mask=m_r, other=0x7FFFFFFF)
        m_r = m_r & (b_key // E == j)  # the rest of this block's run, up to QC entries
        b_pk = b_key % E
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
    """One step's selections laid out block-major per KV head: the sorted (block, query, slot) keys
    and the items (runs of up to `qc` entries of one block). It depends only on the selections and
    positions, so a refresh layer builds it (`block_major_plan`) and the layers that reuse its
    selections pass it to `nsa_verify`."""
    keys: torch.Tensor
    it_start: torch.Tensor
    n_items: torch.Tensor
    n: int
    hkv: int
    g: int
    nsel: int
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
    qc = max(1, 16 // g)  # queries per item: ~16 rows
    e = np_ * nselp
    if (-(-max(prefix_len, 1) // slc_block) + 1) * e >= 2 ** 31:
        raise ValueError(f"block-major keys (block * {e} + entry) overflow int32 at a context of {prefix_len}")
    i32 = dict(device=bi.device, dtype=torch.int32)
    keys, it_start = (torch.empty(hkv * e, **i32) for _ in range(2))
    n_items = torch.empty(hkv, **i32)
    nsa_bm_plan_fwd_kernel[(hkv,)](
        bi, pos, keys, it_start, n_items, n, int(window), bi.stride(0), bi.stride(1),
        NP=np_, NSEL=nsel, NSELP=nselp, BS=slc_block, QC=qc, num_warps=8)
    return BlockMajorPlan(keys, it_start, n_items, n, hkv, g, nsel, qc, e, int(prefix_len), int(window), slc_block)


def block_major_partials(q, k, v, plan: BlockMajorPlan, scale: float, descs=None):
    """Per (query, head, slot) partials of the selected blocks below the step's window region:
    (lse2 [N, Hq, NSELP] base-2, o [N, Hq, NSELP, D] in q's dtype; unwritten slots are never read).
    descs: the verify kernel's (k, v) tensor descriptors, for TMA loads; None: pointer loads."""
    n, hq, d = q.shape
    nselp = pow2(plan.nsel, 1)
    plse = torch.empty(n * hq * nselp, device=q.device, dtype=torch.float32)
    po = torch.empty(n * hq * nselp * d, device=q.device, dtype=q.dtype)
    nsa_bm_sel_fwd_kernel[(plan.hkv, n * plan.nsel)](
        q, k, v, *(descs or (k, v)), plan.keys, plan.it_start, plan.n_items,
        plse, po, plan.prefix_len, float(scale), q.stride(0), q.stride(1), k.stride(0), k.stride(1), hq,
        G=plan.g, QC=plan.qc, RB=pow2(plan.qc * plan.g), D=d, BS=plan.slc_block, E=plan.e,
        NSELP=nselp, TMA=descs is not None, num_warps=4)
    return plse, po
