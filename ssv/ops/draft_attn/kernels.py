import triton
import triton.language as tl

from ssv.ops.pdl import pdl_prologue


@triton.jit
def _online_tile(b_q, b_k, b_v, m_k, b_m, b_l, b_acc, scale):
    # one tile of keys (rows where m_k) into the running softmax state (max b_m, sum b_l, b_acc);
    # the running max starts finite, so a tile with nothing visible adds exactly zero. Keys and values
    # were loaded without m_k (their loads wait on no other load): the scores of hidden keys and the
    # values of hidden rows are replaced here, so what a hidden row holds (NaN included) never counts
    b_s = tl.dot(b_q, tl.trans(b_k)).to(tl.float32) * scale                            # [BM, BK]
    b_s = tl.where(m_k[None, :], b_s, float("-inf"))
    b_mn = tl.maximum(b_m, tl.max(b_s, 1))
    b_e = tl.exp(b_s - b_mn[:, None])
    b_a = tl.exp(b_m - b_mn)
    b_v = tl.where(m_k[:, None], b_v, 0.0).to(b_v.dtype)
    b_acc = b_acc * b_a[:, None] + tl.dot(b_e.to(b_v.dtype), b_v).to(tl.float32)
    b_l = b_l * b_a + tl.sum(b_e, 1)
    return b_mn, b_l, b_acc


@triton.jit
def _ring_tiles(b_q, k_ring, v_ring, ring_pos, i_s, i_h, p_q, o_d, m_d, b_m, b_l, b_acc, scale, s_rk, s_rh,
                W: tl.constexpr, BK: tl.constexpr, TPS: tl.constexpr):
    # split i_s's TPS tiles of the ring: slot s is visible when it holds a position inside the window
    for t in tl.static_range(TPS):
        o_k = (i_s * TPS + t) * BK + tl.arange(0, BK)                                      # [BK]
        m_r = o_k < W
        b_p = tl.load(ring_pos + o_k, mask=m_r, other=-1)
        p_k = o_k.to(tl.int64)[:, None] * s_rk + i_h * s_rh + o_d[None, :]
        b_k = tl.load(k_ring + p_k, mask=m_r[:, None] & m_d[None, :], other=0.0)         # [BK, BD]
        b_v = tl.load(v_ring + p_k, mask=m_r[:, None] & m_d[None, :], other=0.0)
        m_k = m_r & (b_p >= 0) & (b_p > p_q - W)
        b_m, b_l, b_acc = _online_tile(b_q, b_k, b_v, m_k, b_m, b_l, b_acc, scale)
    return b_m, b_l, b_acc


@triton.jit
def _path_tile(b_q, k_scr, v_scr, path, n_real, i_f, i_h, lvl, o_d, m_d, b_m, b_l, b_acc, scale, s_sk, s_sh, s_pn,
               W: tl.constexpr, DP: tl.constexpr, BP: tl.constexpr, ROWS: tl.constexpr):
    # the node's path as one gathered tile: column j is the ancestor at depth j + 1, visible within the window
    o_j = tl.arange(0, BP)
    if ROWS:    # the real rows before it and itself (a padded row sees itself)
        b_n = tl.load(n_real).to(tl.int64)
        b_r = tl.where((o_j <= i_f) & ((o_j < b_n) | (o_j == i_f)), o_j, -1).to(tl.int64)
    else:
        b_r = tl.load(path + i_f * s_pn + o_j, mask=o_j < DP, other=-1).to(tl.int64)
    m_j = (b_r >= 0) & ((lvl - 1) - (o_j + 1) < W)
    p_s = tl.maximum(b_r, 0)[:, None] * s_sk + i_h * s_sh + o_d[None, :]
    b_k = tl.load(k_scr + p_s, mask=m_j[:, None] & m_d[None, :], other=0.0)
    b_v = tl.load(v_scr + p_s, mask=m_j[:, None] & m_d[None, :], other=0.0)
    return _online_tile(b_q, b_k, b_v, m_j, b_m, b_l, b_acc, scale)


@triton.jit
def draft_attn_fwd_kernel(q, k_ring, v_ring, ring_pos, k_scr, v_scr, path, dlen, n_real, ws_m, ws_l, ws_a, level,
                          scale, s_qn, s_qh, s_rk, s_rh, s_sk, s_sh, s_pn,
                          W: tl.constexpr, G: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                          BK: tl.constexpr, TPS: tl.constexpr, NS: tl.constexpr, DP: tl.constexpr,
                          BP: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr = False):
    # program (frontier node, KV head, split): the G query heads of the head on the dot's rows; splits
    # 0 .. NS - 1 take TPS BK-key tiles of the ring's window each, split NS the node's own path rows as
    # one gathered tile. Each writes its partial softmax state (max, sum, unnormalized output) for
    # draft_attn_merge_fwd_kernel: one tile's latency chain a program instead of the window's.
    # ROWS: the programs are a chain of rows being committed, row f one position after row f - 1
    # (its level is level + f), its path the chain's rows up to it of which the first n_real are real
    pdl_prologue(PDL)
    i_f, i_h, i_s = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2)
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
    if i_s < NS:
        b_m, b_l, b_acc = _ring_tiles(b_q, k_ring, v_ring, ring_pos, i_s, i_h, p_q, o_d, m_d, b_m, b_l, b_acc, scale,
                                      s_rk, s_rh, W, BK, TPS)
    else:
        b_m, b_l, b_acc = _path_tile(b_q, k_scr, v_scr, path, n_real, i_f, i_h, lvl, o_d, m_d, b_m, b_l, b_acc, scale,
                                     s_sk, s_sh, s_pn, W, DP, BP, ROWS)
    # workspace [F, Hq, NS + 1] (max, sum) and [F, Hq, NS + 1, BD]
    p_w = (i_f * tl.num_programs(1) * G + i_h * G + o_g) * (NS + 1) + i_s                # [BM]
    tl.store(ws_m + p_w, b_m, mask=m_g)
    tl.store(ws_l + p_w, b_l, mask=m_g)
    tl.store(ws_a + p_w[:, None] * BD + o_d[None, :], b_acc, mask=m_g[:, None])


@triton.jit
def draft_attn_merge_fwd_kernel(ws_m, ws_l, ws_a, o, s_on, HQ: tl.constexpr, BH: tl.constexpr, D: tl.constexpr,
                                BD: tl.constexpr, NS: tl.constexpr, PDL: tl.constexpr = False):
    # program (query row): its HQ heads' NS + 1 partial states merged (every row sees at least its own
    # path row, so the merged sum is positive)
    pdl_prologue(PDL)
    i_f = tl.program_id(0).to(tl.int64)
    o_h = tl.arange(0, BH)
    m_h = o_h < HQ
    o_d = tl.arange(0, BD)
    p_w = (i_f * HQ + o_h) * (NS + 1)                                                     # [BH]
    b_m = tl.full([BH], -1e30, dtype=tl.float32)
    for s in tl.static_range(NS + 1):
        b_m = tl.maximum(b_m, tl.load(ws_m + p_w + s, mask=m_h, other=-1e30))
    b_l = tl.zeros([BH], dtype=tl.float32)
    b_acc = tl.zeros([BH, BD], dtype=tl.float32)
    for s in tl.static_range(NS + 1):
        b_a = tl.exp(tl.load(ws_m + p_w + s, mask=m_h, other=-1e30) - b_m)
        b_l += b_a * tl.load(ws_l + p_w + s, mask=m_h, other=0.0)
        b_acc += b_a[:, None] * tl.load(ws_a + (p_w + s)[:, None] * BD + o_d[None, :], mask=m_h[:, None], other=0.0)
    b_l = tl.where(m_h, b_l, 1.0)
    p_o = o + i_f * s_on + o_h[:, None] * D + o_d[None, :]
    tl.store(p_o, (b_acc / b_l[:, None]).to(o.dtype.element_ty), mask=m_h[:, None] & (o_d[None, :] < D))
