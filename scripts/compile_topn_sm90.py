"""Routing's top-n launch compiled for sm_90 here (no GPU) at the Llama-3.1-8B 64K row (1,025 selection blocks,
n = 16, one query a program): the whole power of two (BJ 2,048) against the tile + tail split (1,024 + 16, session 37)
at 4 / 2 / 1 warps: registers, static SASS and the bisection loop's body (a backward branch's span).
usage: python scripts/compile_topn_sm90.py"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm90 import compile_sm90, sass_lines  # noqa: E402
import ssv.ops.nsa.route_split_kernels as M  # noqa: E402

fn = M.nsa_route_topk_fwd_kernel
sig = {n: "*fp32" for n in ("own", "tail", "pp")}
sig.update({n: "*i32" for n in ("npath", "nbpre", "pos", "idx")})
sig.update({n: "i32" for n in "N NBS s_in s_ih s_un s_uh s_xn s_xh".split()})
for bj, bt, w in ((2048, 0, 4), (1024, 16, 4), (1024, 16, 2), (1024, 16, 1)):
    const = dict(QC=1, LS=64, R=4, A=2, BJ=bj, NSEL=16, NSELP=16, SORTED=False, FORCED_FIRST=True, FORCED_LOCAL=2,
                 NBPP=16, NW=8, BT=bt, PDL=True)
    cc, use = compile_sm90(fn, sig, const, w)
    ins = sass_lines(cc)
    print(f"BJ {bj} BT {bt} warps {w}: REG/STACK/SHARED {use}, {len(ins)} static SASS")
    # the bisection loop: the first backward branch, from its target to the branch
    addr = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", ln).group(1), 16) for ln in ins]
    for a, ln in zip(addr, ins):
        t = re.search(r"0x([0-9a-f]+)", ln.split("BRA")[1]) if "BRA" in ln else None
        if t and int(t.group(1), 16) < a:
            print("   bisection loop", t.group(0), "->", hex(a), "body", (a - int(t.group(1), 16)) // 16, "instructions")
            break
