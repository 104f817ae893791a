import triton
import triton.language as tl

from ssv.ops.pdl import pdl_prologue


@triton.jit
def tree_level_fwd_kernel(vals, toks, root, front, rows_in, tok, par, score, front_out, ftok_out, fpar_out,
                          rows_out, t, base, s_v,
                          R: tl.constexpr, K: tl.constexpr, D: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
                          FIRST: tl.constexpr, PDL: tl.constexpr = False):
    # one program, the level's R*K candidates c = r*K + i (frontier node r's i-th best child) in
    # registers: the pool writes, each candidate's rank by cumulative score (the count of candidates
    # ordered before it: larger, or equal at a lower index; NaN first, as rank_topk), and the K of
    # rank < K stored at their rank as the next frontier
    pdl_prologue(PDL)
    o_c = tl.arange(0, BN)
    m_c = o_c < R * K
    o_r = o_c // K
    b_v = tl.load(vals + o_r * s_v + o_c % K, mask=m_c, other=0.0).to(tl.float64)     # [BN]
    b_t = tl.load(toks + o_r * s_v + o_c % K, mask=m_c, other=0)
    if FIRST:
        b_pid = tl.zeros([BN], dtype=tl.int64)
        b_ps = tl.zeros([BN], dtype=tl.float64)
        m_0 = o_c == 0
        tl.store(tok + o_c, tl.load(root + o_c * 0, mask=m_0, other=0), mask=m_0)
        tl.store(par + o_c, tl.full([BN], -1, dtype=tl.int64), mask=m_0)
        tl.store(score + o_c, b_ps, mask=m_0)
    else:
        b_pid = tl.load(front + o_r, mask=m_c, other=0).to(tl.int64)
        b_ps = tl.load(score + b_pid, mask=m_c, other=0.0)
    b_cs = b_ps + b_v
    p_pool = base + o_c.to(tl.int64)
    tl.store(tok + p_pool, b_t, mask=m_c)
    tl.store(par + p_pool, b_pid, mask=m_c)
    tl.store(score + p_pool, b_cs, mask=m_c)
    n_i = b_cs != b_cs
    b_gt = (b_cs[None, :] > b_cs[:, None]) | (n_i[None, :] & (n_i == 0)[:, None])                   # [BN, BN]
    b_eq = (b_cs[None, :] == b_cs[:, None]) | (n_i[None, :] & n_i[:, None])
    b_before = (b_gt | (b_eq & (o_c[None, :] < o_c[:, None]))) & m_c[None, :]
    b_rank = tl.sum(b_before.to(tl.int32), 1)                                                       # [BN]
    m_k = m_c & (b_rank < K)
    tl.store(front_out + b_rank, p_pool, mask=m_k)
    tl.store(ftok_out + b_rank, b_t, mask=m_k)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    if FIRST:
        tl.store(fpar_out + b_rank, tl.full([BN], -1, dtype=tl.int64), mask=m_k)
        b_rows = tl.full([BN, BD], -1, dtype=tl.int64)
    else:
        tl.store(fpar_out + b_rank, ((t - 2) * K + o_r).to(tl.int64), mask=m_k)
        b_rows = tl.load(rows_in + o_r[:, None] * D + o_d[None, :], mask=m_k[:, None] & m_d[None, :], other=-1)
    b_own = ((t - 1) * K + b_rank).to(tl.int64)
    b_rows = tl.where(o_d[None, :] == t - 1, b_own[:, None], b_rows)
    tl.store(rows_out + b_rank[:, None] * D + o_d[None, :], b_rows, mask=m_k[:, None] & m_d[None, :])


@triton.jit
def tree_finish_fwd_kernel(tok, par, score, dlen, ws_new, ws_node, ws_par, ws_dig, ws_pos, o_tok, o_par, o_score,
                           o_depth, o_pos, o_mask, ws_sp, o_sp_tok, o_sp_par, o_sp_score, o_sp_depth,
                           M: tl.constexpr, T: tl.constexpr, K: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr,
                           LEVEL: tl.constexpr, BM: tl.constexpr, BJ: tl.constexpr, BT: tl.constexpr,
                           SP: tl.constexpr = 0, BSP: tl.constexpr = 16, PDL: tl.constexpr = False):
    # one program: the kept set over the pool (stage 1), then the kept tree's order, mask and
    # positions (stage 2); the two stages hand over through ws_new / ws_node, and stage 2 gathers
    # parents through ws_par / ws_dig / ws_pos, each after a barrier that makes the stores visible to
    # every thread of the program
    pdl_prologue(PDL)
    o_m = tl.arange(0, BM)
    m_m = o_m < M
    b_s = tl.load(score + o_m, mask=m_m, other=0.0)                                                # [BM] f64
    n_i = b_s != b_s
    b_rank = tl.zeros([BM], dtype=tl.int32)
    # a node's rank among pool nodes 1.. by score: larger, or equal at a lower index (NaN first)
    for j0 in range(1, M, BJ):
        o_j = j0 + tl.arange(0, BJ)
        m_j = o_j < M
        b_sj = tl.load(score + o_j, mask=m_j, other=0.0)                                          # [BJ]
        n_j = b_sj != b_sj
        b_gt = (b_sj[None, :] > b_s[:, None]) | (n_j[None, :] & (n_i == 0)[:, None])               # [BM, BJ]
        b_eq = (b_sj[None, :] == b_s[:, None]) | (n_j[None, :] & n_i[:, None])
        b_before = (b_gt | (b_eq & (o_j[None, :] < o_m[:, None]))) & m_j[None, :]
        b_rank += tl.sum(b_before.to(tl.int32), 1)
    m_keep = m_m & ((o_m == 0) | (b_rank < T - 1))
    # kept nodes numbered in pool order (the root first); SP: the next SP by rank are spares, marked
    # -2 - (their rank among the spares) in ws_new
    b_new = tl.where(m_keep, tl.cumsum(m_keep.to(tl.int32), 0) - 1, -1)
    if SP > 0:
        m_sp = m_m & (o_m > 0) & (b_rank >= T - 1) & (b_rank < T - 1 + SP)
        b_new = tl.where(m_sp, -2 - (b_rank - (T - 1)), b_new)
        tl.store(ws_sp + (b_rank - (T - 1)), o_m.to(tl.int64), mask=m_sp)
    tl.store(ws_new + o_m, b_new.to(tl.int64), mask=m_m)
    tl.store(ws_node + b_new, o_m.to(tl.int64), mask=m_keep)
    tl.debug_barrier()

    o_t = tl.arange(0, BT)
    m_t = o_t < T
    b_i = tl.load(ws_node + o_t, mask=m_t, other=0)                                                # [BT] pool ids
    b_tk = tl.load(tok + b_i, mask=m_t, other=0)
    b_pp = tl.load(par + b_i, mask=m_t, other=-1)
    b_p = tl.load(ws_new + tl.maximum(b_pp, 0), mask=m_t & (b_pp >= 0), other=-1)                # kept parent
    b_p = tl.maximum(b_p, -1).to(tl.int32)   # a parent that is a spare (-2 - i) is not kept
    b_sc = tl.load(score + b_i, mask=m_t, other=0.0).to(tl.float32)
    # depth by creation: the root, K children, then K*K a level
    b_d = tl.where(b_i == 0, 0, tl.where(b_i <= K, 1, 2 + tl.maximum(b_i - 1 - K, 0) // (K * K))).to(tl.int64)
    # sibling rank: descending float32 score, ties to the lower index
    b_before = (b_sc[None, :] > b_sc[:, None]) | ((b_sc[None, :] == b_sc[:, None]) & (o_t[None, :] < o_t[:, None]))
    b_sr = tl.sum(((b_p[None, :] == b_p[:, None]) & b_before & m_t[None, :]).to(tl.int32), 1)      # [BT]
    # a node's digit of the path key: (sibling rank + 1) at its level, the root's level highest
    b_w = tl.where(b_d > 0, (b_sr + 1).to(tl.int64) << (BITS * tl.maximum(D - b_d, 0)), 0)        # [BT] i64
    # ancestors: D parent hops, each a gather of the kept parents (and their digits) through the
    # workspace, where a one-hot reduction over a [BT, BT] square a hop made most of the program's
    # instructions (bench/NOTES.md, session 48)
    tl.store(ws_par + o_t, b_p, mask=m_t)
    tl.store(ws_dig + o_t, b_w, mask=m_t)
    tl.debug_barrier()
    b_up = b_p
    b_key = b_w
    b_mask = o_t[:, None] == o_t[None, :]                                                           # [BT, BT]
    for _ in tl.static_range(D):
        m_up = b_up >= 0
        b_mask = b_mask | (b_up[:, None] == o_t[None, :])
        b_key += tl.load(ws_dig + b_up, mask=m_up, other=0)
        b_up = tl.load(ws_par + b_up, mask=m_up, other=-1)
    b_mask = b_mask & m_t[:, None] & m_t[None, :]
    if LEVEL:
        b_key += b_d << (BITS * D)
    # the traversal position: a stable ascending rank of the key
    b_lt = (b_key[None, :] < b_key[:, None]) | ((b_key[None, :] == b_key[:, None]) & (o_t[None, :] < o_t[:, None]))
    b_kr = tl.sum((b_lt & m_t[None, :]).to(tl.int32), 1)                                           # [BT]
    # kept number -> traversal position, for the parents (and the spares' parents)
    tl.store(ws_pos + o_t, b_kr, mask=m_t)
    tl.debug_barrier()
    b_fp = tl.load(ws_pos + b_p, mask=b_p >= 0, other=-1)
    tl.store(o_tok + b_kr, b_tk, mask=m_t)
    tl.store(o_par + b_kr, b_fp.to(tl.int64), mask=m_t)
    tl.store(o_score + b_kr, b_sc, mask=m_t)
    tl.store(o_depth + b_kr, b_d, mask=m_t)
    tl.store(o_pos + b_kr, tl.load(dlen).to(tl.int64) + b_d, mask=m_t)
    tl.store(o_mask + b_kr[:, None] * T + b_kr[None, :], b_mask, mask=m_t[:, None] & m_t[None, :])
    if SP > 0:
        # the spares (rank order): a parent kept is named by its flattened position, a parent that
        # is itself a spare as T + its spare rank
        o_s = tl.arange(0, BSP)
        m_s = o_s < SP
        b_si = tl.load(ws_sp + o_s, mask=m_s, other=0)                                              # [BSP] pool ids
        b_sv = tl.load(ws_new + tl.maximum(tl.load(par + b_si, mask=m_s, other=0), 0), mask=m_s, other=0)
        # (a parent neither kept nor a spare, -1: a NaN child ranked before its parent, as the tensor form)
        b_sp = tl.where(b_sv >= 0, tl.load(ws_pos + tl.maximum(b_sv, 0), mask=m_s, other=0).to(tl.int64),
                        tl.where(b_sv <= -2, T + (-2 - b_sv), -1))
        b_sd = tl.where(b_si <= K, 1, 2 + tl.maximum(b_si - 1 - K, 0) // (K * K)).to(tl.int64)
        tl.store(o_sp_tok + o_s, tl.load(tok + b_si, mask=m_s, other=0), mask=m_s)
        tl.store(o_sp_par + o_s, b_sp, mask=m_s)
        tl.store(o_sp_score + o_s, tl.load(score + b_si, mask=m_s, other=0.0).to(tl.float32), mask=m_s)
        tl.store(o_sp_depth + o_s, b_sd, mask=m_s)
