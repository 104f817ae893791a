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
