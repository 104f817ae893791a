import triton
import triton.language as tl

from ssv.ops.pdl import pdl_prologue


@triton.jit
def ring_commit_fwd_kernel(k_new, v_new, k_ring, v_ring, slot_pos, x, hid, n, dlen, R, s_kn, s_kr, s_x,
                           W: tl.constexpr, E: tl.constexpr, H: tl.constexpr, BR: tl.constexpr,
                           BE: tl.constexpr, BH: tl.constexpr, PDL: tl.constexpr = False):
    # one program: the rows are few (a path and its next tokens) and the length it advances is read
    # by every row, so no second program may see it advanced. E = Hkv * D, a row's contiguous keys
    pdl_prologue(PDL)
    b_n = tl.load(n).to(tl.int64)
    b_d = tl.load(dlen).to(tl.int64)
    o_r = tl.arange(0, BR).to(tl.int64)
    m_r = o_r < R
    b_pos = b_d + o_r                                                          # [BR]
    b_real = o_r < b_n
    b_slot = tl.where(b_real, b_pos % W, W)                                    # padded rows: the spare slot
    o_e = tl.arange(0, BE)
    m_re = m_r[:, None] & (o_e < E)[None, :]
    p_src = o_r[:, None] * s_kn + o_e[None, :]                                 # [BR, BE]
    p_dst = b_slot[:, None] * s_kr + o_e[None, :]
    tl.store(k_ring + p_dst, tl.load(k_new + p_src, mask=m_re), mask=m_re)
    tl.store(v_ring + p_dst, tl.load(v_new + p_src, mask=m_re), mask=m_re)
    tl.store(slot_pos + b_slot, tl.where(b_real, b_pos, -1), mask=m_r)
    o_h = tl.arange(0, BH)
    m_h = o_h < H
    b_last = tl.maximum(b_n - 1, 0)
    tl.store(hid + o_h, tl.load(x + b_last * s_x + o_h, mask=m_h).to(hid.dtype.element_ty), mask=m_h)
    tl.store(dlen, b_d + b_n)
