import triton
import triton.language as tl

from ssv.ops.pdl import pdl_prologue


@triton.jit
def _online_tile(b_q, p_k, p_v, m_k, m_d, b_m, b_l, b_acc, scale):
    # one tile of keys (rows where m_k) into the running softmax state (max b_m, sum b_l, b_acc);
    # the running max starts finite, so a tile with nothing visible adds exactly zero
    b_k = tl.load(p_k, mask=m_k[:, None] & m_d[None, :], other=0.0)                    # [BK, BD]
    b_s = tl.dot(b_q, tl.trans(b_k)).to(tl.float32) * scale                            # [BM, BK]
    b_s = tl.where(m_k[None, :], b_s, float("-inf"))
    b_mn = tl.maximum(b_m, tl.max(b_s, 1))
    b_e = tl.exp(b_s - b_mn[:, None])
    b_a = tl.exp(b_m - b_mn)
    b_v = tl.load(p_v, mask=m_k[:, None] & m_d[None, :], other=0.0)
    b_acc = b_acc * b_a[:, None] + tl.dot(b_e.to(b_v.dtype), b_v).to(tl.float32)
    b_l = b_l * b_a + tl.sum(b_e, 1)
    return b_mn, b_l, b_acc


@triton.jit
def draft_attn_fwd_kernel(q, k_ring, v_ring, ring_pos, k_scr, v_scr, path, dlen, n_real, o, level, scale,
                          s_qn, s_qh, s_rk, s_rh, s_sk, s_sh, s_pn, s_on,
                          W: tl.constexpr, G: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                          BK: tl.constexpr, DP: tl.constexpr, BP: tl.constexpr, ROWS: tl.constexpr,
                          PDL: tl.constexpr = False):
    # program (frontier node, KV head): the G query heads of the head on the dot's rows, the ring's
    # window in BK-key tiles, then the node's own path rows as one more tile; online softmax.
    # ROWS: the programs are a chain of rows being committed, row f one position after row f - 1
    # (its level is level + f), its path the chain's rows up to it of which the first n_real are real
    pdl_prologue(PDL)
    i_f, i_h = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    if ROWS:
        lvl = level + i_f
    else:
        lvl = level + 0 * i_f
    p_q = tl.load(dlen).to(tl.int64) - 1 + lvl - 1            # the level's query position
    o_g = tl.arange(0, BM)
    m_g = o_g < G
    o_d = tl.arange(0, BD)       # head dim padded to the dot's 16
    m_d = o_d < D
    b_q = tl.load(q + i_f * s_qn + (i_h * G + o_g)[:, None] * s_qh + o_d[None, :], mask=m_g[:, None] & m_d[None, :],
                  other=0.0)
    b_m = tl.full([BM], -1e30, dtype=tl.float32)
    b_l = tl.zeros([BM], dtype=tl.float32)
    b_acc = tl.zeros([BM, BD], dtype=tl.float32)
    for i_k in range(0, W, BK):
        o_k = i_k + tl.arange(0, BK)
        b_p = tl.load(ring_pos + o_k, mask=o_k < W, other=-1)
        m_k = (o_k < W) & (b_p >= 0) & (b_p > p_q - W)
        p_k = o_k.to(tl.int64)[:, None] * s_rk + i_h * s_rh + o_d[None, :]
        b_m, b_l, b_acc = _online_tile(b_q, k_ring + p_k, v_ring + p_k, m_k, m_d, b_m, b_l, b_acc, scale)
    # the path: column j is the ancestor at depth j + 1, visible within the window
    o_j = tl.arange(0, BP)
    if ROWS:    # the real rows before it and itself (a padded row sees itself)
        b_n = tl.load(n_real).to(tl.int64)
        b_r = tl.where((o_j <= i_f) & ((o_j < b_n) | (o_j == i_f)), o_j, -1).to(tl.int64)
    else:
        b_r = tl.load(path + i_f * s_pn + o_j, mask=o_j < DP, other=-1).to(tl.int64)
    m_j = (b_r >= 0) & ((lvl - 1) - (o_j + 1) < W)
    p_s = tl.maximum(b_r, 0)[:, None] * s_sk + i_h * s_sh + o_d[None, :]
    b_m, b_l, b_acc = _online_tile(b_q, k_scr + p_s, v_scr + p_s, m_j, m_d, b_m, b_l, b_acc, scale)
    p_o = o + i_f * s_on + (i_h * G + o_g)[:, None] * D + o_d[None, :]
    tl.store(p_o, (b_acc / b_l[:, None]).to(o.dtype.element_ty), mask=m_g[:, None] & m_d[None, :])
