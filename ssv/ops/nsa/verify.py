"""Overlap-aware grouped NSA verification (the SSV kernel), selected + window + tree branches in one launch.

One program per (group of C consecutive queries, KV head, row split). Its rows are the group's
queries times the GQA group's query heads, so every K/V tile it loads serves all of them:
  A. selected blocks below the group's window region, walked as the union of the group's
     selections, built inside the kernel (each block loaded once; a row only attends to its own
     query's blocks);
  B. the window region [lo, P), in selection-block-aligned tiles, shared by the whole group;
  C. the new (tree) tokens [P, P+N), visible through each query's ancestor mask.
C = 1 is the naive per-query decode-style kernel used as the baseline. Approximate mode gives every
query its group representative's (first query's) selection. See README.md for the math.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ssv.ops.utils import ctas_per_sm, pow2, sm_count, sm_limits


@triton.jit
def _online(b_s, m_s, b_v, b_m, b_l, b_acc):
    # one flash-attention step on base-2 scores; rows with nothing visible keep (−inf, 0, 0)
    b_s = tl.where(m_s, b_s, float("-inf"))
    b_mn = tl.maximum(b_m, tl.max(b_s, 1))
    b_ms = tl.where(b_mn == float("-inf"), 0.0, b_mn)
    b_p = tl.exp2(b_s - b_ms[:, None])
    b_alpha = tl.exp2(b_m - b_ms)
    b_l = b_l * b_alpha + tl.sum(b_p, 1)
    b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision="ieee")
    return b_mn, b_l, b_acc


@triton.jit
def _item(it, p_it, o_qb, o_t0, o_d, b_q, b_pos, kbase, vbase, k_desc, v_desc, i_h, P, W, s_kt,
          BS: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    # work item `it`: its tile's scores [BM, BS] and values [BS, D], and which scores each row may
    # use in the selected branch (its query selected the block) and in the window branch
    j = tl.load(p_it + 2 * it)
    member = (((tl.load(p_it + 2 * it + 1) >> o_qb) & 1) != 0)[:, None]
    o_t = j * BS + o_t0
    m_t = o_t < P
    if TMA:
        # the descriptors span the whole cache [Hkv, L, D]: rows past the step are finite (zeros,
        # or an earlier step's keys) and masked like the step's own rows in the last prefix tile
        b_k = k_desc.load([i_h, j * BS, 0]).reshape(BS, D)
        b_v = v_desc.load([i_h, j * BS, 0]).reshape(BS, D)
    else:
        p_t = o_t.to(tl.int64)[:, None] * s_kt + o_d[None, :]
        b_k = tl.load(kbase + p_t, mask=m_t[:, None], other=0.0)
        b_v = tl.load(vbase + p_t, mask=m_t[:, None], other=0.0)
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision="ieee")
    in_win = o_t[None, :] > (b_pos[:, None] - W)
    return b_s, b_v, member & m_t[None, :], in_win & m_t[None, :]


@triton.jit
def _lazy_kw(p_it, i_k, n_it, NSPLIT, o_qb, b_q, b_ref, b_pos, kbase, vbase, k_desc, v_desc, i_h, P, W, s_kt,
             BM: tl.constexpr, BS: tl.constexpr, KW: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr,
             GATED: tl.constexpr):
    # The lazy loop with each tile's keys cut into KW chunks, chunk w computed by warp w (a batched
    # dot puts the batch on the warps): a warp's scores stay in the registers its P·V dot reads, and
    # the only cross-warp step is one sum of the KW partial accumulators after the loop. The 2-D loop
    # splits the tile's columns across warps instead, so every iteration passes P through shared
    # memory behind barriers. Returns the 2-D (sum, acc) of both branches.
    BK: tl.constexpr = BS // KW
    o_kt = tl.arange(0, BS).reshape(KW, BK)
    o_ks = o_kt[:, None, :]                                # [KW, 1, BK] a score column's key
    o_d = tl.arange(0, D)
    b_q3 = tl.broadcast_to(b_q[None, :, :], (KW, BM, D))   # [KW, BM, D]
    b_r3 = b_ref[None, :, None]
    b_lp1 = tl.zeros([KW, BM, BK], tl.float32)
    b_lp2 = tl.zeros([KW, BM, BK], tl.float32)
    b_a1 = tl.zeros([KW, BM, D], tl.float32)
    b_a2 = tl.zeros([KW, BM, D], tl.float32)
    for it in range(i_k, n_it, NSPLIT):
        j = tl.load(p_it + 2 * it)
        member = (((tl.load(p_it + 2 * it + 1) >> o_qb) & 1) != 0)[None, :, None]
        if TMA:
            b_k = k_desc.load([i_h, j * BS, 0]).reshape(KW, BK, D)
            b_v = v_desc.load([i_h, j * BS, 0]).reshape(KW, BK, D)
        else:
            o_t3 = j * BS + o_kt[:, :, None]
            p_t = o_t3.to(tl.int64) * s_kt + o_d[None, None, :]
            b_k = tl.load(kbase + p_t, mask=o_t3 < P, other=0.0)
            b_v = tl.load(vbase + p_t, mask=o_t3 < P, other=0.0)
        b_s = tl.dot(b_q3, tl.permute(b_k, (0, 2, 1)), input_precision="ieee")  # [KW, BM, BK]
        o_t = j * BS + o_ks
        m_t = o_t < P
        b_x = tl.exp2(b_s - b_r3)
        if GATED:
            b_p1 = tl.where(member & m_t, b_x, 0.0)
            b_p2 = tl.where((o_t > (b_pos[None, :, None] - W)) & m_t, b_x, 0.0)
            b_lp2 += b_p2
            b_a2 += tl.dot(b_p2.to(b_v.dtype), b_v, input_precision="ieee")
        else:
            b_p1 = tl.where((member | (o_t > (b_pos[None, :, None] - W))) & m_t, b_x, 0.0)
        b_lp1 += b_p1
        b_a1 += tl.dot(b_p1.to(b_v.dtype), b_v, input_precision="ieee")
    return tl.sum(tl.sum(b_lp1, 2), 0), tl.sum(b_a1, 0), tl.sum(tl.sum(b_lp2, 2), 0), tl.sum(b_a2, 0)


@triton.jit
def _combine(b_m, b_l, b_acc, b_ms, b_ls, b_as):
    # two softmax states (max or any reference, sum, acc; base-2) of the same rows merged into one;
    # empty states are (-inf, 0, 0)
    b_mn = tl.maximum(b_m, b_ms)
    b_mx = tl.where(b_mn == float("-inf"), 0.0, b_mn)
    b_alpha = tl.exp2(b_m - b_mx)
    b_beta = tl.exp2(b_ms - b_mx)
    return b_mn, b_l * b_alpha + b_ls * b_beta, b_acc * b_alpha[:, None] + b_as * b_beta[:, None]


@triton.jit
def _absorb(b_ls, b_os, b_m, b_l, b_acc):
    # merge a normalized partial (base-2 log-sum-exp b_ls, output b_os: the state (b_ls, 1, b_os))
    return _combine(b_m, b_l, b_acc, b_ls, 1.0, b_os)


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _bits(b_e, o_eq, b_blocks):
    # for each block of b_blocks [X]: bit c set when query c's entries (b_e [E], query o_eq) hold it
    return tl.reduce(tl.where(b_e[None, :] == b_blocks[:, None], 1 << o_eq[None, :], 0), 1, _or)


@triton.jit
def _entries(blk, q0, N, i_h, s_bn, s_bh, NQ: tl.constexpr, NSEL: tl.constexpr, NSELP: tl.constexpr):
    # the selections of queries q0 .. q0+NQ-1 at KV head i_h, flat [NQ * NSELP]: (query within the
    # range, block as int32, -1 padded; mask of real entries that are not a repeat of the previous
    # slot -- a query's own list is ascending, so a repeat is the same block again)
    o_e = tl.arange(0, NQ * NSELP)
    o_eq = o_e // NSELP
    o_es = o_e % NSELP
    m_e = (o_es < NSEL) & (q0 + o_eq < N)
    p_e = blk + (q0 + o_eq).to(tl.int64) * s_bn + i_h * s_bh + o_es
    b_e = tl.load(p_e, mask=m_e, other=-1).to(tl.int32)
    b_e1 = tl.load(p_e - 1, mask=m_e & (o_es > 0), other=-1).to(tl.int32)
    return o_eq, b_e, (b_e >= 0) & (b_e != b_e1)


@triton.jit
def _empty_states(BM: tl.constexpr, D: tl.constexpr):
    # (max, sum, acc) of the two softmax branches before any key
    return (tl.full([BM], float("-inf"), tl.float32), tl.zeros([BM], tl.float32), tl.zeros([BM, D], tl.float32),
            tl.full([BM], float("-inf"), tl.float32), tl.zeros([BM], tl.float32), tl.zeros([BM, D], tl.float32))


@triton.jit
def _finish(b_m, b_l, b_acc):
    b_o = b_acc / tl.where(b_l > 0, b_l, 1.0)[:, None]
    b_lse = tl.where(b_l > 0, (b_m + tl.log2(tl.where(b_l > 0, b_l, 1.0))) * 0.6931471805599453, float("-inf"))
    return b_o, b_lse


@triton.jit(do_not_specialize=["PB"])
def nsa_verify_fwd_kernel(
    q, k, v, k_desc, v_desc, pos, tmask, blk, gates, o_cmp, o, lse_a, lse_b, ws_m, ws_l, ws_a, items, plse, po, cnt,
    plen, N, W, scale, NSPLIT, NU, PB,
    s_qn, s_qh, s_kh, s_kt, s_bn, s_bh, s_tn, HQ,
    G: tl.constexpr, C: tl.constexpr, CQ: tl.constexpr, CE: tl.constexpr, BM: tl.constexpr, D: tl.constexpr,
    BS: tl.constexpr, NSEL: tl.constexpr, NSELP: tl.constexpr, BT: tl.constexpr, NWP: tl.constexpr, NTB: tl.constexpr,
    GATED: tl.constexpr, APPROX: tl.constexpr, SPLIT: tl.constexpr, TMA: tl.constexpr, LAZY: tl.constexpr,
    BMERGE: tl.constexpr, NP: tl.constexpr, KW: tl.constexpr, FOLD: tl.constexpr, PART: tl.constexpr,
):
    i_g, i_h, i_z = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_s, i_k = i_z // NSPLIT, i_z % NSPLIT       # row split, KV split
    # the committed prefix length, read from device memory: no launch argument moves with the
    # context, so one captured graph replays at every length
    P = tl.load(plen)
    o_r = i_s * BM + tl.arange(0, BM)
    o_qi = i_g * C + o_r // G
    m_r = (o_r < C * G) & (o_qi < N)
    o_hq = i_h * G + o_r % G
    o_d = tl.arange(0, D)
    o_qi64 = o_qi.to(tl.int64)
    # [BM, D]; the softmax scale and log2(e) are folded into q once
    b_q = tl.load(q + o_qi64[:, None] * s_qn + o_hq[:, None] * s_qh + o_d[None, :], mask=m_r[:, None], other=0.0)
    b_q = (b_q * (scale * 1.4426950408889634)).to(b_q.dtype)
    b_pos = tl.load(pos + o_qi, mask=m_r, other=0)
    o_k = tl.arange(0, NSELP)

    b_m1, b_l1, b_a1, b_m2, b_l2, b_a2 = _empty_states(BM, D)

    # Work items: the group's union blocks below the window region, then the window region's
    # block-aligned tiles up to P; KV split i_k takes every NSPLIT-th item.
    # PART 1 / 2 (the window pass, `window_group`): the union below the step's window region in
    # groups of C, then that region and the tree in larger groups, merging the first launch's states
    if BMERGE or PART > 0:  # another pass took every selected block below the step's window region
        minpos = tl.min(tl.load(pos + tl.arange(0, NP), mask=tl.arange(0, NP) < N, other=1 << 30))
    else:
        minpos = tl.min(tl.where(m_r, b_pos, 1 << 30))
    lo = tl.maximum(minpos - W + 1, 0)
    lim = lo // BS
    # The union is built here, not on the host: the group's CQ*NSELP entries [CE], each kept if no
    # earlier query of the group (nor its own previous slot) selected the same block, then
    # ranked by a prefix sum; no sort and no extra launch.
    o_eq, b_e, m_e = _entries(blk, i_g * C, N, i_h, s_bn, s_bh, CQ, NSEL, NSELP)
    m_first = m_e & (b_e < lim)
    if BMERGE or PART == 2:  # no union items: they are another pass's
        m_first = m_first & (b_e < 0)
    # b_bits: which of the group's queries selected each entry's block (bit c: query c of the group)
    b_bits = tl.zeros([CE], tl.int32)
    for c in tl.static_range(0, CQ):
        o_cq = (i_g * C + c).to(tl.int64)
        b_lc = tl.load(blk + o_cq * s_bn + i_h * s_bh + o_k, mask=(o_k < NSEL) & (o_cq < N), other=-1)
        b_hit = tl.sum((b_e[:, None] == b_lc.to(tl.int32)[None, :]).to(tl.int32), 1) > 0  # [CE]
        b_bits = b_bits | tl.where(b_hit, 1 << c, 0)
        m_first = m_first & ~(b_hit & (o_eq > c))
    b_rank = tl.cumsum(m_first.to(tl.int32), 0) - 1
    b_rank = tl.where(m_first, b_rank, -1)
    n_a = tl.sum(m_first.to(tl.int32))
    n_w = tl.maximum(tl.cdiv(P - lim * BS, BS), 0)
    if PART == 1:
        n_w = 0
    o_t0 = tl.arange(0, BS)
    kbase = k + i_h * s_kh
    vbase = v + i_h * s_kh
    # a row's query within the group, for the membership bits (approximate: the representative's)
    o_qb = o_r * 0 if APPROX else o_r // G
    # The work list (block, query bits) goes to this program's scratch row once, so an iteration
    # reads two scalars instead of reducing over the group's entries and each row's list (v3 did:
    # 13 barriers per iteration instead of 9, ~430 instructions per warp instead of ~310 with TMA).
    p_it = items + ((i_g * tl.num_programs(1) + i_h) * tl.num_programs(2) + i_z).to(tl.int64) * (2 * (CE + NWP) + NTB)
    tl.store(p_it + 2 * b_rank, b_e, mask=m_first)
    tl.store(p_it + 2 * b_rank + 1, b_bits, mask=m_first)
    # window-region tiles lim + w: their bits too (a tile may hold a query's selected block
    # partly outside that query's window), 16 tiles at a time so a long window stays small
    o_w = tl.arange(0, 16)
    # b_any: the queries with a selected block among the items (whose empty selected branch is no
    # underflow)
    b_any = tl.reduce(tl.where(m_first, b_bits, 0), 0, _or)
    for w0 in range(0, n_w, 16):
        m_w = w0 + o_w < n_w
        b_wb = tl.where(m_w, _bits(b_e, o_eq, lim + w0 + o_w), 0)
        tl.store(p_it + 2 * (n_a + w0 + o_w), lim + w0 + o_w, mask=m_w)
        tl.store(p_it + 2 * (n_a + w0 + o_w) + 1, b_wb, mask=m_w)
        b_any = b_any | tl.reduce(b_wb, 0, _or)
    # and the bits of the blocks the step's new tokens fall in, P // BS + u
    o_u = tl.arange(0, NTB)
    tl.store(p_it + 2 * (CE + NWP) + o_u, _bits(b_e, o_eq, P // BS + o_u))
    tl.debug_barrier()
    n_redo = 1
    if LAZY:
        # Softmax against a fixed reference instead of a running max: each row's score on its own
        # new token (every query sees itself), so no row max and no row sum cross the warps per
        # iteration; p is summed elementwise and reduced once. Exact unless exp2 over/underflows,
        # which the sums show: then the program redoes the prefix with the online softmax.
        p_self = (P + o_qi64)[:, None] * s_kt + o_d[None, :]
        b_ref = tl.sum(b_q.to(tl.float32) * tl.load(kbase + p_self, mask=m_r[:, None], other=0.0).to(tl.float32), 1)
        if KW > 1:
            b_l1, b_a1, b_l2, b_a2 = _lazy_kw(p_it, i_k, n_a + n_w, NSPLIT, o_qb, b_q, b_ref, b_pos, kbase, vbase,
                                              k_desc, v_desc, i_h, P, W, s_kt, BM, BS, KW, D, TMA, GATED)
        else:
            b_lp1 = tl.zeros([BM, BS], tl.float32)
            b_lp2 = tl.zeros([BM, BS], tl.float32)
            for it in range(i_k, n_a + n_w, NSPLIT):
                b_s, b_v, m_sel, m_win = _item(it, p_it, o_qb, o_t0, o_d, b_q, b_pos, kbase, vbase, k_desc, v_desc,
                                               i_h, P, W, s_kt, BS, D, TMA)
                b_x = tl.exp2(b_s - b_ref[:, None])
                if GATED:
                    b_p1 = tl.where(m_sel, b_x, 0.0)
                    b_p2 = tl.where(m_win, b_x, 0.0)
                    b_lp2 += b_p2
                    b_a2 += tl.dot(b_p2.to(b_v.dtype), b_v, input_precision="ieee")
                else:
                    b_p1 = tl.where(m_sel | m_win, b_x, 0.0)
                b_lp1 += b_p1
                b_a1 += tl.dot(b_p1.to(b_v.dtype), b_v, input_precision="ieee")
            b_l1 = tl.sum(b_lp1, 1)
            b_l2 = tl.sum(b_lp2, 1)
        # a sum in [2^-64, 2^100], or 0 for a branch with nothing visible among the items: a row
        # selected none of their blocks, its window lies past them (or in the tree)
        sel_vis = ((b_any >> o_qb) & 1) != 0
        win_vis = (W > 0) & (b_pos - W + 1 < P) & (n_w > 0)
        if GATED:
            ok = ((b_l1 >= 5.4e-20) & (b_l1 <= 1.2e30)) | ((b_l1 == 0) & ~sel_vis)
            ok = ok & (((b_l2 >= 5.4e-20) & (b_l2 <= 1.2e30)) | ((b_l2 == 0) & ~win_vis))
        else:
            ok = ((b_l1 >= 5.4e-20) & (b_l1 <= 1.2e30)) | ((b_l1 == 0) & ~(sel_vis | win_vis))
        n_redo = tl.sum(tl.where(m_r & ~ok, 1, 0))
        b_m1 = tl.where(b_l1 > 0, b_ref, float("-inf"))  # an empty state's max is -inf, as the merges expect
        b_m2 = tl.where(b_l2 > 0, b_ref, float("-inf"))
    if n_redo > 0:
        b_m1, b_l1, b_a1, b_m2, b_l2, b_a2 = _empty_states(BM, D)
        for it in range(i_k, n_a + n_w, NSPLIT):
            b_s, b_v, m_sel, m_win = _item(it, p_it, o_qb, o_t0, o_d, b_q, b_pos, kbase, vbase, k_desc, v_desc,
                                           i_h, P, W, s_kt, BS, D, TMA)
            if GATED:
                b_m1, b_l1, b_a1 = _online(b_s, m_sel, b_v, b_m1, b_l1, b_a1)
                b_m2, b_l2, b_a2 = _online(b_s, m_win, b_v, b_m2, b_l2, b_a2)
            else:
                b_m1, b_l1, b_a1 = _online(b_s, m_sel | m_win, b_v, b_m1, b_l1, b_a1)

    # the step's new tokens, seen only along each query's own path (KV split 0)
    if i_k == 0 and PART != 1:
        for n0 in range(0, N, BT):
            o_n = n0 + tl.arange(0, BT)
            m_n = o_n < N
            b_pn = tl.load(pos + o_n, mask=m_n, other=0)
            if TMA:  # BT == BS here; rows past P + N are finite and masked by `anc`
                b_k = k_desc.load([i_h, P + n0, 0]).reshape(BT, D)
                b_v = v_desc.load([i_h, P + n0, 0]).reshape(BT, D)
            else:
                p_t = (P + o_n).to(tl.int64)[:, None] * s_kt + o_d[None, :]
                b_k = tl.load(kbase + p_t, mask=m_n[:, None], other=0.0)
                b_v = tl.load(vbase + p_t, mask=m_n[:, None], other=0.0)
            b_s = tl.dot(b_q, tl.trans(b_k), input_precision="ieee")
            anc = tl.load(tmask + o_qi64[:, None] * s_tn + o_n[None, :], mask=m_r[:, None] & m_n[None, :], other=0) != 0
            blk_n = b_pn // BS
            # one gather of the prologue's bits (NSEL compares per row here cost ~50 registers)
            b_tb = tl.load(p_it + 2 * (CE + NWP) + blk_n - P // BS, mask=m_n, other=0)
            member = ((b_tb[None, :] >> o_qb[:, None]) & 1) != 0
            in_win = b_pn[None, :] > (b_pos[:, None] - W)
            if GATED:
                b_m1, b_l1, b_a1 = _online(b_s, anc & member, b_v, b_m1, b_l1, b_a1)
                b_m2, b_l2, b_a2 = _online(b_s, anc & in_win, b_v, b_m2, b_l2, b_a2)
            else:
                b_m1, b_l1, b_a1 = _online(b_s, anc & (in_win | member), b_v, b_m1, b_l1, b_a1)

    p_l = o_qi64 * HQ + o_hq
    p_o = p_l[:, None] * D + o_d[None, :]
    if BMERGE:
        if i_k == 0:  # the block-major partials of each row's own selected blocks, in slot order
            for kk in range(NSEL):
                p_k = blk + o_qi64 * s_bn + i_h * s_bh + kk
                b_bk = tl.load(p_k, mask=m_r, other=-1)
                b_bk1 = tl.load(p_k - 1, mask=m_r & (kk > 0), other=-1)
                m_s = m_r & (b_bk >= 0) & (b_bk < lim) & (b_bk != b_bk1)
                p_s = p_l * NSELP + kk
                b_ls = tl.load(plse + p_s, mask=m_s, other=float("-inf"))
                b_os = tl.load(po + p_s[:, None] * D + o_d[None, :], mask=m_s[:, None], other=0.0).to(tl.float32)
                b_m1, b_l1, b_a1 = _absorb(b_ls, b_os, b_m1, b_l1, b_a1)
    if SPLIT or PART > 0:
        # partial softmax states, merged by nsa_verify_combine_kernel or a folded merge; a window
        # pass's follow the union pass's NU
        p_w = ((NU + i_k) * N * HQ + p_l) * 2
        tl.store(ws_m + p_w, b_m1, mask=m_r)
        tl.store(ws_l + p_w, b_l1, mask=m_r)
        tl.store(ws_a + p_w[:, None] * D + o_d[None, :], b_a1, mask=m_r[:, None])
        if GATED:
            tl.store(ws_m + p_w + 1, b_m2, mask=m_r)
            tl.store(ws_l + p_w + 1, b_l2, mask=m_r)
            tl.store(ws_a + (p_w + 1)[:, None] * D + o_d[None, :], b_a2, mask=m_r[:, None])
        if FOLD or PART == 2:
            # The last of the (group, head, row split)'s KV splits to finish merges them all, so
            # no second launch: the barrier puts every thread's partial stores before the counter's
            # release, the acquire puts the others' before the loads (.cg: past this SM's L1), and
            # the last program leaves the counter at zero for the next launch.
            tl.debug_barrier()
            p_c = cnt + (i_g * tl.num_programs(1) + i_h) * (tl.num_programs(2) // NSPLIT) + i_s
            if tl.atomic_add(p_c, 1, sem="acq_rel", scope="gpu") == NSPLIT - 1:
                tl.store(p_c, 0)
                p_w0 = p_l * 2
                b_m1, b_l1, b_a1 = _gather(ws_m, ws_l, ws_a, p_w0, m_r, o_d, N * HQ * 2, NU + NSPLIT, BM, D)
                if GATED:
                    b_m2, b_l2, b_a2 = _gather(ws_m, ws_l, ws_a, p_w0 + 1, m_r, o_d, N * HQ * 2, NU + NSPLIT, BM, D)
                _write(b_m1, b_l1, b_a1, b_m2, b_l2, b_a2, p_l, p_o, m_r, gates, o_cmp, o, lse_a, lse_b, GATED)
    else:
        _write(b_m1, b_l1, b_a1, b_m2, b_l2, b_a2, p_l, p_o, m_r, gates, o_cmp, o, lse_a, lse_b, GATED)


@triton.jit
def _gather(ws_m, ws_l, ws_a, p_w, m_r, o_d, s_split, NSPLIT, BM: tl.constexpr, D: tl.constexpr):
    # the KV splits' partial states of BM rows (slots p_w [BM], one split every s_split slots) merged
    b_m = tl.full([BM], float("-inf"), tl.float32)
    b_l = tl.zeros([BM], tl.float32)
    b_a = tl.zeros([BM, D], tl.float32)
    for i_k in range(NSPLIT):
        p_s = p_w + i_k * s_split
        b_ms = tl.load(ws_m + p_s, mask=m_r, other=float("-inf"), cache_modifier=".cg")
        b_ls = tl.load(ws_l + p_s, mask=m_r, other=0.0, cache_modifier=".cg")
        b_as = tl.load(ws_a + p_s[:, None] * D + o_d[None, :], mask=m_r[:, None], other=0.0, cache_modifier=".cg")
        b_m, b_l, b_a = _combine(b_m, b_l, b_a, b_ms, b_ls, b_as)
    return b_m, b_l, b_a


@triton.jit
def _write(b_m1, b_l1, b_a1, b_m2, b_l2, b_a2, p_l, p_o, m_r, gates, o_cmp, o, lse_a, lse_b, GATED: tl.constexpr):
    # o, o_cmp [N, Hq, D], lse_* [N, Hq], gates [N, Hq, 3]: contiguous
    b_o1, b_lse1 = _finish(b_m1, b_l1, b_a1)
    if GATED:
        b_o2, b_lse2 = _finish(b_m2, b_l2, b_a2)
        b_oc = tl.load(o_cmp + p_o, mask=m_r[:, None], other=0.0)
        b_gc = tl.load(gates + p_l * 3 + 0, mask=m_r, other=0.0)
        b_gs = tl.load(gates + p_l * 3 + 1, mask=m_r, other=0.0)
        b_gw = tl.load(gates + p_l * 3 + 2, mask=m_r, other=0.0)
        b_out = b_gc[:, None] * b_oc + b_gs[:, None] * b_o1 + b_gw[:, None] * b_o2
        tl.store(lse_b + p_l, b_lse2, mask=m_r)
    else:
        b_out = b_o1
    tl.store(o + p_o, b_out.to(o.dtype.element_ty), mask=m_r[:, None])
    tl.store(lse_a + p_l, b_lse1, mask=m_r)


# Launch configuration: a fixed table by default (`launch_config`), autotuning only on request
# (tune=True: once per compiled variant and context bucket PB, the bit length of P). The table is what
# fixed-config probes measured best side by side (H200, Llama 64K / 64, bench/results/probe-h200-dcbd9d3.txt):
# 4 warps and 3 stages for 16- and 32-row tiles (2 stages 1.19x slower, 8 warps 1.14x), 8 warps for
# exact 64-row tiles (4 warps 1.43x slower), 4 for approximate ones (8 warps 1.23x slower). Tuning inside
# a run is not reproducible: in the 60-case matrix of dcbd9d3 (kernels.json), tuned while another process
# compiled on the same host, exact C = 4 at Llama 64K / 64 ran 56 us against 34 us at the table's config.
# The kernel only writes its outputs and its own scratch, so re-running it while tuning is harmless.
def launch_config(bm: int, d: int, approx: bool, kw: int = 1) -> dict:
    """The default (untuned) launch of the verify kernel for BM-row tiles of head dim d. Tiles larger
    than any measured (128 rows at d = 128: GQA groups of 8+) keep 2 stages for shared memory. With
    key chunks (kw > 1) there is one warp per chunk."""
    if kw > 1:
        return dict(num_warps=kw, num_stages=3)
    return dict(num_warps=8 if not approx and bm * d >= 8192 else 4, num_stages=3 if bm * d <= 8192 else 2)


# This version's three options, measured side by side (H200; bench/results/probe-h200-542b8d1.txt at
# fixed launches, Llama 64K / 64 queries, exact C = 4, lazy; the matrix in kernels.json at 0989fd0):
# - the folded merge: 29.0 us against 31.4 with the combine kernel (same 2 splits); over the matrix,
#   folding every split launch (0989fd0's default) was 0.92x the combine kernel (geometric mean of 36
#   cases): 1.03-1.09x where it needs 2 splits (Llama, 64 queries), down to 0.65x where a program
#   merges 8-16 splits alone (4-16 queries, nsa-1b). So by default it folds at most FOLD_MAX_SPLITS.
# - the key split: 35.9 (219 registers: 2 programs per SM where 3 fit, and no fewer instructions per
#   iteration); 0.80x in the matrix. Opt-in.
# - the window pass: 67.2 (its 64-row groups are as slow as exact C = 16); 0.36x in the matrix. Opt-in.
KEY_SPLIT_DEFAULT = False
FOLD_MAX_SPLITS = 2
WINDOW_GROUP_DEFAULT = 0


_OCCUPANCY: dict = {}  # (device, constexprs, launch, folded) -> programs per SM, read once per compiled variant


def occupancy(variant, consts, cfg, folded, q, k, v, kd, vd, pos, tm, bi, gt, oc, out, lse, n, prefix_len, window,
              scale):
    """Programs of this verify variant that fit on an SM at once, from its compiled registers and
    shared memory (compiled here if needed, with placeholder scratch: the code does not depend on it).
    variant: (device index, constexprs, launch) as sorted tuples, the cache key without `folded`."""
    key = (*variant, folded)
    if key not in _OCCUPANCY:
        i32 = torch.zeros(1, device=q.device, dtype=torch.int32)
        ck = nsa_verify_fwd_kernel.warmup(
            q, k, v, kd, vd, pos, tm, bi, gt, oc, out, lse, lse, lse, lse, lse, i32, lse, lse, i32,
            i32, n, int(window), float(scale), 2, 0, int(prefix_len).bit_length(),
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), bi.stride(0), bi.stride(1), tm.stride(0), q.shape[1],
            grid=(1,), **consts, SPLIT=True, FOLD=folded, **cfg)
        ck._init_handles()
        _OCCUPANCY[key] = ctas_per_sm(ck.n_regs, ck.metadata.shared, ck.metadata.num_warps, sm_limits(q.device))
    return _OCCUPANCY[key]


def tile_rows(rows: int, max_rows: int = 128) -> int:
    """BM: the rows of one program's tile for a group of `rows` (query, head) rows; more rows are
    cut into ceil(rows / BM) row splits."""
    return min(pow2(rows), pow2(max_rows))


def default_window_group(group_size: int, approx: bool, block_major: bool = False) -> int:
    """The window pass's group a call gets when it names none (0: one launch)."""
    return WINDOW_GROUP_DEFAULT if group_size < WINDOW_GROUP_DEFAULT and not (approx or block_major) else 0


def num_counters(n: int, hq: int, hkv: int, group_size: int, max_rows: int = 128) -> int:
    """Arrival counters a folded split merge uses: one per (query group, KV head, row split)."""
    rows = group_size * (hq // hkv)
    return triton.cdiv(n, group_size) * hkv * triton.cdiv(rows, tile_rows(rows, max_rows))


def key_chunks(bm: int, d: int, slc_block: int, gated: bool) -> int:
    """Key chunks per K/V tile for the lazy loop's key split (1: not possible): one warp per chunk
    of 16 keys or more (the bf16 mma's k), at most 4 warps, tiles of at most 16 rows, and each
    warp's own accumulators (rows x head dim x branches fp32) within 4096 elements, 128 registers a
    thread (compiled for sm_90: 32 rows x 128 spill; 16 x 128 x 2 branches take all 255 registers)."""
    kw = min(4, slc_block // 16)
    return kw if kw > 1 and bm <= 16 and bm * d * (1 + gated) <= 4096 else 1


TUNE_CONFIGS = [triton.Config({}, num_warps=w, num_stages=st) for w, st in ((4, 2), (4, 3), (8, 2), (8, 3))]
nsa_verify_fwd_tuned = triton.autotune(TUNE_CONFIGS, key=["C", "G", "D", "BM", "NSEL", "BT", "GATED", "APPROX",
                                                          "SPLIT", "TMA", "LAZY", "BMERGE", "KW", "FOLD", "PART", "PB"])(nsa_verify_fwd_kernel)


@triton.jit
def nsa_verify_combine_kernel(
    gates, o_cmp, o, lse_a, lse_b, ws_m, ws_l, ws_a, N, NSPLIT, HQ,
    NSP: tl.constexpr, D: tl.constexpr, GATED: tl.constexpr,
):
    # one program per (query, head): all KV splits' (max, sum, acc) in one load each, merged, gated
    i_l = tl.program_id(0).to(tl.int64)  # query * HQ + head
    o_s = tl.arange(0, NSP)[:, None]
    m_s = o_s < NSPLIT
    o_d = tl.arange(0, D)
    p_w = (o_s * N * HQ + i_l) * 2  # [NSP, 1]
    b_m1, b_l1, b_a1 = _merge(ws_m, ws_l, ws_a, p_w, m_s, o_d, D)
    b_m2, b_l2, b_a2 = b_m1, b_l1, b_a1
    if GATED:
        b_m2, b_l2, b_a2 = _merge(ws_m, ws_l, ws_a, p_w + 1, m_s, o_d, D)
    p_l = i_l + tl.zeros([1], tl.int64)
    _write(b_m1, b_l1, b_a1, b_m2, b_l2, b_a2, p_l, p_l[:, None] * D + o_d[None, :], p_l >= 0,
           gates, o_cmp, o, lse_a, lse_b, GATED)


@triton.jit
def _merge(ws_m, ws_l, ws_a, p_w, m_s, o_d, D: tl.constexpr):
    # partial states [NSP, 1] / [NSP, D] -> one row's (max [1], sum [1], acc [1, D]), base-2 scores
    b_m = tl.load(ws_m + p_w, mask=m_s, other=float("-inf"))
    b_mx = tl.max(b_m, 0)
    b_ms = tl.where(b_mx == float("-inf"), 0.0, b_mx)
    b_w = tl.exp2(b_m - b_ms[None, :])
    b_l = tl.sum(b_w * tl.load(ws_l + p_w, mask=m_s, other=0.0), 0)
    b_a = tl.sum(b_w * tl.load(ws_a + p_w * D + o_d[None, :], mask=m_s, other=0.0), 0, keep_dims=True)
    return b_mx, b_l, b_a


def nsa_verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len, positions: torch.Tensor,
               tree_mask: torch.Tensor, block_indices: torch.Tensor, slc_block: int, window: int,
               group_size: int = 1, approx: bool = False, gates: Optional[torch.Tensor] = None,
               o_cmp: Optional[torch.Tensor] = None, scale: Optional[float] = None,
               out: Optional[torch.Tensor] = None, max_rows: int = 128, n_split: Optional[int] = None,
               tune: Optional[bool] = None, launch: Optional[dict] = None, tma: Optional[bool] = None,
               lazy: Optional[bool] = None, block_major: bool = False, bm_plan=None,
               key_split: Optional[bool] = None, fold: Optional[bool] = None,
               counters: Optional[torch.Tensor] = None, window_group: Optional[int] = None):
    """Selected + window attention of N queries (see module docstring).

    q [N, Hq, D]; k, v [Hkv, L, D]; positions [N] int; tree_mask [N, N] (bool/uint8); block_indices
    [N, Hkv, n] ascending, -1 padded; gates [N, Hq, 3] and o_cmp [N, Hq, D] for gated NSA (None:
    union gating). Returns (o [N, Hq, D] in q's dtype, lse_a [N, Hq], lse_b [N, Hq]): for union
    gating lse_a is the log-sum-exp over selected ∪ window; for gated, lse_a / lse_b are the
    selected / window branches'.
    tma: K/V tiles through tensor descriptors (default: on Hopper or newer with 16-byte aligned
    caches), else pointer loads. Positions must lie in [prefix_len, prefix_len + N), as a plan's do.
    prefix_len: an int, or an int32 [1] device tensor that the kernel reads (no host sync, and a
    captured graph replays at any length): the launch is then sized for the cache's capacity and
    the TMA descriptors span the whole cache, whose slots past the step must hold finite values
    (a KVCache's do: zeros or earlier steps' keys).
    tune: autotune the launch (once per compiled variant and context bucket); default: the fixed
    table of `launch_config`. launch: an explicit (num_warps, num_stages), for probes.
    lazy: softmax against each row's score on its own token (no per-iteration row max or row sum),
    with an in-kernel fallback to the online softmax when that over/underflows. Default: on in exact
    mode, off in approximate mode, as measured side by side on the H200 at fixed launch configs
    (Llama 64K / 64: exact C = 4 1.14x, per-query 1.23x, approximate C = 16 0.83x; real routing of the
    default model: exact C = 4 1.13-1.19x); bench/NOTES.md has the autotuned matrix, where the gain
    drowned in tuning noise.
    block_major (exact mode only; off by default: 0.48x of exact C = 4 in the 0989fd0 matrix): the
    selected blocks below the step's window region go through `verify_bm` (each loaded once per KV
    head, only its selecting rows computed) and this kernel covers the window region and the tree,
    absorbing those partials. bm_plan: a `verify_bm.BlockMajorPlan` of these selections (a refresh
    layer's, for the layers that reuse them); None: built here.
    key_split (lazy only): each K/V tile's keys cut into one chunk per warp (`key_chunks`), so no
    per-iteration exchange between warps. Default: `KEY_SPLIT_DEFAULT` where `key_chunks` allows it.
    fold (with KV splits): the last split of each program group to finish merges the splits itself,
    instead of a second launch (`nsa_verify_combine_kernel`). Default: when the folded launch needs at
    most `FOLD_MAX_SPLITS` splits (beyond, one program merging many splits costs more than the launch).
    counters: its int32 arrival counters, `num_counters(...)` of them, zero before the call and left
    zero by it, so a plan allocates them once for every layer; None: allocated (zeroed) here.
    window_group (exact mode): two launches instead of one. The first walks each C-query group's
    union below the step's window region; the second walks that region (every query's window lies
    in it) and the tree in groups of window_group queries, and merges the first's partial states:
    the window, read by every group, is read by C / window_group as many programs. Default:
    `WINDOW_GROUP_DEFAULT` where it is above C (0: one launch).
    """
    q = q.contiguous()
    n, hq, d = q.shape
    hkv = k.shape[0]
    lazy = not approx if lazy is None else bool(lazy)
    on_device = isinstance(prefix_len, torch.Tensor)
    if on_device:
        if block_major or tune:
            raise ValueError("a device-resident prefix length works with neither block_major nor tune")
        plen, prefix_len = prefix_len, k.shape[1] - n   # launch sized for the largest prefix the cache holds
    else:
        prefix_len = int(prefix_len)
        plen = torch.full((1,), prefix_len, device=q.device, dtype=torch.int32)
    check_shapes(n, hq, d, hkv, k, v, prefix_len, slc_block, group_size, block_indices)
    g = hq // hkv
    gated = gates is not None
    if gated and (o_cmp is None or gates.shape != (n, hq, 3) or o_cmp.shape != (n, hq, d)):
        raise ValueError("gated NSA needs gates [N, Hq, 3] and o_cmp [N, Hq, D]")
    scale = d ** -0.5 if scale is None else scale
    out = torch.empty_like(q) if out is None else out
    lse_a = torch.empty(n, hq, device=q.device, dtype=torch.float32)
    lse_b = torch.empty_like(lse_a)
    if n == 0:
        return out, lse_a, lse_b
    nsel = block_indices.shape[-1]
    # no conversions when the plan already holds these dtypes: a layer's run is the launch alone
    tm = (tree_mask if tree_mask.dtype == torch.uint8 else tree_mask.to(torch.uint8)).contiguous()
    bi = (block_indices if block_indices.dtype in (torch.int32, torch.int64) else block_indices.int()).contiguous()
    pos = (positions if positions.dtype in (torch.int32, torch.int64) else positions.int()).contiguous()
    gt = gates.float().contiguous() if gated else lse_a
    oc = o_cmp.float().contiguous() if gated else lse_a
    if block_major and approx:
        raise ValueError("block_major is for exact mode (approximate groups already share one selection)")
    wg = default_window_group(group_size, approx, block_major) if window_group is None else int(window_group)
    if wg and (wg not in (2, 4, 8, 16) or wg <= group_size or approx or block_major):
        raise ValueError(f"window_group must be 2, 4, 8 or 16 and above group_size ({group_size}), in exact mode "
                         f"without block_major; got {wg}")
    kw = key_chunks(tile_rows(group_size * g, max_rows), d, slc_block, gated) if lazy else 1
    if key_split is None:
        key_split = KEY_SPLIT_DEFAULT
    elif key_split and kw == 1:
        raise ValueError(f"key_split needs the lazy softmax and a tile of at most 16 rows whose accumulators fit "
                         f"a warp (rows x head dim x branches <= 4096; here {group_size * g} rows, d = {d}, "
                         f"{1 + gated} branch(es), {slc_block}-key blocks)")
    tune = q.is_cuda and bool(tune)  # the interpreter has nothing to time
    # TMA wants 16-byte aligned bases and row strides
    aligned = all(t.data_ptr() % 16 == 0 and t.stride(0) * t.element_size() % 16 == 0
                  and t.stride(1) * t.element_size() % 16 == 0 for t in (k, v))
    if tma is None:
        tma = q.is_cuda and torch.cuda.get_device_capability(q.device)[0] >= 9 and aligned
    if tma:
        if not aligned:
            raise ValueError("tma=True needs 16-byte aligned k/v bases and row strides")
        from triton.tools.tensor_descriptor import TensorDescriptor
        shape, box = [hkv, prefix_len + n, d], [1, slc_block, d]
        kd = TensorDescriptor(k, shape, [k.stride(0), k.stride(1), 1], box)
        vd = TensorDescriptor(v, shape, [v.stride(0), v.stride(1), 1], box)
    else:
        kd, vd = k, v
    if block_major:
        from ssv.ops.nsa.verify_bm import block_major_partials, block_major_plan
        if bm_plan is None:
            bm_plan = block_major_plan(bi, pos, int(prefix_len), int(window), slc_block, g)
        bm_plan.check(n, hkv, g, nsel, int(prefix_len), int(window), slc_block)
        plse, po = block_major_partials(q, k, v, bm_plan, scale, descs=(kd, vd) if tma else None)
    else:
        plse, po = lse_a, lse_a
    nsp = pow2(nsel, 1)
    # bounds the window tiles of a group (its scratch); a region starting at the step's lowest
    # window (block-major, the window pass) starts up to N positions below the group's
    nwp = -(-(window + slc_block + (n if block_major or wg else 0)) // slc_block)
    ntb = pow2(-(-n // slc_block) + 1)
    n_blocks = -(-prefix_len // slc_block)
    if wg:  # the union below the step's window region, then the window region and the tree
        plan = [(1, group_size, min(group_size * nsel, n_blocks)), (2, wg, window // slc_block + 2)]
    else:
        plan = [(0, group_size, min((1 if approx else group_size) * nsel, n_blocks) + window // slc_block + 2)]
    auto_fold = fold is None and not wg
    fold = (True if fold is None else bool(fold)) and not wg
    sms = sm_count(q.device)
    passes = []  # (part, C, KV splits, grid, items size, constexprs, launch)
    for part, C, work in plan:
        cq = 1 if approx else C
        rows = C * g
        bm = tile_rows(rows, max_rows)
        kw_p = (key_chunks(bm, d, slc_block, gated) if lazy else 1) if key_split else 1
        cfg = launch if launch is not None else dict() if tune else launch_config(bm, d, approx, kw_p)
        consts = dict(G=g, C=C, CQ=cq, CE=cq * nsp, BM=bm, D=d, BS=slc_block, NSEL=nsel, NSELP=nsp,
                      BT=slc_block if tma else pow2(min(n, 64)), NWP=nwp, NTB=ntb, GATED=gated,
                      APPROX=bool(approx), TMA=bool(tma), LAZY=bool(lazy), BMERGE=bool(block_major),
                      NP=pow2(n, 1), KW=kw_p, PART=part)
        programs = triton.cdiv(n, C) * hkv * triton.cdiv(rows, bm)
        variant = (q.device.index, tuple(sorted(consts.items())), tuple(sorted(cfg.items())))

        def n_splits(folded):
            # flash-decoding style: as many KV splits as fill one wave of the programs that fit on
            # an SM at once (read from the compiled kernel: with its ~180 registers the folded
            # merge fits 2 per SM where the combine kernel's variant fits 3; H200, Llama 64K / 64,
            # C = 4: 2 splits 29.0 us, 3 splits 37.8), at least ~2 tiles each
            if n_split is not None:
                return n_split
            fit = 3 if tune or not q.is_cuda else occupancy(variant, consts, cfg, folded or part == 2, q, k, v, kd,
                                                            vd, pos, tm, bi, gt, oc, out, lse_a, n, prefix_len,
                                                            window, scale)
            return max(1, min(16, (fit * sms) // programs, work // 2))
        S = n_splits(fold)
        if auto_fold and S > FOLD_MAX_SPLITS:  # the last split would merge too many: a combine launch
            fold = False
            S = n_splits(False)
        consts["SPLIT"] = S > 1
        consts["FOLD"] = fold and S > 1
        grid = (triton.cdiv(n, C), hkv, triton.cdiv(rows, bm) * S)
        passes.append((part, C, S, grid, 2 * (cq * nsp + nwp) + ntb, consts, cfg))
    n_parts = sum(p[2] for p in passes)
    fold = fold and n_parts > 1
    n_cnt = num_counters(n, hq, hkv, passes[-1][1], max_rows) if fold or wg else 1
    if counters is None:
        counters = torch.zeros(n_cnt, device=q.device, dtype=torch.int32)
    elif counters.dtype != torch.int32 or counters.numel() < n_cnt or counters.device != q.device:
        raise ValueError(f"counters must be {n_cnt}+ int32 zeros on {q.device}, got {counters.numel()} "
                         f"{counters.dtype} on {counters.device}")
    # partial softmax states of the KV splits and passes (two branches per row for gated NSA)
    n_ws = n_parts * n * hq * 2 if n_parts > 1 else 1
    ws_m = torch.empty(n_ws, device=q.device, dtype=torch.float32)
    ws_l = torch.empty_like(ws_m)
    ws_a = torch.empty(n_ws * d if n_parts > 1 else 1, device=q.device, dtype=torch.float32)
    nu = 0
    for part, C, S, grid, per_program, consts, cfg in passes:
        # per program: the (block, query bits) work list; written and read by that program only
        items = torch.empty(grid[0] * grid[1] * grid[2] * per_program, device=q.device, dtype=torch.int32)
        (nsa_verify_fwd_tuned if tune and launch is None else nsa_verify_fwd_kernel)[grid](
            q, k, v, kd, vd, pos, tm, bi, gt, oc, out, lse_a, lse_b, ws_m, ws_l, ws_a, items, plse, po, counters,
            plen, n, int(window), float(scale), S, nu, int(prefix_len).bit_length(),
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), bi.stride(0), bi.stride(1), tm.stride(0), hq,
            **consts, **cfg,
        )
        nu += S
    if n_parts > 1 and not fold and not wg:
        nsa_verify_combine_kernel[(n * hq,)](gt, oc, out, lse_a, lse_b, ws_m, ws_l, ws_a, n, n_parts, hq,
                                             NSP=pow2(n_parts), D=d, GATED=gated, num_warps=1)
    return out, lse_a, lse_b


def check_shapes(n, hq, d, hkv, k, v, prefix_len, slc_block, group_size, block_indices) -> None:
    """Raise a clear error for shapes the kernels do not support."""
    if hq % hkv or not 1 <= hq // hkv <= 16:
        raise ValueError(f"GQA group size must be 1..16 (Hq={hq}, Hkv={hkv})")
    if d not in (16, 32, 64, 128):
        raise ValueError(f"head dim {d} not supported (16, 32, 64, 128)")
    if slc_block < 16 or slc_block & (slc_block - 1):
        raise ValueError(f"selection block {slc_block} must be a power of two >= 16")
    if group_size not in (1, 2, 4, 8, 16):
        raise ValueError(f"group size C must be one of 1, 2, 4, 8, 16, got {group_size}")
    if not 0 <= n <= 128:
        raise ValueError(f"1..128 verification queries are supported, got {n}")
    if k.shape != v.shape or k.shape[0] != hkv or k.shape[2] != d or prefix_len + n > k.shape[1]:
        raise ValueError(f"cache {tuple(k.shape)} does not hold prefix {prefix_len} + {n} tokens")
    if k.stride(2) != 1 or v.stride() != k.stride():
        raise ValueError("k and v must share strides with a contiguous last dimension")
    if block_indices.shape[:2] != (n, hkv):
        raise ValueError(f"block_indices must be [N={n}, Hkv={hkv}, n], got {tuple(block_indices.shape)}")
