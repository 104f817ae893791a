import triton
import triton.language as tl

from ssv.ops.pdl import pdl_prologue


@triton.jit
def lookup_match_fwd_kernel(hist, length, best, S: tl.constexpr, OFF: tl.constexpr, NLO: tl.constexpr,
                            NHI: tl.constexpr, BS: tl.constexpr, PDL: tl.constexpr = False):
    # program i_b: the positions `at` of block i_b where hist[at:at + n] equals the text's last n
    # tokens and ends before the last token (at + n <= length - 1), for each n of NLO..NHI; the
    # block's latest such `at` goes into best[n - NLO] (an atomic max over the programs, best = -1
    # before the launch). The text's length (length[0] + OFF) is read here, never on the host: the
    # grid covers the whole buffer and blocks at or past the text's end leave at once
    pdl_prologue(PDL)
    i_b = tl.program_id(0).to(tl.int64)
    n_len = tl.load(length).to(tl.int64) + OFF
    if i_b * BS >= n_len:
        return
    o_a = i_b * BS + tl.arange(0, BS).to(tl.int64)                                               # [BS]
    for n in tl.static_range(NLO, NHI + 1):
        m_a = (o_a <= S - n) & (o_a + n <= n_len - 1) & (n_len > n)
        for i in tl.static_range(n):
            # the suffix's i-th token (clamped into the buffer, as the tensor form's index)
            b_q = tl.load(hist + tl.minimum(tl.maximum(n_len - n + i, 0), S - 1))
            b_h = tl.load(hist + o_a + i, mask=m_a, other=0)                                    # [BS]
            m_a = m_a & (b_h == b_q)
        b_at = tl.max(tl.where(m_a, o_a, -1), 0)
        tl.atomic_max(best + (n - NLO), b_at, mask=b_at >= 0)


@triton.jit
def lookup_attach_fwd_kernel(hist, length, best, t_tok, t_par, t_sc, t_dep, mask, pos,
                             s_tok, s_par, s_sc, s_dep, o_tok, o_par, o_sc, o_dep, o_mask, o_pos,
                             S: tl.constexpr, OFF: tl.constexpr, T: tl.constexpr, K: tl.constexpr,
                             NLO: tl.constexpr, NHI: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                             BR: tl.constexpr, PDL: tl.constexpr = False):
    # one program. (1) the chain's start: the longest n with a match (best[n - NLO] >= 0) wins,
    # start = best + n, else -1; best[] back to -1 for the next launch. (2) the chain toks[j] =
    # hist[start + j], valid while start + j < length. (3) the greedy walk of its valid prefix
    # through the tree (held nodes, the last reached `cur`), the K new slots (the r unheld chain
    # tokens under cur, then spares 0..K - r - 1), and the T + K nodes' arrays, positions and mask
    pdl_prologue(PDL)
    n_len = tl.load(length).to(tl.int64) + OFF
    start = tl.full([], -1, dtype=tl.int64)
    for n in tl.static_range(NLO, NHI + 1):
        b_b = tl.load(best + (n - NLO)).to(tl.int64)
        start = tl.where(b_b >= 0, b_b + n, start)
    # every thread has read best[] before any resets it
    tl.debug_barrier()
    for n in tl.static_range(NLO, NHI + 1):
        tl.store(best + (n - NLO), tl.full([], -1, dtype=best.dtype.element_ty))

    # the tree's T nodes in registers, copied to the outputs' first T entries
    o_n = tl.arange(0, BN).to(tl.int64)
    m_t = o_n < T
    b_tk = tl.load(t_tok + o_n, mask=m_t, other=0)                                               # [BN]
    b_tp = tl.load(t_par + o_n, mask=m_t, other=-2)
    b_ts = tl.load(t_sc + o_n, mask=m_t, other=0.0)
    b_td = tl.load(t_dep + o_n, mask=m_t, other=0)
    b_pos = tl.load(pos + o_n, mask=m_t, other=0)
    tl.store(o_tok + o_n, b_tk, mask=m_t)
    tl.store(o_par + o_n, b_tp, mask=m_t)
    tl.store(o_sc + o_n, b_ts.to(tl.float32), mask=m_t)
    tl.store(o_dep + o_n, b_td, mask=m_t)
    tl.store(o_pos + o_n, b_pos, mask=m_t)

    # the walk: at step i the child of cur with the chain's token i, the first in sibling order
    # (max score, then the lower index); a NaN score among the hits stops it (the tensor form's max
    # is NaN there, which equals no score)
    cur = tl.zeros([], dtype=tl.int64)
    held = tl.zeros([], dtype=tl.int64)
    alive = tl.full([], 1, dtype=tl.int1)
    for i in tl.static_range(K):
        b_q = tl.load(hist + tl.minimum(tl.maximum(start + i, 0), S - 1))
        ok = (start >= 0) & (start + i < n_len)
        hit = (b_tp == cur) & (b_tk == b_q) & m_t & alive & ok                                 # [BN]
        nan = tl.max((hit & (b_ts != b_ts)).to(tl.int32), 0) > 0
        b_m = tl.max(tl.where(hit, b_ts, float("-inf")), 0)
        first = tl.min(tl.where(hit & (b_ts == b_m), o_n, BN), 0)
        found = (first < T) & (nan == 0)
        cur = tl.where(found, first, cur)
        held += found.to(tl.int64)
        alive = alive & found

    # the K new slots T + j: chain slots j < r (the unheld valid tokens), then spare j - r
    o_j = tl.arange(0, BK).to(tl.int64)
    m_j = o_j < K
    b_src = held + o_j                                                                           # [BK]
    b_real = (b_src < K) & (start >= 0) & (start + b_src < n_len) & m_j
    r = tl.sum(b_real.to(tl.int64), 0)
    m_ch = o_j < r
    b_src = tl.minimum(b_src, K - 1)
    b_sp = tl.maximum(o_j - r, 0)
    b_ctk = tl.load(hist + tl.minimum(tl.maximum(start + b_src, 0), S - 1), mask=m_j, other=0)
    b_stk = tl.load(s_tok + b_sp, mask=m_j, other=0)
    b_spp = tl.load(s_par + b_sp, mask=m_j, other=0)
    b_sss = tl.load(s_sc + b_sp, mask=m_j, other=0.0).to(tl.float32)
    b_sdp = tl.load(s_dep + b_sp, mask=m_j, other=0)
    c_dep = tl.load(t_dep + cur)
    c_sc = tl.load(t_sc + cur).to(tl.float32)
    b_np = tl.where(m_ch, tl.where(o_j == 0, cur, T + o_j - 1), tl.where(b_spp >= T, b_spp + r, b_spp))
    b_nt = tl.where(m_ch, b_ctk, b_stk)
    b_nd = tl.where(m_ch, c_dep + 1 + o_j, b_sdp)
    b_ns = tl.where(m_ch, c_sc, b_sss)
    b_p0 = tl.load(pos)
    tl.store(o_tok + T + o_j, b_nt, mask=m_j)
    tl.store(o_par + T + o_j, b_np, mask=m_j)
    tl.store(o_sc + T + o_j, b_ns, mask=m_j)
    tl.store(o_dep + T + o_j, b_nd, mask=m_j)
    tl.store(o_pos + T + o_j, b_p0 + b_nd, mask=m_j)

    # the mask's first T rows: the tree's, padded with False
    for r0 in range(0, T, BR):
        o_r = r0 + tl.arange(0, BR).to(tl.int64)
        m_r = o_r < T
        b_row = tl.load(mask + o_r[:, None] * T + o_n[None, :], mask=m_r[:, None] & m_t[None, :], other=0)
        tl.store(o_mask + o_r[:, None] * (T + K) + o_n[None, :], b_row != 0,
                 mask=m_r[:, None] & (o_n < T + K)[None, :])
    # a new row: its new ancestors (parent hops while they are new slots, at most K) and itself,
    # then the first tree node reached's row of the input mask
    b_up = tl.where(m_j, T + o_j, -1)                                                            # [BK]
    b_base = tl.full([BK], -1, dtype=tl.int64)
    b_anc = o_n[None, :] == (T + o_j)[:, None]                                                   # [BK, BN]
    for _ in tl.static_range(K):
        b_g = tl.sum(tl.where(o_j[None, :] == (b_up - T)[:, None], b_np[None, :], 0), 1)       # [BK]
        m_up = b_up >= 0
        m_new = m_up & (b_g >= T)
        b_anc = b_anc | (m_new[:, None] & (o_n[None, :] == b_g[:, None]))
        b_base = tl.where(m_up & (b_g < T), b_g, b_base)
        b_up = tl.where(m_new, b_g, -1)
    m_b = (b_base >= 0)[:, None] & m_t[None, :]
    b_row = tl.load(mask + b_base[:, None] * T + o_n[None, :], mask=m_b, other=0) != 0
    tl.store(o_mask + (T + o_j)[:, None] * (T + K) + o_n[None, :], b_row | b_anc,
             mask=m_j[:, None] & (o_n < T + K)[None, :])
