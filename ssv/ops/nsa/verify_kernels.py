"""Kernels of the grouped NSA verification (the SSV kernel): selected + window + tree branches in one
launch (`nsa_verify_fwd_kernel`), and the merge of its KV splits' partial states when the launch does
not fold it (`nsa_verify_combine_kernel`). The launcher is `verify.py`, its launch policy
`verify_policy.py`; the math is in README.md.

One program per (group of C consecutive queries, KV head, row split x KV split). Its rows are the
group's queries times the GQA group's query heads, so every K/V tile it loads serves all of them:
  A. selected blocks below the group's window region, walked as the union of the group's
     selections, built inside the kernel (each block loaded once; a row only attends to its own
     query's blocks);
  B. the window region [lo, P), in selection-block-aligned tiles, shared by the whole group;
  C. the new (tree) tokens [P, P+N), visible through each query's ancestor mask.
C = 1 is the naive per-query decode-style kernel used as the baseline. Approximate mode gives every
query its group representative's (first query's) selection.
"""
import triton
import triton.language as tl

from ssv.ops.pdl import l2_prefetch_tail, pdl_prologue
from ssv.ops.softmax import online_softmax as _online


@triton.jit
def _item(it, p_it, o_qb, o_t0, o_d, b_q, b_pos, kbase, vbase, k_desc, v_desc, i_h, P, W, s_kt,
          BS: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    # work item `it`: its tile's scores [BM, BS] and values [BS, D], which scores each row may use
    # in the selected branch (its query selected the block) and in the window branch, its block and
    # the bits of the group's queries that selected it
    j = tl.load(p_it + 2 * it)
    bits = tl.load(p_it + 2 * it + 1)
    member = (((bits >> o_qb) & 1) != 0)[:, None]
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
    return b_s, b_v, member & m_t[None, :], in_win & m_t[None, :], j, bits


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
def _or(a, b):
    return a | b


@triton.jit
def _entry_ptrs(blk, q0, N, i_h, s_bn, s_bh, o_e, NSEL: tl.constexpr, NSELP: tl.constexpr):
    # flat entry o_e of queries q0.. at KV head i_h: (its query within the range, its address, real)
    o_eq = o_e // NSELP
    o_es = o_e % NSELP
    return o_eq, blk + (q0 + o_eq).to(tl.int64) * s_bn + i_h * s_bh + o_es, (o_es < NSEL) & (q0 + o_eq < N)


@triton.jit
def _entries(blk, q0, N, i_h, s_bn, s_bh, NQ: tl.constexpr, NSEL: tl.constexpr, NSELP: tl.constexpr):
    # the selections of queries q0 .. q0+NQ-1 at KV head i_h, flat [NQ * NSELP]: (query within the
    # range, block as int32, -1 padded; mask of real entries)
    o_eq, p_e, m_e = _entry_ptrs(blk, q0, N, i_h, s_bn, s_bh, tl.arange(0, NQ * NSELP), NSEL, NSELP)
    b_e = tl.load(p_e, mask=m_e, other=-1).to(tl.int32)
    return o_eq, b_e, b_e >= 0


@triton.jit
def _holders(blk, b_e, q0, N, i_h, s_bn, s_bh, NQ: tl.constexpr, NSEL: tl.constexpr, NSELP: tl.constexpr):
    # for each entry of b_e [NQ * NSELP] (as `_entries` loads them): which of the NQ queries hold its
    # block (bit c: query c), and whether an earlier entry holds it. The pairs against up to 64 entries
    # at a time, each pair's bits packed (query bit, 1 << 30 if the other entry is earlier) and
    # OR-reduced once: one reduction where a reduction per query and a compare with the previous slot
    # took ~1/4 of the launch's instructions before its first tile
    CE: tl.constexpr = NQ * NSELP
    FC: tl.constexpr = CE if CE < 64 else 64
    o_e = tl.arange(0, CE)
    b_acc = tl.zeros([CE], tl.int32)
    for f0 in tl.static_range(0, CE, FC):
        o_f = f0 + tl.arange(0, FC)
        o_fq, p_f, m_f = _entry_ptrs(blk, q0, N, i_h, s_bn, s_bh, o_f, NSEL, NSELP)
        b_f = tl.load(p_f, mask=m_f, other=-1).to(tl.int32)
        b_x = (1 << o_fq)[None, :] | tl.where(o_f[None, :] < o_e[:, None], 1 << 30, 0)          # [CE, FC]
        b_x = tl.where((b_e[:, None] == b_f[None, :]) & (b_f >= 0)[None, :], b_x, 0)
        b_acc = b_acc | tl.reduce(b_x, 1, _or)
    return b_acc & ((1 << NQ) - 1), (b_acc >> 30) != 0


@triton.jit
def _item_range(n_it, n_tree, i_k, NSPLIT, TREE_COST: tl.constexpr):
    # KV split i_k's run [lo, hi) of the n_it work items. Split 0 also takes the n_tree tiles of the
    # new tokens, each worth TREE_COST items (the ancestor mask and an online softmax with its
    # cross-warp reductions, against a lazy item's one accumulation), so it takes that many items
    # fewer and the others share the rest evenly: the launch ends with its slowest split, which split
    # 0 was when it took the tree beside an even share
    a0 = tl.minimum(tl.maximum(tl.cdiv(n_it + TREE_COST * n_tree, NSPLIT) - TREE_COST * n_tree, 0), n_it)
    rest, others = n_it - a0, tl.maximum(NSPLIT - 1, 1)
    lo = tl.where(i_k == 0, 0, a0 + (i_k - 1) * rest // others)
    hi = tl.where(i_k == 0, a0, a0 + i_k * rest // others)
    return lo, hi


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


@triton.jit
def nsa_verify_fwd_kernel(
    q, k, v, k_desc, v_desc, pos, tmask, blk, gates, o_cmp, o, lse_a, lse_b, ws_m, ws_l, ws_a, items, cnt,
    plen, N, W, scale, NSPLIT,
    s_qn, s_qh, s_kh, s_kt, s_bn, s_bh, s_tn, HQ,
    G: tl.constexpr, C: tl.constexpr, CQ: tl.constexpr, CE: tl.constexpr, BM: tl.constexpr, D: tl.constexpr,
    BS: tl.constexpr, NSEL: tl.constexpr, NSELP: tl.constexpr, BT: tl.constexpr, NWP: tl.constexpr, NTB: tl.constexpr,
    GATED: tl.constexpr, APPROX: tl.constexpr, SPLIT: tl.constexpr, TMA: tl.constexpr, LAZY: tl.constexpr,
    FOLD: tl.constexpr, TREE_COST: tl.constexpr,
    PDL: tl.constexpr = False,
):
    i_g, i_h, i_z = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    # under PDL, while the previous kernel (the routing) runs: the window's keys and values before
    # the prefix length, which every group of this head reads, into L2, shared out over its programs.
    # At most its last 1,024 rows: the dense plan's window is the whole cache (with all of it
    # prefetched, the dense verify pass ran 3% slower at 8K on an H100, bench/results/gpu-s44/; with
    # the cap, 1.140 -> 1.110 ms on an H200, bench/results/gpu-s45/e2e8k-*)
    i_part, n_part = i_g * tl.num_programs(2) + i_z, tl.num_programs(0) * tl.num_programs(2)
    l2_prefetch_tail(k + i_h * s_kh, plen, tl.minimum(W, 1024), s_kt, i_part, n_part, D, PDL)
    l2_prefetch_tail(v + i_h * s_kh, plen, tl.minimum(W, 1024), s_kt, i_part, n_part, D, PDL)
    pdl_prologue(PDL)
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

    b_m1, b_l1, b_a1, b_m2, b_l2, b_a2 = _empty_states(BM, D)

    # Work items: the group's union blocks below the window region, then the window region's
    # block-aligned tiles up to P; each KV split takes a run of them (`_item_range`).
    minpos = tl.min(tl.where(m_r, b_pos, 1 << 30))
    lo = tl.maximum(minpos - W + 1, 0)
    lim = lo // BS
    # The union is built here, not on the host: the group's CQ*NSELP entries [CE], one kept per
    # block (its first entry), ranked by a prefix sum; no sort and no extra launch.
    o_eq, b_e, m_e = _entries(blk, i_g * C, N, i_h, s_bn, s_bh, CQ, NSEL, NSELP)
    # b_bits: which of the group's queries selected each entry's block (bit c: query c of the group);
    # b_dup: an earlier entry holds the same block. One OR-reduction over the pairs gives both
    b_bits, b_dup = _holders(blk, b_e, i_g * C, N, i_h, s_bn, s_bh, CQ, NSEL, NSELP)
    m_one = m_e & ~b_dup
    m_first = m_one & (b_e < lim)
    b_rank = tl.cumsum(m_first.to(tl.int32), 0) - 1
    n_a = tl.sum(m_first.to(tl.int32))
    n_w = tl.maximum(tl.cdiv(P - lim * BS, BS), 0)
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
    # then the window region's tiles lim + w with no bits, and no bits for the blocks the step's new
    # tokens fall in (P // BS + u); after a barrier, the bits of those holding a selected block are
    # written over them (a tile may hold a query's selected block partly outside that query's window)
    for w0 in range(0, n_w, 64):
        o_w = w0 + tl.arange(0, 64)
        m_w = o_w < n_w
        tl.store(p_it + 2 * (n_a + o_w), lim + o_w, mask=m_w)
        tl.store(p_it + 2 * (n_a + o_w) + 1, tl.zeros([64], tl.int32), mask=m_w)
    o_u = tl.arange(0, NTB)
    p_tb = p_it + 2 * (CE + NWP)
    tl.store(p_tb + o_u, tl.zeros([NTB], tl.int32))
    tl.debug_barrier()
    m_wb = m_one & (b_e >= lim) & (b_e < lim + n_w)
    tl.store(p_it + 2 * (n_a + b_e - lim) + 1, b_bits, mask=m_wb)
    m_tree = m_one & (b_e >= P // BS) & (b_e < P // BS + NTB)
    tl.store(p_tb + b_e - P // BS, b_bits, mask=m_tree)
    tl.debug_barrier()
    it_lo, it_hi = _item_range(n_a + n_w, tl.cdiv(N, BT), i_k, NSPLIT, TREE_COST)
    n_redo = 1
    if LAZY:
        # Softmax against a fixed reference instead of a running max: each row's score on its own
        # new token (every query sees itself), so no row max and no row sum cross the warps per
        # iteration; p is summed elementwise and reduced once. Exact unless exp2 over/underflows,
        # which the sums show: then the program redoes the prefix with the online softmax.
        p_self = (P + o_qi64)[:, None] * s_kt + o_d[None, :]
        b_ref = tl.sum(b_q.to(tl.float32) * tl.load(kbase + p_self, mask=m_r[:, None], other=0.0).to(tl.float32), 1)
        b_lp1 = tl.zeros([BM, BS], tl.float32)
        b_lp2 = tl.zeros([BM, BS], tl.float32)
        # what this split's items hold for a row: the selecting queries' bits, the last block (the
        # window tiles follow the union's, and every union block lies below lim)
        b_or = tl.zeros([], tl.int32)
        j_top = tl.zeros([], tl.int32) - 1
        for it in range(it_lo, it_hi):
            b_s, b_v, m_sel, m_win, j, bits = _item(it, p_it, o_qb, o_t0, o_d, b_q, b_pos, kbase, vbase, k_desc,
                                                    v_desc, i_h, P, W, s_kt, BS, D, TMA)
            b_or = b_or | bits
            j_top = tl.maximum(j_top, j)
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
        # a sum in [2^-64, 2^100], or 0 for a branch with nothing visible among this split's items: a
        # row selected none of their blocks, and its window starts past their last token (a split
        # may hold a few of the group's items, none of them some row's: no underflow, no redo)
        sel_vis = ((b_or >> o_qb) & 1) != 0
        win_vis = (W > 0) & (j_top >= lim) & (tl.minimum((j_top + 1) * BS, P) - 1 > b_pos - W)
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
        for it in range(it_lo, it_hi):
            b_s, b_v, m_sel, m_win, j, bits = _item(it, p_it, o_qb, o_t0, o_d, b_q, b_pos, kbase, vbase, k_desc,
                                                    v_desc, i_h, P, W, s_kt, BS, D, TMA)
            if GATED:
                b_m1, b_l1, b_a1 = _online(b_s, m_sel, b_v, b_m1, b_l1, b_a1)
                b_m2, b_l2, b_a2 = _online(b_s, m_win, b_v, b_m2, b_l2, b_a2)
            else:
                b_m1, b_l1, b_a1 = _online(b_s, m_sel | m_win, b_v, b_m1, b_l1, b_a1)

    # the step's new tokens, seen only along each query's own path (KV split 0)
    if i_k == 0:
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
    if SPLIT:
        # partial softmax states, merged by nsa_verify_combine_kernel or a folded merge
        p_w = (i_k * N * HQ + p_l) * 2
        tl.store(ws_m + p_w, b_m1, mask=m_r)
        tl.store(ws_l + p_w, b_l1, mask=m_r)
        tl.store(ws_a + p_w[:, None] * D + o_d[None, :], b_a1, mask=m_r[:, None])
        if GATED:
            tl.store(ws_m + p_w + 1, b_m2, mask=m_r)
            tl.store(ws_l + p_w + 1, b_l2, mask=m_r)
            tl.store(ws_a + (p_w + 1)[:, None] * D + o_d[None, :], b_a2, mask=m_r[:, None])
        if FOLD:
            # The last of the (group, head, row split)'s KV splits to finish merges them all, so
            # no second launch: the barrier puts every thread's partial stores before the counter's
            # release, the acquire puts the others' before the loads (.cg: past this SM's L1), and
            # the last program leaves the counter at zero for the next launch.
            tl.debug_barrier()
            p_c = cnt + (i_g * tl.num_programs(1) + i_h) * (tl.num_programs(2) // NSPLIT) + i_s
            if tl.atomic_add(p_c, 1, sem="acq_rel", scope="gpu") == NSPLIT - 1:
                tl.store(p_c, 0)
                p_w0 = p_l * 2
                b_m1, b_l1, b_a1 = _gather(ws_m, ws_l, ws_a, p_w0, m_r, o_d, N * HQ * 2, NSPLIT, BM, D)
                if GATED:
                    b_m2, b_l2, b_a2 = _gather(ws_m, ws_l, ws_a, p_w0 + 1, m_r, o_d, N * HQ * 2, NSPLIT, BM, D)
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


@triton.jit
def nsa_verify_combine_kernel(
    gates, o_cmp, o, lse_a, lse_b, ws_m, ws_l, ws_a, N, NSPLIT, HQ,
    NSP: tl.constexpr, D: tl.constexpr, GATED: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # one program per (query, head): all KV splits' (max, sum, acc) in one load each, merged, gated
    pdl_prologue(PDL)
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
