import triton
import triton.language as tl


@triton.jit
def tree_level_fwd_kernel(vals, toks, root, front, rows_in, tok, par, score, front_out, ftok_out, fpar_out,
                          rows_out, t, base, s_v,
                          R: tl.constexpr, K: tl.constexpr, D: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
                          FIRST: tl.constexpr):
    # one program, the level's R*K candidates c = r*K + i (frontier node r's i-th best child) in
    # registers: the pool writes, each candidate's rank by cumulative score (the count of candidates
    # ordered before it: larger, or equal at a lower index; NaN first, as rank_topk), and the K of
    # rank < K stored at their rank as the next frontier
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
def tree_keep_fwd_kernel(score, kpool, nidx, M, T: tl.constexpr, BM: tl.constexpr, BJ: tl.constexpr):
    # one program: the kept set of a grown pool, the root and the T - 1 best other nodes by score
    # (rank_topk's order: larger first, NaN first, ties to the lower index), in index order: kpool [T]
    # their pool ids, nidx [M] each pool node's place among them (-1 when dropped). A child never
    # outscores its parent and comes later, so the set is closed under ancestors (NaN aside)
    o_i = tl.arange(0, BM)
    m_i = (o_i < M) & (o_i > 0)
    b_xi = tl.load(score + o_i, mask=m_i, other=0.0)
    n_i = b_xi != b_xi
    b_rank = tl.zeros([BM], dtype=tl.int32)
    for j0 in range(1, M, BJ):
        o_j = j0 + tl.arange(0, BJ)
        m_j = o_j < M
        b_xj = tl.load(score + o_j, mask=m_j, other=0.0)
        n_j = b_xj != b_xj
        b_gt = (b_xj[None, :] > b_xi[:, None]) | (n_j[None, :] & (n_i == 0)[:, None])
        b_eq = (b_xj[None, :] == b_xi[:, None]) | (n_j[None, :] & n_i[:, None])
        b_before = (b_gt | (b_eq & (o_j[None, :] < o_i[:, None]))) & m_j[None, :]
        b_rank += tl.sum(b_before.to(tl.int32), 1)
    b_keep = (o_i == 0) | (m_i & (b_rank < T - 1))
    b_at = tl.cumsum(b_keep.to(tl.int32), 0) - 1
    tl.store(kpool + b_at, o_i.to(tl.int64), mask=b_keep)
    tl.store(nidx + o_i, tl.where(b_keep, b_at, -1).to(tl.int64), mask=o_i < M)


@triton.jit
def tree_flat_fwd_kernel(tok, par, score, kpool, nidx, tok_out, par_out, score_out, depth_out, perm_out, mask_out,
                         T: tl.constexpr, K: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr, LEVEL: tl.constexpr,
                         BT: tl.constexpr):
    # one program over the T kept nodes q (index order, as `_kept` lists them): depth from the pool
    # id, ancestors by D steps up the pool's parents, each node's rank among its siblings (descending
    # score, ties to the lower index), its path key (one digit a level: sibling rank + 1), the
    # ascending stable order of the keys (LEVEL: depth first, for bfs and pos), and the tree and its
    # ancestor mask written in that order
    o_q = tl.arange(0, BT)
    m_q = o_q < T
    b_kp = tl.load(kpool + o_q, mask=m_q, other=0)                                     # pool ids
    b_tok = tl.load(tok + b_kp, mask=m_q, other=0)
    b_sc = tl.load(score + b_kp, mask=m_q, other=0.0).to(tl.float32)
    b_dep = tl.where(b_kp == 0, 0, tl.where(b_kp <= K, 1, 2 + tl.maximum(b_kp - 1 - K, 0) // (K * K)))
    b_pp = tl.load(par + b_kp, mask=m_q & (b_kp > 0), other=-1)                       # parent's pool id
    b_np = tl.load(nidx + tl.maximum(b_pp, 0), mask=m_q & (b_pp >= 0), other=-1)     # its place
    # ancestor mask [q, s]: s is q or one of q's ancestors (compared as pool ids)
    b_mask = (o_q[:, None] == o_q[None, :]) & m_q[:, None] & m_q[None, :]
    b_up = b_kp
    for _ in tl.static_range(D):
        b_up = tl.load(par + tl.maximum(b_up, 0), mask=m_q & (b_up > 0), other=-1)
        # a dropped ancestor ends the chain, as the kept tree's parents do (only NaN scores drop one)
        b_in = tl.load(nidx + tl.maximum(b_up, 0), mask=m_q & (b_up >= 0), other=-1)
        b_up = tl.where(b_in >= 0, b_up, -1)
        b_mask = b_mask | ((b_up[:, None] == b_kp[None, :]) & (b_up >= 0)[:, None] & m_q[None, :])
    b_sib = (b_np[None, :] == b_np[:, None]) & ((b_sc[None, :] > b_sc[:, None])
                                                | ((b_sc[None, :] == b_sc[:, None]) & (o_q[None, :] < o_q[:, None])))
    b_srank = tl.sum((b_sib & m_q[None, :]).to(tl.int64), 1)
    b_digit = (b_srank + 1) * (b_dep > 0)
    b_w = tl.where(b_dep > 0, b_digit << (BITS * tl.maximum(D - b_dep, 0)).to(tl.int64), 0)
    b_key = tl.sum(tl.where(b_mask, b_w[None, :], 0), 1)
    if LEVEL:
        b_key = b_key + (b_dep.to(tl.int64) << (BITS * D))
    b_pos = tl.sum(((b_key[None, :] < b_key[:, None]) | ((b_key[None, :] == b_key[:, None]) & (o_q[None, :] < o_q[:, None])))
                   & m_q[None, :], 1).to(tl.int32)
    b_ppos = tl.sum(tl.where((o_q[None, :] == b_np[:, None]) & m_q[None, :], b_pos[None, :], 0), 1)
    b_ppos = tl.where(b_np >= 0, b_ppos, -1)
    tl.store(tok_out + b_pos, b_tok, mask=m_q)
    tl.store(par_out + b_pos, b_ppos.to(tl.int64), mask=m_q)
    tl.store(score_out + b_pos, b_sc, mask=m_q)
    tl.store(depth_out + b_pos, b_dep.to(tl.int64), mask=m_q)
    tl.store(perm_out + b_pos, o_q.to(tl.int64), mask=m_q)
    tl.store(mask_out + b_pos[:, None] * T + b_pos[None, :], b_mask.to(tl.int8), mask=m_q[:, None] & m_q[None, :])
