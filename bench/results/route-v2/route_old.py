# Frozen copy of ssv/ops/nsa/route.py at b8b58c5 (routing v1), kept only as the A/B baseline of
# scripts/probe_route.py (the device gets the working tree, not the history). Not imported by ssv.
"""NSA routing for a batch of verification queries: compressed attention, importance, top-n.

Three launches, flash-decoding style so that long contexts spread over the whole GPU:
  1. `nsa_route_lse_fwd_kernel`  (query group, KV head, split): partial (max, sum[, o]) of the
     compressed softmax over a range of shared prefix blocks (+ the path-specific blocks in split 0);
  2. `nsa_route_imp_fwd_kernel`  (query group, KV head, split): final log-sum-exp, then each query's
     compressed probabilities summed over its GQA heads, written per compression block;
  3. `nsa_route_topk_fwd_kernel` (query, KV head): importance of every selection block from those
     sums (a compression block i overlaps selection block j iff j*R - A < i < (j+1)*R, R = l'/d,
     A = ceil(l/d)), forced blocks, top-n with ties to the lower index, ascending compaction.
Rows of a program are (query, head) pairs of a group of queries, so every compressed tile is loaded
once for all of them.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ssv.config import NSAConfig
from ssv.ops.utils import pow2, sm_count


@triton.jit
def _cmp_scores(b_q, kc, o_i, m_i, o_d, s_kb):
    p_k = o_i.to(tl.int64)[:, None] * s_kb + o_d[None, :]
    b_k = tl.load(kc + p_k, mask=m_i[:, None], other=0.0)
    return tl.dot(b_q, tl.trans(b_k), input_precision="ieee"), p_k


@triton.jit
def _path_scores(b_q, kp, o_qi, i_h, b, m_r, b_np, o_d, s_pn, s_ph, s_pb):
    # scores of each row's own path-specific block b (a different key per query): [BM]
    m_b = m_r & (b < b_np)
    p_b = o_qi[:, None] * s_pn + i_h * s_ph + b * s_pb + o_d[None, :]
    b_k = tl.load(kp + p_b, mask=m_b[:, None], other=0.0)
    return tl.sum(b_q.to(tl.float32) * b_k.to(tl.float32), 1), m_b, p_b


@triton.jit
def _load_q_rows(q, i_g, i_h, N, scale, s_qn, s_qh, G: tl.constexpr, CR: tl.constexpr, BM: tl.constexpr,
                 D: tl.constexpr):
    # rows are (query, head) pairs of CR queries x the GQA group's G heads; log2(e) and the scale folded in
    o_r = tl.arange(0, BM)
    o_qi = (i_g * CR + o_r // G).to(tl.int64)
    m_r = (o_r < CR * G) & (o_qi < N)
    o_hq = i_h * G + o_r % G
    o_d = tl.arange(0, D)
    b_q = tl.load(q + o_qi[:, None] * s_qn + o_hq[:, None] * s_qh + o_d[None, :], mask=m_r[:, None], other=0.0)
    return (b_q * (scale * 1.4426950408889634)).to(b_q.dtype), o_r, o_qi, m_r, o_hq, o_d


@triton.jit
def _prefix_split(nbpre, BC: tl.constexpr):
    # the committed compressed blocks (read from device memory: the context length is no launch
    # argument, so a captured graph replays at any length) and each KV split's share of them, in
    # whole BC tiles; the grid is sized for the cache's capacity and splits past the end do nothing
    NBPRE = tl.load(nbpre)
    return NBPRE, tl.cdiv(tl.cdiv(tl.maximum(NBPRE, 1), tl.num_programs(2)), BC) * BC


@triton.jit
def nsa_route_lse_fwd_kernel(
    q, kc, vc, kp, vp, npath, nbpre, m_out, l_out, a_out,
    N, NBP, scale,
    s_qn, s_qh, s_kh, s_kb, s_pn, s_ph, s_pb, HQ,
    G: tl.constexpr, CR: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, BC: tl.constexpr,
    WANT_O: tl.constexpr,
):
    i_g, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NBPRE, BPS = _prefix_split(nbpre, BC)
    b_q, o_r, o_qi, m_r, o_hq, o_d = _load_q_rows(q, i_g, i_h, N, scale, s_qn, s_qh, G, CR, BM, D)
    b_m = tl.full([BM], float("-inf"), tl.float32)
    b_l = tl.zeros([BM], tl.float32)
    b_a = tl.zeros([BM, D], tl.float32)
    i_lo = i_s * BPS
    i_hi = tl.minimum(i_lo + BPS, NBPRE)
    for i0 in range(i_lo, i_hi, BC):
        o_i = i0 + tl.arange(0, BC)
        m_i = o_i < i_hi
        b_s, p_k = _cmp_scores(b_q, kc + i_h * s_kh, o_i, m_i, o_d, s_kb)
        b_s = tl.where(m_i[None, :], b_s, float("-inf"))
        b_mn = tl.maximum(b_m, tl.max(b_s, 1))
        b_ms = tl.where(b_mn == float("-inf"), 0.0, b_mn)
        b_p = tl.exp2(b_s - b_ms[:, None])
        b_al = tl.exp2(b_m - b_ms)
        b_l = b_l * b_al + tl.sum(b_p, 1)
        if WANT_O:
            b_v = tl.load(vc + i_h * s_kh + p_k, mask=m_i[:, None], other=0.0)
            b_a = b_a * b_al[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision="ieee")
        b_m = b_mn
    if i_s == 0:
        # path-specific blocks: each query has its own (at most NBP, `npath` of them complete)
        b_np = tl.load(npath + o_qi, mask=m_r, other=0)
        for b in range(0, NBP):
            b_s, m_b, p_b = _path_scores(b_q, kp, o_qi, i_h, b, m_r, b_np, o_d, s_pn, s_ph, s_pb)
            b_s = tl.where(m_b, b_s, float("-inf"))
            b_mn = tl.maximum(b_m, b_s)
            b_ms = tl.where(b_mn == float("-inf"), 0.0, b_mn)
            b_p = tl.exp2(b_s - b_ms)
            b_al = tl.exp2(b_m - b_ms)
            b_l = b_l * b_al + b_p
            if WANT_O:
                b_v = tl.load(vp + p_b, mask=m_b[:, None], other=0.0)
                b_a = b_a * b_al[:, None] + b_p[:, None] * b_v.to(tl.float32)
            b_m = b_mn
    p_part = (i_s * N + o_qi) * HQ + o_hq
    tl.store(m_out + p_part, b_m, mask=m_r)
    tl.store(l_out + p_part, b_l, mask=m_r)
    if WANT_O:
        tl.store(a_out + p_part[:, None] * D + o_d[None, :], b_a, mask=m_r[:, None])


@triton.jit
def nsa_route_imp_fwd_kernel(
    q, kc, kp, npath, nbpre, m_in, l_in, a_in, psum, o_cmp, lse,
    N, NBP, scale,
    s_qn, s_qh, s_kh, s_kb, s_pn, s_ph, s_pb, HQ, s_sn, s_sh,
    G: tl.constexpr, CR: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, BC: tl.constexpr,
    WANT_O: tl.constexpr, CRP: tl.constexpr,
):
    i_g, i_h, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NSPLIT = tl.num_programs(2)
    NBPRE, BPS = _prefix_split(nbpre, BC)
    b_q, o_r, o_qi, m_r, o_hq, o_d = _load_q_rows(q, i_g, i_h, N, scale, s_qn, s_qh, G, CR, BM, D)
    o_c = o_r // G
    # merge the splits' partial softmax states into the final (base-2) log-sum-exp
    b_m = tl.full([BM], float("-inf"), tl.float32)
    for s in range(0, NSPLIT):
        b_m = tl.maximum(b_m, tl.load(m_in + (s * N + o_qi) * HQ + o_hq, mask=m_r, other=float("-inf")))
    b_ms = tl.where(b_m == float("-inf"), 0.0, b_m)
    b_l = tl.zeros([BM], tl.float32)
    b_a = tl.zeros([BM, D], tl.float32)
    for s in range(0, NSPLIT):
        p_part = (s * N + o_qi) * HQ + o_hq
        b_w = tl.exp2(tl.load(m_in + p_part, mask=m_r, other=float("-inf")) - b_ms)
        b_l += b_w * tl.load(l_in + p_part, mask=m_r, other=0.0)
        if WANT_O:
            if i_s == 0:
                b_a += b_w[:, None] * tl.load(a_in + p_part[:, None] * D + o_d[None, :], mask=m_r[:, None], other=0.0)
    b_lse2 = tl.where(b_l > 0, b_ms + tl.log2(tl.where(b_l > 0, b_l, 1.0)), float("-inf"))
    b_lsafe = tl.where(b_l > 0, b_lse2, 0.0)
    if i_s == 0:
        tl.store(lse + o_qi * HQ + o_hq, b_lse2 * 0.6931471805599453, mask=m_r)
        if WANT_O:
            b_o = b_a / tl.where(b_l > 0, b_l, 1.0)[:, None]
            tl.store(o_cmp + (o_qi * HQ + o_hq)[:, None] * D + o_d[None, :], b_o, mask=m_r[:, None])
    o_cc = tl.arange(0, CRP)
    o_qc64 = (i_g * CR + o_cc).to(tl.int64)
    m_c = (o_cc < CR) & (o_qc64 < N)
    b_sel = ((o_c[None, :] == o_cc[:, None]) & m_r[None, :]).to(tl.float32)   # [CRP, BM]
    i_lo = i_s * BPS
    i_hi = tl.minimum(i_lo + BPS, NBPRE)
    for i0 in range(i_lo, i_hi, BC):
        o_i = i0 + tl.arange(0, BC)
        m_i = o_i < i_hi
        b_s, p_k = _cmp_scores(b_q, kc + i_h * s_kh, o_i, m_i, o_d, s_kb)
        b_p = tl.where(m_i[None, :] & m_r[:, None], tl.exp2(b_s - b_lsafe[:, None]), 0.0)
        # sum each query's G rows with one product by the row -> query selector [CRP, BM]
        b_ps = tl.dot(b_sel, b_p, input_precision="ieee")
        tl.store(psum + o_qc64[:, None] * s_sn + i_h * s_sh + o_i[None, :], b_ps, mask=m_c[:, None] & m_i[None, :])
    if i_s == 0:
        b_np = tl.load(npath + o_qi, mask=m_r, other=0)
        for b in range(0, NBP):
            b_s, m_b, _ = _path_scores(b_q, kp, o_qi, i_h, b, m_r, b_np, o_d, s_pn, s_ph, s_pb)
            b_p = tl.where(m_b, tl.exp2(b_s - b_lsafe), 0.0)
            b_ps = tl.sum(tl.where(b_sel > 0, b_p[None, :], 0.0), 1)
            tl.store(psum + o_qc64 * s_sn + i_h * s_sh + NBPRE + b, b_ps, mask=m_c)


@triton.jit
def nsa_route_topk_fwd_kernel(
    psum, npath, nbpre, pos, imp, idx,
    NBS, s_sn, s_sh, s_in, s_ih, s_xn, s_xh,
    LS: tl.constexpr, R: tl.constexpr, A: tl.constexpr, BJ: tl.constexpr, NSEL: tl.constexpr,
    NSELP: tl.constexpr, FORCED_FIRST: tl.constexpr, FORCED_LOCAL: tl.constexpr,
):
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    i_n64 = i_n.to(tl.int64)
    t = tl.load(pos + i_n)
    nbc = tl.load(nbpre) + tl.load(npath + i_n)
    o_j = tl.arange(0, BJ)
    b_imp = tl.zeros([BJ], tl.float32)
    for u in tl.static_range(R + A - 1):
        o_i = o_j * R - A + 1 + u
        m_i = (o_i >= 0) & (o_i < nbc) & (o_j < NBS)
        b_imp += tl.load(psum + i_n64 * s_sn + i_h * s_sh + o_i, mask=m_i, other=0.0)
    cand = (o_j * LS <= t) & (o_j < NBS)
    b_imp = tl.where(cand, b_imp, float("-inf"))
    tl.store(imp + i_n64 * s_in + i_h * s_ih + o_j, b_imp, mask=o_j < NBS)
    cur = t // LS
    forced = (o_j > cur - FORCED_LOCAL) & (o_j <= cur)
    if FORCED_FIRST:
        forced = forced | (o_j == 0)
    b_key = tl.where(cand & forced, float("inf"), b_imp)
    # one top-k over packed keys instead of NSEL (max, min-index) reduction pairs: the score's
    # bits made order-preserving as int32 (negatives flipped) above BJ - 1 - j, so equal scores
    # rank the lower block first
    b_bits = b_key.to(tl.int32, bitcast=True)
    b_ord = b_bits ^ ((b_bits >> 31) & 0x7FFFFFFF)
    b_pk = (b_ord.to(tl.int64) << 32) | (BJ - 1 - o_j).to(tl.int64)
    b_top = tl.topk(b_pk, NSELP)                                                    # [NSELP]
    o_k = tl.arange(0, NSELP)
    top_j = tl.where(o_k < NSEL, BJ - 1 - (b_top & 0xFFFFFFFF).to(tl.int32), -1)
    sel = (tl.sum((o_j[:, None] == top_j[None, :]).to(tl.int32), 1) > 0) & (b_key > float("-inf"))
    rank = tl.cumsum(sel.to(tl.int32), 0) - 1
    tl.store(idx + i_n64 * s_xn + i_h * s_xh + rank, o_j, mask=sel)
    cnt = tl.sum(sel.to(tl.int32), 0)
    tl.store(idx + i_n64 * s_xn + i_h * s_xh + o_k, tl.full([NSELP], -1, tl.int32), mask=(o_k >= cnt) & (o_k < NSEL))



def nsa_route(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, n_prefix_blocks,
              k_path: torch.Tensor, v_path: torch.Tensor, n_path: torch.Tensor, positions: torch.Tensor,
              cfg: NSAConfig, want_o: bool = False, scale: Optional[float] = None, max_rows: int = 64,
              n_split: Optional[int] = None, max_pos: Optional[int] = None):
    """Routing of N queries. k_cmp/v_cmp [Hkv, >=NBpre, D] shared prefix blocks; k_path/v_path
    [N, Hkv, NBP, D] path-specific blocks (n_path[q] of them complete for query q).

    n_prefix_blocks: an int, or an int32 [1] device tensor (a graph replays at any length; the
    launch is then sized for all of k_cmp's blocks). max_pos: a bound on the largest position
    (given, no device sync happens: CUDA-graph capturable; a larger bound selects the same blocks).
    Returns (block_indices [N, Hkv, n] int32, importance [N, Hkv, NBs], lse_cmp [N, Hq], o_cmp [N, Hq, D] or None).
    """
    q = q.contiguous()
    n, hq, d = q.shape
    hkv = k_cmp.shape[0]
    g = hq // hkv
    dev = q.device
    scale = d ** -0.5 if scale is None else scale
    nbp = k_path.shape[2]
    if isinstance(n_prefix_blocks, torch.Tensor):
        nbpre_t, nbpre = n_prefix_blocks, k_cmp.shape[1]   # sized for the capacity, read in the kernels
    else:
        nbpre = int(n_prefix_blocks)
        nbpre_t = torch.full((1,), nbpre, device=dev, dtype=torch.int32)
    max_pos = int(positions.max()) if max_pos is None else int(max_pos)  # pass it to stay sync-free
    nbs = max_pos // cfg.slc_block + 1
    if nbs > 8192:
        raise ValueError(f"{nbs} selection blocks exceed the routing kernel's limit of 8192")
    cr = max(1, min(n, max_rows // g)) if g <= max_rows else 1
    bm = pow2(cr * g)
    ngr = triton.cdiv(n, cr)
    bc = 64
    if n_split is None:
        sms = sm_count(dev)
        n_split = max(1, min(triton.cdiv(max(nbpre, 1), bc), (2 * sms) // max(1, ngr * hkv)))
    n_split = max(1, min(n_split, triton.cdiv(max(nbpre, 1), bc)))
    f32 = dict(device=dev, dtype=torch.float32)
    m_part = torch.empty(n_split, n, hq, **f32)
    l_part = torch.empty(n_split, n, hq, **f32)
    a_part = torch.empty(n_split, n, hq, d, **f32) if want_o else m_part
    npath = n_path.to(dev, torch.int32).contiguous()   # no copy when already so
    pos = positions if positions.dtype in (torch.int32, torch.int64) else positions.to(torch.int32)
    pos = pos.to(dev).contiguous()   # no copy when the plan already holds it on the device
    kp, vp = k_path.contiguous(), v_path.contiguous()
    common = dict(G=g, CR=cr, BM=bm, D=d, BC=bc, WANT_O=want_o, num_warps=4)
    nsa_route_lse_fwd_kernel[(ngr, hkv, n_split)](
        q, k_cmp, v_cmp, kp, vp, npath, nbpre_t, m_part, l_part, a_part, n, nbp, float(scale),
        q.stride(0), q.stride(1), k_cmp.stride(0), k_cmp.stride(1), kp.stride(0), kp.stride(1), kp.stride(2),
        hq, **common)
    psum = torch.empty(n, hkv, nbpre + nbp, **f32)   # the splits tile [0, NBpre); the rest is never read
    lse = torch.empty(n, hq, **f32)
    o_cmp = torch.empty(n, hq, d, **f32) if want_o else lse
    nsa_route_imp_fwd_kernel[(ngr, hkv, n_split)](
        q, k_cmp, kp, npath, nbpre_t, m_part, l_part, a_part, psum, o_cmp, lse, n, nbp,
        float(scale), q.stride(0), q.stride(1), k_cmp.stride(0), k_cmp.stride(1), kp.stride(0),
        kp.stride(1), kp.stride(2), hq, psum.stride(0), psum.stride(1), CRP=pow2(cr), **common)
    imp = torch.empty(n, hkv, nbs, **f32)
    idx = torch.empty(n, hkv, cfg.n_select, device=dev, dtype=torch.int32)
    nsa_route_topk_fwd_kernel[(n, hkv)](
        psum, npath, nbpre_t, pos, imp, idx, nbs,
        psum.stride(0), psum.stride(1), imp.stride(0), imp.stride(1), idx.stride(0), idx.stride(1),
        LS=cfg.slc_block, R=cfg.slc_block // cfg.cmp_stride, A=-(-cfg.cmp_block // cfg.cmp_stride),
        BJ=pow2(max(nbs, cfg.n_select)), NSEL=cfg.n_select, NSELP=pow2(cfg.n_select, 1), FORCED_FIRST=cfg.forced_first,
        FORCED_LOCAL=cfg.forced_local, num_warps=4)
    return idx, imp, lse, (o_cmp if want_o else None)


def path_block_weights(prefix_len: int, positions: torch.Tensor, tree_mask: torch.Tensor, cfg: NSAConfig):
    """Per step (shared by all layers): how each query's path-specific compression blocks average the cache.

    Returns (w [N, NBP, S] with S = slots [s0, P+N), s0, n_path [N]); a block's key is w @ k[:, s0:].
    """
    from ssv.ops.nsa.naive import num_cmp_blocks
    P, n = int(prefix_len), positions.numel()
    dev = positions.device
    nb_pre = num_cmp_blocks(P, cfg)
    nb_all = num_cmp_blocks(int(positions.max()) + 1, cfg)
    s0 = nb_pre * cfg.cmp_stride
    pos_slot = torch.cat([torch.arange(s0, P, device=dev), positions.long()])
    vis = torch.cat([torch.ones(n, P - s0, dtype=torch.bool, device=dev), tree_mask.bool()], 1)
    start = torch.arange(nb_pre, nb_all, device=dev) * cfg.cmp_stride
    memb = (pos_slot[None] >= start[:, None]) & (pos_slot[None] < start[:, None] + cfg.cmp_block)
    w = (vis[:, None, :] & memb[None]).float() / cfg.cmp_block
    n_path = torch.tensor([num_cmp_blocks(int(p) + 1, cfg) - nb_pre for p in positions.tolist()],
                          device=dev, dtype=torch.int32)
    return w, s0, n_path


def path_block_weights_device(plen: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor,
                              cfg: NSAConfig):
    """`path_block_weights` with the prefix length read from a device tensor and fixed shapes (no
    host sync, so a captured graph replays at any length): w [N, N // d + 1, l + N] over the slots
    [s0, s0 + l + N) (zero past the step's last slot), s0 [1] int32, n_path [N] int32.

    The step's slots past P - s0 < l committed ones are its N new tokens; a block of path b starts
    at s0 + b * d and is complete within P + N only for b <= N // d.
    """
    l, st = cfg.cmp_block, cfg.cmp_stride
    n = positions.numel()
    dev = positions.device
    P = plen.reshape(()).long()
    nb_pre = torch.where(P >= l, (P - l) // st + 1, torch.zeros_like(P))
    s0 = nb_pre * st
    j = torch.arange(l + n, device=dev)
    slot = s0 + j
    node = (slot - P).clamp(0, n - 1)
    new = (slot >= P) & (slot < P + n)
    pos_slot = torch.where(new, positions.long()[node], slot)                        # [S]
    vis = torch.where(new[None], tree_mask.bool()[:, node], (slot < P)[None])        # [N, S]
    start = s0 + torch.arange(n // st + 1, device=dev) * st                          # [NBP]
    memb = (pos_slot[None] >= start[:, None]) & (pos_slot[None] < start[:, None] + l)
    w = (vis[:, None, :] & memb[None]).float() / l
    pos1 = positions.long() + 1
    n_path = torch.where(pos1 >= l, (pos1 - l) // st + 1, torch.zeros_like(pos1)) - nb_pre
    return w, s0.to(torch.int32).reshape(1), n_path.clamp_min(0).to(torch.int32)


@triton.jit
def nsa_path_blocks_fwd_kernel(
    w, k, v, kp, vp, s0p, S, NBP, L, s_wn, s_wb, s_kh, s_kt, s_pn, s_ph, s_pb,
    BSB: tl.constexpr, D: tl.constexpr, NBPP: tl.constexpr,
):
    # one program per (query, KV head): its path-specific compressed keys/values, w[n, :] @ k[h, s0:],
    # every path block of a slot tile at once (one [NBPP, BSB] @ [BSB, D] product per tile: each
    # K/V tile is loaded once, not once per block: 2 tiles instead of 12 dependent loads at N = 48);
    # s0 is read from device memory (it moves with the context length), slots stop at the cache's end L
    i_n, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    S0 = tl.load(s0p)
    o_d = tl.arange(0, D)
    o_b = tl.arange(0, NBPP)
    b_ak = tl.zeros([NBPP, D], tl.float32)
    b_av = tl.zeros([NBPP, D], tl.float32)
    for s0 in range(0, S, BSB):
        o_s = s0 + tl.arange(0, BSB)
        m_s = (o_s < S) & (S0 + o_s < L)
        p_t = (S0 + o_s).to(tl.int64)[:, None] * s_kt + o_d[None, :]
        p_w = w + i_n * s_wn + o_b[:, None] * s_wb + o_s[None, :]
        b_w = tl.load(p_w, mask=(o_b < NBP)[:, None] & m_s[None, :], other=0.0)                # [NBPP, BSB]
        b_k = tl.load(k + i_h * s_kh + p_t, mask=m_s[:, None], other=0.0).to(tl.float32)   # [BSB, D]
        b_v = tl.load(v + i_h * s_kh + p_t, mask=m_s[:, None], other=0.0).to(tl.float32)
        # the weights are 0 or 1/l: exact products, fp32 sums
        b_ak += tl.dot(b_w, b_k, input_precision="ieee")
        b_av += tl.dot(b_w, b_v, input_precision="ieee")
    o_o = i_n * s_pn + i_h * s_ph + o_b[:, None] * s_pb + o_d[None, :]
    m_o = (o_b < NBP)[:, None]
    tl.store(kp + o_o, b_ak, mask=m_o)
    tl.store(vp + o_o, b_av, mask=m_o)


def path_blocks_torch(w: torch.Tensor, s0: int, k: torch.Tensor, v: torch.Tensor, prefix_len: int, n: int):
    """The same product in plain PyTorch (the CPU path and the kernel's reference)."""
    kt, vt = k[:, s0:prefix_len + n].float(), v[:, s0:prefix_len + n].float()
    kp = torch.einsum("nbs,hsd->nhbd", w, kt)
    vp = torch.einsum("nbs,hsd->nhbd", w, vt)
    if kp.shape[2] == 0:
        kp = kp.new_zeros(kp.shape[0], kp.shape[1], 1, kp.shape[3])
        vp = torch.zeros_like(kp)
    return kp, vp


def path_blocks(w: torch.Tensor, s0, k: torch.Tensor, v: torch.Tensor, prefix_len, n: int,
                kernel: Optional[bool] = None, out: Optional[tuple] = None):
    """k, v [Hkv, L, D] -> k_path, v_path [N, Hkv, NBP, D] fp32 (NBP >= 1 so the kernels get a real pointer).

    kernel (default: on CUDA): one launch instead of slicing, casting and two einsums per layer.
    s0 / prefix_len: ints, or (kernel only) device tensors as `path_block_weights_device` returns
    them, w then covering a fixed number of slots from s0 (zero weight past the step).
    """
    kernel = k.is_cuda if kernel is None else kernel
    if not kernel:
        return path_blocks_torch(w, int(s0), k, v, int(prefix_len), n)
    nq, nbp, S = w.shape
    hkv, _, d = k.shape
    if isinstance(s0, torch.Tensor):
        s0_t = s0
    else:
        if S != prefix_len + n - s0:
            raise ValueError(f"path weights cover {S} slots, the step has {prefix_len + n - s0} from slot {s0}")
        s0_t = torch.full((1,), int(s0), device=k.device, dtype=torch.int32)
    if k.stride(2) != 1 or v.stride() != k.stride():
        raise ValueError("k and v must share strides with a contiguous last dimension")
    if out is None:  # every entry is written when there are path blocks; else one zero block (never read)
        new = torch.empty if nbp else torch.zeros
        out = tuple(new(nq, hkv, max(nbp, 1), d, device=k.device, dtype=torch.float32) for _ in range(2))
    kp, vp = out
    if kp.shape != (nq, hkv, max(nbp, 1), d) or vp.stride() != kp.stride() or kp.dtype != torch.float32:
        raise ValueError(f"path-block outputs must be two fp32 [{nq}, {hkv}, {max(nbp, 1)}, {d}] with equal strides")
    if nq and nbp:
        wc = w.contiguous()
        nsa_path_blocks_fwd_kernel[(nq, hkv)](
            wc, k, v, kp, vp, s0_t, S, nbp, k.shape[1], wc.stride(0), wc.stride(1), k.stride(0), k.stride(1),
            kp.stride(0), kp.stride(1), kp.stride(2), BSB=64, D=d, NBPP=pow2(nbp), num_warps=4)
    return kp, vp
