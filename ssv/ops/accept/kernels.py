import triton
import triton.language as tl

from ssv.ops.pdl import pdl_prologue


@triton.jit
def accept_greedy_fwd_kernel(parents, tokens, scores, best, path, length, bonus, rows, nxt_tok,
                             T: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                             RECORD: tl.constexpr, PDL: tl.constexpr = False):
    # one program walks the tree held in registers: at each depth the children of the current node
    # whose token is the target's argmax there, the first in sibling order (max score, lower index);
    # RECORD: also the round's record (the drafter's rows and the token after each)
    pdl_prologue(PDL)
    o_t = tl.arange(0, BT)
    m_t = o_t < T
    b_p = tl.load(parents + o_t, mask=m_t, other=-2)                 # [BT]
    b_k = tl.load(tokens + o_t, mask=m_t, other=-1)
    b_s = tl.load(scores + o_t, mask=m_t, other=float("-inf")).to(tl.float32)
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
        found = nxt < BT
        cur = tl.where(found, nxt, cur)
        tl.store(path + d, tl.where(found, nxt, -1))
        b_after = tl.where(o_d == d - 1, tl.where(found, nxt, 0), b_after)
        n += found.to(tl.int64)
        alive = alive & found
    b_bonus = tl.load(best + cur)
    tl.store(length, n)
    if RECORD:
        # the drafter's row i is (the feature at path[i], the token after it): the next accepted
        # node's token, the bonus after the last; padded rows point at the root
        m_d = o_d <= D
        tl.store(rows, tl.zeros([], dtype=tl.int64))
        tl.store(rows + 1 + o_d, b_after, mask=o_d < D)
        b_nt = tl.load(tokens + b_after, mask=m_d, other=0)
        tl.store(nxt_tok + o_d, tl.where(o_d == n - 1, b_bonus, b_nt), mask=m_d)
    tl.store(bonus, b_bonus)


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
def accept_sample_fwd_kernel(parents, tokens, scores, probs, total, coins, path, length, bonus, rows, nxt_tok,
                             V, s_p, s_c, T: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                             K: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PDL: tl.constexpr = False):
    # the lossless multi-candidate walk (`ssv.spec.device.accept_sample_device`) in one program: at
    # node u its children in sibling order (max score, lower index), child j with token x accepted
    # when coin[u, j] * R < q, q = p_u(x) (0 for a token an earlier sibling carried), R = p_u's mass
    # minus the q before it; the last token with mass left always; on a rejection of every child the
    # bonus by inverse CDF (coin[u, K]) over p_u with the tried tokens removed; then the round's
    # record as `accept_greedy_fwd_kernel`'s
    pdl_prologue(PDL)
    o_t = tl.arange(0, BT)
    m_t = o_t < T
    b_p = tl.load(parents + o_t, mask=m_t, other=-2)                 # [BT]
    b_k = tl.load(tokens + o_t, mask=m_t, other=-1)
    b_s = tl.load(scores + o_t, mask=m_t, other=float("-inf")).to(tl.float32)
    o_j = tl.arange(0, BK)
    cur = tl.zeros([], dtype=tl.int64)
    n = tl.full([], 1, dtype=tl.int64)
    alive = tl.full([], 1, dtype=tl.int1)
    tl.store(path, cur)
    o_d = tl.arange(0, BD)
    b_after = tl.zeros([BD], dtype=tl.int64)
    b_rm = tl.full([BK], -1, dtype=tl.int64)      # the stop node's children's tokens (tried, removed)
    for d in tl.static_range(1, D + 1):
        p_u = probs + cur * s_p
        tot = tl.load(total + cur)
        cum = tl.zeros([], dtype=tl.float64)
        took = tl.zeros([], dtype=tl.int1)
        nxt = tl.zeros([], dtype=tl.int64)
        tried = (o_t < 0)                                            # [BT] children taken in order
        b_tok = tl.full([BK], -1, dtype=tl.int64)                   # their tokens, in sibling order
        for j in tl.static_range(K):
            cand = (b_p == cur) & m_t & ~tried
            b_m = tl.max(tl.where(cand, b_s, float("-inf")), 0)
            c = tl.min(tl.where(cand & (b_s == b_m), o_t, BT), 0)
            live = (c < BT) & alive & ~took
            tried = tried | (o_t == c)
            x = tl.sum(tl.where(o_t == c, b_k, 0), 0).to(tl.int64)
            dup = tl.sum(((b_tok == x) & (o_j < j)).to(tl.int32), 0) > 0
            b_tok = tl.where(o_j == j, tl.where(c < BT, x, -1), b_tok)
            q = tl.load(p_u + x, mask=live & ~dup, other=0.0).to(tl.float64)
            cum += q
            r = tot - (cum - q)
            coin = tl.load(coins + cur * s_c + j, mask=live, other=1.0).to(tl.float64)
            ok = live & ((coin * r < q) | ((q > 0) & (r - q <= 1e-12 * r)))
            nxt = tl.where(ok, c.to(tl.int64), nxt)
            took = took | ok
        b_rm = tl.where(alive & ~took, b_tok, b_rm)
        cur = tl.where(took, nxt, cur)
        tl.store(path + d, tl.where(took, nxt, -1))
        b_after = tl.where(o_d == d - 1, tl.where(took, nxt, 0), b_after)
        n += took.to(tl.int64)
        alive = alive & took
    # the bonus: the first index whose CDF (fp64, removed tokens 0) exceeds coin x the total, never a
    # zero-probability token (the last one with mass caps it); two passes over the stop node's row
    p_u = probs + cur * s_p
    b_acc = tl.zeros([BV], dtype=tl.float64)
    b_last = tl.full([BV], -1, dtype=tl.int64)
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        rm = tl.sum(((o_v[:, None].to(tl.int64) == b_rm[None, :]) & (b_rm >= 0)[None, :]).to(tl.int32), 1) > 0
        b_pv = tl.where(rm, 0.0, tl.load(p_u + o_v, mask=o_v < V, other=0.0).to(tl.float64))
        b_acc += b_pv
        b_last = tl.maximum(b_last, tl.where(b_pv > 0, o_v.to(tl.int64), -1))
    target = tl.load(coins + cur * s_c + K).to(tl.float64) * tl.sum(b_acc, 0)
    last = tl.max(b_last, 0)
    base = tl.zeros([], dtype=tl.float64)
    first = tl.full([], 2147483647, dtype=tl.int64)
    for v0 in range(0, V, BV):
        o_v = v0 + tl.arange(0, BV)
        rm = tl.sum(((o_v[:, None].to(tl.int64) == b_rm[None, :]) & (b_rm >= 0)[None, :]).to(tl.int32), 1) > 0
        b_pv = tl.where(rm, 0.0, tl.load(p_u + o_v, mask=o_v < V, other=0.0).to(tl.float64))
        b_cdf = base + tl.cumsum(b_pv, 0)
        first = tl.minimum(first, tl.min(tl.where((b_cdf > target) & (o_v < V), o_v.to(tl.int64), 2147483647), 0))
        base += tl.sum(b_pv, 0)
    b_bonus = tl.where(last >= 0, tl.minimum(first, last), 0)
    tl.store(length, n)
    m_d = o_d <= D
    tl.store(rows, tl.zeros([], dtype=tl.int64))
    tl.store(rows + 1 + o_d, b_after, mask=o_d < D)
    b_nt = tl.load(tokens + b_after, mask=m_d, other=0)
    tl.store(nxt_tok + o_d, tl.where(o_d == n - 1, b_bonus, b_nt), mask=m_d)
    tl.store(bonus, b_bonus)
