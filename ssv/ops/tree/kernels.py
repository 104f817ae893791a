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
