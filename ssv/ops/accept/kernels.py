import triton
import triton.language as tl

from ssv.ops.pdl import pdl_prologue


@triton.jit
def accept_greedy_fwd_kernel(parents, tokens, scores, best, path, length, bonus,
                             T: tl.constexpr, BT: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr = False):
    # one program walks the tree held in registers: at each depth the children of the current node
    # whose token is the target's argmax there, the first in sibling order (max score, lower index)
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
    for d in tl.static_range(1, D + 1):
        b_best = tl.load(best + cur)
        hit = (b_p == cur) & (b_k == b_best) & m_t & alive
        b_m = tl.max(tl.where(hit, b_s, float("-inf")), 0)
        nxt = tl.min(tl.where(hit & (b_s == b_m), o_t, BT), 0).to(tl.int64)
        found = nxt < BT
        cur = tl.where(found, nxt, cur)
        tl.store(path + d, tl.where(found, nxt, -1))
        n += found.to(tl.int64)
        alive = alive & found
    tl.store(length, n)
    tl.store(bonus, tl.load(best + cur))
