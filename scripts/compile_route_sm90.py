"""Registers of routing's score launch compiled for sm_90 here (no GPU), at the Llama-3.1-8B 64K shape
(16 queries x 4 heads a program, 64-block tiles): as it is, with key tiles through pointers or
descriptors, and without its path-block branch. ncu on the H200 read 226 registers a thread and 2
programs an SM for this launch (bench/results/route-s33/ncu-route-case0.txt).
usage: python scripts/compile_route_sm90.py"""
import os
import sys
import tempfile

from sm90 import compile_sm90
import ssv.ops.nsa.route_split_kernels as M


def regs(fn, sig, const, warps=4):
    return compile_sm90(fn, sig, const, warps)[1]


def main():
    fn = M.nsa_route_score_fwd_kernel
    ptr = {n: "*bf16" for n in ("q", "kc", "vc", "k", "v")}
    ptr.update({n: "*fp32" for n in ("w", "sp", "m_out", "l_out", "a_out", "own_h", "tail_h", "mt")})
    ptr.update({n: "*i32" for n in ("s0p", "npath", "nbpre")})
    ints = {n: "i32" for n in "N NBP NCS NBS S L s_qn s_qh s_kh s_kb s_ch s_kt s_wn s_wb HQ s_on s_mn".split()}
    for tma in (False, True):
        sig = dict(ptr, **ints, scale="fp32")
        desc = "tensordesc<bf16[1,64,128]>"
        sig.update(kd=desc if tma else "*bf16", vd=desc if tma else "*bf16")
        const = dict(G=4, CR=16, BM=64, D=128, BC=64, WANT_O=False, GP=4, R=4, A=2, SB=128, NBPP=8, SUMS=False, TMA=tma, PDL=True)
        print("score tma", tma, "REG/STACK/SHARED", regs(fn, sig, const))
    # the same kernel without its path-block branch (a copy of the module with the branch cut out)
    src = open(M.__file__).read()
    i = src.index("    else:\n        b = i_s - NCS")
    j = src.index("    p_part = (i_s * N + o_qi) * HQ + o_hq")
    d = tempfile.mkdtemp()
    open(os.path.join(d, "score_nopath.py"), "w").write(src[:i] + src[j:])
    sys.path.insert(0, d)
    import score_nopath as M2  # noqa: E402
    sig = dict(ptr, **ints, scale="fp32")
    sig.update(kd="tensordesc<bf16[1,64,128]>", vd="tensordesc<bf16[1,64,128]>")
    print("score without the path branch, tma: REG/STACK/SHARED", regs(M2.nsa_route_score_fwd_kernel, sig, const))


if __name__ == "__main__":
    main()
