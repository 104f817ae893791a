import triton
import triton.language as tl


@triton.jit
def vocab_topk_fwd_kernel(x, vals, ids, id_map, s_x, s_o, V: tl.constexpr, BV: tl.constexpr, K: tl.constexpr,
                          MAP: tl.constexpr, CLAMP: tl.constexpr):
    # one program per row, the whole row in registers: K rounds of (max, lowest index at the max),
    # each pick masked out for the next round. MAP: store id_map[index] (draft -> target ids);
    # CLAMP: values capped at 0 (log-probs a rounding put above 0)
    i_r = tl.program_id(0).to(tl.int64)
    o_v = tl.arange(0, BV)
    b_x = tl.load(x + i_r * s_x + o_v, mask=o_v < V, other=float("-inf")).to(tl.float32)   # [BV]
    b_t = o_v >= V                                                                         # taken
    for j in tl.static_range(K):
        b_m = tl.max(tl.where(b_t, float("-inf"), b_x), 0)
        b_i = tl.min(tl.where((b_x == b_m) & (b_t == 0), o_v, BV), 0)
        b_v = tl.minimum(b_m, 0.0) if CLAMP else b_m
        tl.store(vals + i_r * s_o + j, b_v.to(vals.dtype.element_ty))
        b_o = tl.load(id_map + b_i).to(tl.int64) if MAP else b_i.to(tl.int64)
        tl.store(ids + i_r * s_o + j, b_o)
        b_t = b_t | (o_v == b_i)
