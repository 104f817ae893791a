import triton
import triton.language as tl


@triton.jit
def vocab_topk_fwd_kernel(x, vals, ids, s_x, s_o, V: tl.constexpr, BV: tl.constexpr, K: tl.constexpr):
    # one program per row, the whole row in registers: K rounds of (max, lowest index at the max),
    # each pick masked out for the next round
    i_r = tl.program_id(0).to(tl.int64)
    o_v = tl.arange(0, BV)
    b_x = tl.load(x + i_r * s_x + o_v, mask=o_v < V, other=float("-inf")).to(tl.float32)   # [BV]
    b_t = o_v >= V                                                                         # taken
    for j in tl.static_range(K):
        b_m = tl.max(tl.where(b_t, float("-inf"), b_x), 0)
        b_i = tl.min(tl.where((b_x == b_m) & (b_t == 0), o_v, BV), 0)
        tl.store(vals + i_r * s_o + j, b_m.to(vals.dtype.element_ty))
        tl.store(ids + i_r * s_o + j, b_i.to(tl.int64))
        b_t = b_t | (o_v == b_i)
