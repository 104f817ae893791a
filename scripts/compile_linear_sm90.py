"""Compile the step's GEMM kernels for sm_90 without a GPU (triton's own ptxas) at the default model's (and its
drafter's q|k|v) shapes and shipped tiles, PDL on and off, and show where their L2 prefetch of the weights lands: the
`prefetch.global.L2` instructions before `griddepcontrol.wait` in the PTX (the prefetch overlaps the
previous kernel only there), their count a thread, and the SASS's prefetch (CCTL) instructions.
Prints one line a variant; tests/ops/test_pdl.py runs it."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm90 import compile_sm90, sass_lines  # noqa: E402

from ssv.ops.linear.kernels import linear_fwd_kernel, linear_rope_fwd_kernel  # noqa: E402


def report(name, cc, use):
    ptx = cc.asm["ptx"]
    first, wait = ptx.find("prefetch.global.L2"), ptx.find("griddepcontrol.wait")
    last = ptx.rfind("prefetch.global.L2")
    sass = sum("CCTL" in ln for ln in sass_lines(cc))
    print(f"{name} REG {use[0]} prefetch_ptx {ptx.count('prefetch.global.L2')} prefetch_sass {sass} "
          f"waits {ptx.count('griddepcontrol.wait')} before_wait {wait >= 0 and 0 <= first and last < wait}")


LIN = dict(x="*bf16", w="*bf16", y="*bf16", y2="*bf16", M="i32", N="i32", s_xm="i32", s_wn="i32", s_ym="i32",
           s_y2m="i32", eps="fp32")
for label, k, glu, acc, norm, out2 in (("o", 576, False, True, False, False),
                                       ("gate_up", 576, True, False, True, False),
                                       ("down", 1536, False, True, False, False),
                                       ("qkv", 576, False, False, True, False),
                                       ("down tap", 1536, False, True, False, True)):
    for pdl in (False, True):
        cc, use = compile_sm90(linear_fwd_kernel, LIN, dict(K=k, BM=16, BN=32, BK=256, NORM=norm, GLU=glu, ACC=acc,
                                                            OUT2=out2, PDL=pdl), 4, 3)
        report(f"linear {label} pdl={pdl}", cc, use)
ROPE = dict(x="*bf16", w="*bf16", cos="*fp32", sin="*fp32", slots="*i64", pos="*i64", q_out="*bf16", kc="*bf16",
            vc="*bf16", M="i32", s_xm="i32", s_wn="i32", s_c="i32", s_qn="i32", s_qh="i32", s_kh="i32", s_kt="i32",
            eps="fp32")
for pdl in (False, True):
    cc, use = compile_sm90(linear_rope_fwd_kernel, ROPE, dict(K=576, HQ=9, HKV=3, D=64, BM=16, BN=32, BK=256, NORM=True,
                                                              POS=True, PDL=pdl), 4, 3)
    report(f"linear_rope qkv pdl={pdl}", cc, use)
for pdl in (False, True):   # the EAGLE-3 drafter's: its two normed halves side by side, no folded norm
    cc, use = compile_sm90(linear_rope_fwd_kernel, ROPE, dict(K=1152, HQ=9, HKV=3, D=64, BM=16, BN=32, BK=256,
                                                              NORM=False, POS=False, PDL=pdl), 4, 3)
    report(f"linear_rope draft_qkv pdl={pdl}", cc, use)
