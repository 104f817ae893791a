"""Triton helpers shared by the attention kernels (NSA verification, dense verification)."""
import triton
import triton.language as tl


@triton.jit
def online_softmax(b_s, m_s, b_v, b_m, b_l, b_acc):
    # one flash-attention step on base-2 scores b_s [BM, BK] (m_s: which a row may use) and values b_v
    # [BK, D] into the rows' state (max b_m, sum b_l, acc b_acc); rows with nothing visible keep (-inf, 0, 0)
    b_s = tl.where(m_s, b_s, float("-inf"))
    b_mn = tl.maximum(b_m, tl.max(b_s, 1))
    b_ms = tl.where(b_mn == float("-inf"), 0.0, b_mn)
    b_p = tl.exp2(b_s - b_ms[:, None])
    b_alpha = tl.exp2(b_m - b_ms)
    b_l = b_l * b_alpha + tl.sum(b_p, 1)
    b_acc = b_acc * b_alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision="ieee")
    return b_mn, b_l, b_acc
