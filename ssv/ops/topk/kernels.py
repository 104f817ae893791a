import triton
import triton.language as tl

from ssv.ops.glue.kernels import _row_rsqrt
from ssv.ops.pdl import pdl_prologue


@triton.jit
def vocab_topk_fwd_kernel(x, vals, ids, id_map, xn, s_x, s_o, s_xn, eps, V: tl.constexpr, BV: tl.constexpr,
                          K: tl.constexpr, MAP: tl.constexpr, CLAMP: tl.constexpr, LOGITS: tl.constexpr,
                          NORM: tl.constexpr, DM: tl.constexpr, BDM: tl.constexpr, PDL: tl.constexpr = False):
    # one program per row, the whole row in registers: K rounds of one max over an int64 key a entry,
    # (the value's float bits made signed-orderable) << 32 | (BV - index), so a round's max is the
    # value's max at its lowest index and one reduction, not two; the pick's key is then retired to
    # the sentinel below every real key. MAP: store id_map[index] (draft -> target ids);
    # CLAMP: values capped at 0 (log-probs a rounding put above 0); LOGITS: x holds logits, made
    # log-probs here (x - max - log sum exp(x - max), as log_softmax) before the ranking, so the
    # row's log_softmax is no launch of its own; NORM (with LOGITS): x projected the un-normalized row
    # xn[r] through a weight with its RMSNorm's folded in, so the logits are first scaled by xn's 1 / rms
    pdl_prologue(PDL)
    i_r = tl.program_id(0).to(tl.int64)
    o_v = tl.arange(0, BV)
    b_x = tl.load(x + i_r * s_x + o_v, mask=o_v < V, other=float("-inf")).to(tl.float32)   # [BV]
    if LOGITS:
        if NORM:
            b_x = b_x * _row_rsqrt(xn, i_r, s_xn, eps, DM, BDM)
        b_s = b_x - tl.max(b_x, 0)
        b_x = b_s - tl.log(tl.sum(tl.exp(b_s), 0))
    b_key = tl.where(o_v < V, _order_key(b_x, o_v, BV), -9223372036854775807 - 1)           # [BV] int64
    for j in tl.static_range(K):
        b_best = tl.max(b_key, 0)
        b_i = BV - (b_best & 0xFFFFFFFF)
        b_k32 = (b_best >> 32).to(tl.int32)
        b_m = (b_k32 ^ ((b_k32 >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
        b_v = tl.minimum(b_m, 0.0) if CLAMP else b_m
        tl.store(vals + i_r * s_o + j, b_v.to(vals.dtype.element_ty))
        b_o = tl.load(id_map + b_i).to(tl.int64) if MAP else b_i.to(tl.int64)
        tl.store(ids + i_r * s_o + j, b_o)
        b_key = tl.where(b_key == b_best, -9223372036854775807 - 1, b_key)


@triton.jit
def _order_key(b_x, o_v, BV: tl.constexpr):
    # float32 [B] at indices o_v < BV -> int64 keys whose order is (value, then the lower index first):
    # the bits of a negative float flipped below its sign make the int32 order the float order (-0
    # made +0 first, so the two zeros tie as floats do), the index's complement in the low word
    b_b = tl.where(b_x == 0, 0.0, b_x).to(tl.int32, bitcast=True)
    b_k32 = b_b ^ ((b_b >> 31) & 0x7FFFFFFF)
    return (b_k32.to(tl.int64) << 32) | (BV - o_v).to(tl.int64)


@triton.jit
def rank_topk_fwd_kernel(x, vals, ids, s_x, s_o, N, K: tl.constexpr, BN: tl.constexpr, BJ: tl.constexpr,
                         LARGEST: tl.constexpr, BY_INDEX: tl.constexpr, PDL: tl.constexpr = False):
    # one program per row of a short row (a tree's scores): an entry's rank is the number of entries
    # ordered before it (larger, or equal at a lower index; NaN first when descending and last when
    # ascending, as a stable sort puts it), counted against the row in BJ-wide chunks; the entries
    # of rank < K are stored at their rank, or (BY_INDEX) at their place among the kept in index
    # order, a prefix sum of the kept flags. Ranks are distinct, so each output slot is written once
    pdl_prologue(PDL)
    i_r = tl.program_id(0).to(tl.int64)
    o_i = tl.arange(0, BN)
    m_i = o_i < N
    b_xi = tl.load(x + i_r * s_x + o_i, mask=m_i, other=0)                     # [BN]
    n_i = b_xi != b_xi
    b_rank = tl.zeros([BN], dtype=tl.int32)
    for j0 in range(0, N, BJ):
        o_j = j0 + tl.arange(0, BJ)
        b_xj = tl.load(x + i_r * s_x + o_j, mask=o_j < N, other=0)             # [BJ]
        n_j = b_xj != b_xj
        if LARGEST:
            b_gt = (b_xj[None, :] > b_xi[:, None]) | (n_j[None, :] & (n_i == 0)[:, None])
        else:
            b_gt = (b_xj[None, :] < b_xi[:, None]) | (n_i[:, None] & (n_j == 0)[None, :])
        b_eq = (b_xj[None, :] == b_xi[:, None]) | (n_j[None, :] & n_i[:, None])
        b_before = (b_gt | (b_eq & (o_j[None, :] < o_i[:, None]))) & (o_j < N)[None, :]   # [BN, BJ]
        b_rank += tl.sum(b_before.to(tl.int32), 1)
    b_keep = m_i & (b_rank < K)
    if BY_INDEX:
        b_at = tl.cumsum(b_keep.to(tl.int32), 0) - 1
    else:
        b_at = b_rank
    tl.store(vals + i_r * s_o + b_at, b_xi, mask=b_keep)
    tl.store(ids + i_r * s_o + b_at, o_i.to(tl.int64), mask=b_keep)


@triton.jit
def _best(b_x, o_c, m_c, BIG):
    # (value, lowest index at it) of candidates b_x [B] at indices o_c < BIG where m_c, torch.argmax's order:
    # a NaN beats every number (the first NaN wins), else the max, ties to the lower index
    b_nan = (b_x != b_x) & m_c
    i_nan = tl.min(tl.where(b_nan, o_c, BIG), 0)
    b_m = tl.max(tl.where(m_c & ~b_nan, b_x, float("-inf")), 0)
    i_m = tl.min(tl.where(m_c & (b_x == b_m), o_c, BIG), 0)
    return tl.where(i_nan < BIG, float("nan"), b_m), tl.where(i_nan < BIG, i_nan, i_m)


@triton.jit
def argmax_part_fwd_kernel(x, p_v, p_i, s_x, V, NS, BC: tl.constexpr, PDL: tl.constexpr = False):
    # program (row, chunk): the best of BC columns, as a partial (value, index) for the merge
    pdl_prologue(PDL)
    i_r, i_c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < V
    b_x = tl.load(x + i_r * s_x + o_c, mask=m_c, other=float("-inf")).to(tl.float32)   # [BC]
    b_m, b_i = _best(b_x, o_c, m_c, V)
    tl.store(p_v + i_r * NS + i_c, b_m)
    tl.store(p_i + i_r * NS + i_c, b_i)


@triton.jit
def argmax_merge_fwd_kernel(p_v, p_i, out, out2, NS, BS: tl.constexpr, OUT2: tl.constexpr,
                            PDL: tl.constexpr = False):
    # program row: the best of its NS partials, in column order (an earlier chunk's index is lower),
    # stored as int64 at out[row] (and out2[row])
    pdl_prologue(PDL)
    i_r = tl.program_id(0).to(tl.int64)
    o_s = tl.arange(0, BS)
    m_s = o_s < NS
    b_v = tl.load(p_v + i_r * NS + o_s, mask=m_s, other=float("-inf"))
    b_i = tl.load(p_i + i_r * NS + o_s, mask=m_s, other=0)
    b_m, b_k = _best(b_v, o_s, m_s, BS)
    b_best = tl.sum(tl.where(o_s == b_k, b_i, 0), 0).to(tl.int64)
    tl.store(out + i_r, b_best)
    if OUT2:
        tl.store(out2 + i_r, b_best)
