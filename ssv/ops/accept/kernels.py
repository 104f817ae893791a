import triton
import triton.language as tl

from ssv.ops.pdl import pdl_prologue


@triton.jit
def _load_tree(parents, tokens, scores, T: tl.constexpr, BT: tl.constexpr):
    # the tree in registers: node ids, parents (-2 past T), tokens (-1 past T), scores (-inf past T)
    o_t = tl.arange(0, BT)
    m_t = o_t < T
    b_p = tl.load(parents + o_t, mask=m_t, other=-2)                 # [BT]
    b_k = tl.load(tokens + o_t, mask=m_t, other=-1)
    b_s = tl.load(scores + o_t, mask=m_t, other=float("-inf")).to(tl.float32)
    return o_t, m_t, b_p, b_k, b_s


@triton.jit
def _advance(path, d, found, nxt, cur, b_after, n, alive, o_d):
    # depth d of a walk: path[d] (-1 when no child was taken), the node after path[d - 1], the count
    cur = tl.where(found, nxt, cur)
    tl.store(path + d, tl.where(found, nxt, -1))
    b_after = tl.where(o_d == d - 1, tl.where(found, nxt, 0), b_after)
    return cur, b_after, n + found.to(tl.int64), alive & found


@triton.jit
def _store_rows(rows, tokens, b_after, o_d, D: tl.constexpr):
    # the drafter's row i is (the feature at path[i], the token after it): rows[i] the path with
    # padding at the root; returns the token after each row (the next accepted node's)
    tl.store(rows, tl.zeros([], dtype=tl.int64))
    tl.store(rows + 1 + o_d, b_after, mask=o_d < D)
    return tl.load(tokens + b_after, mask=o_d <= D, other=0)


@triton.jit
def accept_greedy_fwd_kernel(parents, tokens, scores, best, path, length, bonus, rows, nxt_tok,
                             T: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                             RECORD: tl.constexpr, PDL: tl.constexpr = False):
    # one program walks the tree held in registers: at each depth the children of the current node
    # whose token is the target's argmax there, the first in sibling order (max score, lower index);
    # RECORD: also the round's record (the drafter's rows and the token after each)
    pdl_prologue(PDL)
    o_t, m_t, b_p, b_k, b_s = _load_tree(parents, tokens, scores, T, BT)
    cur = tl.zeros([], dtype=tl.int64)
    n = tl.full([], 1, dtype=tl.int64)
    alive = tl.full([], 1, dtype=tl.int1)
    tl.store(path, cur)
    o_d = tl.arange(0, BD)
    b_after = tl.zeros([BD], dtype=tl.int64)      # the node after path[i] (path[D]'s wraps to the root)
    for d in tl.static_range(1, D + 1):
        b_best = tl.load(best + cur)
        hit = (b_p == cur) & (b_k == b_best) & m_t & alive
        b_m = tl.max(tl.where(hit, b_s, float("-inf")), 0)
        nxt = tl.min(tl.where(hit & (b_s == b_m), o_t, BT), 0).to(tl.int64)
        cur, b_after, n, alive = _advance(path, d, nxt < BT, nxt, cur, b_after, n, alive, o_d)
    b_bonus = tl.load(best + cur)
    tl.store(length, n)
    if RECORD:   # the token after each row: the bonus after the last; padded rows point at the root
        b_nt = _store_rows(rows, tokens, b_after, o_d, D)
        tl.store(nxt_tok + o_d, tl.where(o_d == n - 1, b_bonus, b_nt), mask=o_d <= D)
    tl.store(bonus, b_bonus)


@triton.jit
def probs_rows_fwd_kernel(logits, inv_t, probs, total, V, s_l, s_p, BV: tl.constexpr, PDL: tl.constexpr = False):
    # probs[u] = softmax(logits[u] * inv_t) (`ssv.spec.accept.probs_unchecked` without top-p) and total[u] = the
    # written row's sum in fp64 (`row_mass_fwd_kernel`'s), one program a row: the scaled row's max and sum of
    # exp(x - max) per lane (no cross-lane reduction inside the loop), then the normalised row
    pdl_prologue(PDL)
    i_u = tl.program_id(0).to(tl.int64)
    p_l = logits + i_u * s_l
    p_p = probs + i_u * s_p
    b_it = tl.load(inv_t).to(tl.float32)
    b_m = tl.full([BV], float("-inf"), dtype=tl.float32)                # [BV]
    b_s = tl.zeros([BV], dtype=tl.float32)
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        b_x = tl.load(p_l + o_v, mask=o_v < V, other=float("-inf")).to(tl.float32) * b_it
        b_mn = tl.maximum(b_m, b_x)
        b_ms = tl.where(b_mn == float("-inf"), 0.0, b_mn)    # a lane with nothing yet: no rescale, nothing added
        b_s = b_s * tl.exp(b_m - b_ms) + tl.exp(b_x - b_ms)
        b_m = b_mn
    m = tl.max(b_m, 0)
    r = 1.0 / tl.sum(b_s * tl.exp(b_m - m), 0)
    b_acc = tl.zeros([BV], dtype=tl.float64)
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        m_v = o_v < V
        b_p = tl.exp(tl.load(p_l + o_v, mask=m_v, other=float("-inf")).to(tl.float32) * b_it - m) * r
        tl.store(p_p + o_v, b_p, mask=m_v)
        b_acc += b_p.to(tl.float64)
    tl.store(total + i_u, tl.sum(b_acc, 0))


@triton.jit
def row_mass_fwd_kernel(probs, total, V, s_p, BV: tl.constexpr, PDL: tl.constexpr = False):
    # total[u] = sum_v probs[u, v], accumulated in fp64: the mass the sampled walk starts from at u
    pdl_prologue(PDL)
    p_row = probs + tl.program_id(0).to(tl.int64) * s_p
    b_acc = tl.zeros([BV], dtype=tl.float64)
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        b_acc += tl.load(p_row + o_v, mask=o_v < V, other=0.0).to(tl.float64)
    tl.store(total + tl.program_id(0), tl.sum(b_acc, 0))


@triton.jit
def accept_sample_fwd_kernel(parents, tokens, scores, probs, total, coins, path, length, rows, nxt_tok, stop,
                             s_p, s_c, T: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                             K: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False):
    # the lossless multi-candidate walk (`ssv.spec.device_accept.accept_sample_device`) in one warp: at node
    # u its children in sibling order (max score, lower index), child c with token x accepted when
    # coin[u, j] * R < q, q = p_u(x) (0 for a token an earlier sibling carried), R = p_u's mass minus
    # the q before it; the last token with mass left always. Every load is hoisted before the walk
    # (each node's q at its parent, the masses, the coins), so its D * K steps are register
    # reductions, not dependent memory round trips. Writes the path, the record but the bonus, the
    # stop node (stop[0]) and its bonus coin (stop[1], as float64 bits), and zeroes the stop node's
    # tried tokens in its probability row for the bonus launches
    pdl_prologue(PDL)
    o_t, m_t, b_p, b_k, b_s = _load_tree(parents, tokens, scores, T, BT)
    m_c = m_t & (b_p >= 0)
    b_q = tl.load(probs + tl.maximum(b_p, 0) * s_p + tl.maximum(b_k, 0), mask=m_c, other=0.0).to(tl.float64)
    b_tot = tl.load(total + o_t, mask=m_t, other=0.0)
    o_j = tl.arange(0, BK)
    b_coin = tl.load(coins + o_t[:, None].to(tl.int64) * s_c + o_j[None, :],
                     mask=m_t[:, None] & (o_j <= K)[None, :], other=1.0).to(tl.float64)   # [BT, BK]
    cur = tl.zeros([], dtype=tl.int64)
    n = tl.full([], 1, dtype=tl.int64)
    alive = tl.full([], 1, dtype=tl.int1)
    tl.store(path, cur)
    o_d = tl.arange(0, BD)
    b_after = tl.zeros([BD], dtype=tl.int64)
    b_rm = tl.full([BK], -1, dtype=tl.int64)      # the stop node's children's tokens (tried, removed)
    for d in tl.static_range(1, D + 1):
        at = o_t == cur
        tot = tl.sum(tl.where(at, b_tot, 0.0), 0)
        b_crow = tl.sum(tl.where(at[:, None], b_coin, 0.0), 0)                          # [BK]
        cum = tl.zeros([], dtype=tl.float64)
        took = tl.zeros([], dtype=tl.int1)
        nxt = tl.zeros([], dtype=tl.int64)
        tried = o_t < 0
        b_tok = tl.full([BK], -1, dtype=tl.int64)                   # the tried tokens, in sibling order
        for j in tl.static_range(K):
            cand = (b_p == cur) & m_t & ~tried
            b_m = tl.max(tl.where(cand, b_s, float("-inf")), 0)
            c = tl.min(tl.where(cand & (b_s == b_m), o_t, BT), 0)
            hit = o_t == c
            live = (c < BT) & alive & ~took
            tried = tried | hit
            x = tl.sum(tl.where(hit, b_k, 0), 0).to(tl.int64)
            dup = tl.sum(((b_tok == x) & (o_j < j)).to(tl.int32), 0) > 0
            b_tok = tl.where(o_j == j, tl.where(c < BT, x, -1), b_tok)
            q = tl.where(live & ~dup, tl.sum(tl.where(hit, b_q, 0.0), 0), 0.0)
            cum += q
            r = tot - (cum - q)
            coin = tl.sum(tl.where(o_j == j, b_crow, 0.0), 0)
            ok = live & ((coin * r < q) | ((q > 0) & (r - q <= 1e-12 * r)))
            nxt = tl.where(ok, c.to(tl.int64), nxt)
            took = took | ok
        b_rm = tl.where(alive & ~took, b_tok, b_rm)
        cur, b_after, n, alive = _advance(path, d, took, nxt, cur, b_after, n, alive, o_d)
    cb = tl.sum(tl.sum(tl.where((o_t == cur)[:, None] & (o_j == K)[None, :], b_coin, 0.0), 1), 0)
    tl.store(stop, cur)
    tl.store(stop + 1, cb.to(tl.int64, bitcast=True))
    tl.store(probs + cur * s_p + tl.maximum(b_rm, 0), tl.zeros([BK], dtype=probs.dtype.element_ty), mask=b_rm >= 0)
    tl.store(length, n)
    # the record but its last token, which the bonus's launch writes
    tl.store(nxt_tok + o_d, _store_rows(rows, tokens, b_after, o_d, D), mask=(o_d <= D) & (o_d != n - 1))


@triton.jit
def bonus_mass_fwd_kernel(probs, stop, part, lastp, V, s_p, BV: tl.constexpr, STOP: tl.constexpr = True,
                          PDL: tl.constexpr = False):
    # chunk i_c of one row: the fp64 mass and the last index with mass (-1 for none). STOP: the row is
    # the walk's stop node (stop[0]; its tried tokens zeroed by the walk), else row 0 (an AR step's)
    pdl_prologue(PDL)
    i_c = tl.program_id(0)
    o_v = i_c * BV + tl.arange(0, BV)
    i_r = 0
    if STOP:
        i_r = tl.load(stop)
    b_pv = tl.load(probs + i_r * s_p + o_v, mask=o_v < V, other=0.0).to(tl.float64)
    tl.store(part + i_c, tl.sum(b_pv, 0))
    tl.store(lastp + i_c, tl.max(tl.where(b_pv > 0, o_v, -1), 0))


@triton.jit
def bonus_pick_fwd_kernel(probs, stop, coin, part, lastp, length, bonus, nxt_tok, V, NC, s_p, BV: tl.constexpr,
                          NCP: tl.constexpr, STOP: tl.constexpr = True, PDL: tl.constexpr = False):
    # a token by inverse CDF (`ssv.spec.device_accept.sample_device`): the first index whose CDF exceeds
    # coin x the row's mass, never a zero-probability one (the last with mass caps it): the chunk
    # from the chunks' masses, then the index by a scan of that chunk alone. STOP: the walk's bonus
    # (row stop[0], its coin stop[1] as float64 bits), written to bonus and the record's last token
    # (nxt[n - 1]); else an AR step's token (row 0, the coin coin[0]), written to bonus and nxt[0]
    pdl_prologue(PDL)
    o_c = tl.arange(0, NCP)
    b_part = tl.load(part + o_c, mask=o_c < NC, other=0.0)
    if STOP:
        i_r = tl.load(stop)
        b_coin = tl.load(stop + 1).to(tl.float64, bitcast=True)
    else:
        i_r = 0
        b_coin = tl.load(coin).to(tl.float64)
    target = b_coin * tl.sum(b_part, 0)
    b_cum = tl.cumsum(b_part, 0)
    c = tl.min(tl.where((b_cum > target) & (o_c < NC), o_c, NCP), 0)
    last = tl.max(tl.load(lastp + o_c, mask=o_c < NC, other=-1), 0)
    base = tl.sum(tl.where(o_c < c, b_part, 0.0), 0)
    o_v = c * BV + tl.arange(0, BV)
    b_pv = tl.load(probs + i_r * s_p + o_v, mask=(o_v < V) & (c < NCP), other=0.0).to(tl.float64)
    b_cdf = base + tl.cumsum(b_pv, 0)
    first = tl.min(tl.where((b_cdf > target) & (o_v < V), o_v, 2147483647), 0)
    b_tok = tl.where(last >= 0, tl.minimum(first, last), 0).to(tl.int64)
    tl.store(bonus, b_tok)
    if STOP:
        tl.store(nxt_tok + tl.load(length) - 1, b_tok)
    else:
        tl.store(nxt_tok, b_tok)


@triton.jit
def logits_mass_fwd_kernel(logits, inv_t, cmax, part, V, BV: tl.constexpr, PDL: tl.constexpr = False):
    # chunk i_c of one row of logits, x = logits x inv_t: its max (fp32) and the fp64 sum of exp(x - max), so the
    # pick can rescale every chunk to the row's max without a launch for the max first
    pdl_prologue(PDL)
    i_c = tl.program_id(0)
    o_v = i_c * BV + tl.arange(0, BV)
    b_x = tl.load(logits + o_v, mask=o_v < V, other=float("-inf")).to(tl.float32) * tl.load(inv_t).to(tl.float32)
    m = tl.max(b_x, 0)
    m_s = tl.where(m == float("-inf"), 0.0, m)     # a chunk of -inf alone: no mass (not NaN)
    tl.store(cmax + i_c, m)
    tl.store(part + i_c, tl.sum(tl.exp(b_x - m_s).to(tl.float64), 0))


@triton.jit
def logits_pick_fwd_kernel(logits, inv_t, coin, cmax, part, out, out2, V, NC, BV: tl.constexpr, NCP: tl.constexpr,
                           PDL: tl.constexpr = False):
    # a token by inverse CDF over p = exp(x - M) (x = logits x inv_t, M the row's max; `sample_device` of
    # softmax(x) up to rounding): the chunk where the chunks' rescaled masses pass coin x total, then a scan of
    # that chunk alone; where rounding leaves the target unreached, the chunk's last token with p > 0 (so never
    # a token whose p is 0 in fp32). Written to out[0] and out2[0]
    pdl_prologue(PDL)
    o_c = tl.arange(0, NCP)
    m_c = o_c < NC
    b_m = tl.load(cmax + o_c, mask=m_c, other=float("-inf"))
    M = tl.max(b_m, 0)
    b_w = tl.load(part + o_c, mask=m_c, other=0.0) * tl.exp(b_m - M).to(tl.float64)   # [NCP]
    b_w = tl.where(b_m == float("-inf"), 0.0, b_w)
    target = tl.load(coin).to(tl.float64) * tl.sum(b_w, 0)
    b_cum = tl.cumsum(b_w, 0)
    c = tl.min(tl.where((b_cum > target) & m_c, o_c, NCP), 0)
    c = tl.where(c < NCP, c, tl.max(tl.where(b_w > 0, o_c, -1), 0))   # the target past the total: the last mass
    base = tl.sum(tl.where(o_c < c, b_w, 0.0), 0)
    o_v = c * BV + tl.arange(0, BV)
    m_v = (o_v < V) & (c >= 0)
    b_x = tl.load(logits + o_v, mask=m_v, other=float("-inf")).to(tl.float32) * tl.load(inv_t).to(tl.float32)
    b_p = tl.exp(b_x - M).to(tl.float64)
    b_cdf = base + tl.cumsum(b_p, 0)
    first = tl.min(tl.where((b_cdf > target) & m_v, o_v, 2147483647), 0)
    last = tl.max(tl.where((b_p > 0) & m_v, o_v, -1), 0)
    b_tok = tl.where(first < 2147483647, first, tl.maximum(last, 0)).to(tl.int64)
    tl.store(out, b_tok)
    tl.store(out2, b_tok)
