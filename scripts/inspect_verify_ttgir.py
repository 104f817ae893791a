"""Compile the verify kernel for sm_90 on a machine without a GPU and summarise its main loop.

Why: device time is scarce; whether the K/V loads are software-pipelined (cp.async) and how many
layout conversions each iteration pays can be read from the TTGIR without running anything.
The launch specialisation matters: the JIT marks pointers and integers divisible by 16 with
tt.divisibility=16, and without that hint no load is pipelined, so it is passed here too.
usage: python scripts/inspect_verify_ttgir.py          (TTGIR summary, one line per (C, rows, warps))
       python scripts/inspect_verify_ttgir.py --sass   (registers, stack, and the SASS of the main loop:
                                                        instructions per warp per iteration, barriers;
                                                        with the ptxas/nvdisasm/cuobjdump Triton ships)
"""
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ssv.ops.nsa.verify import nsa_verify_fwd_kernel

INTS = ("N", "W", "NSPLIT", "s_qn", "s_qh", "s_kh", "s_kt", "s_bn", "s_bh", "s_tn", "HQ")
PTRS = dict(q="*bf16", k="*bf16", v="*bf16", pos="*i64", tmask="*u8", blk="*i32", gates="*fp32", o_cmp="*fp32",
            o="*bf16", lse_a="*fp32", lse_b="*fp32", ws_m="*fp32", ws_l="*fp32", ws_a="*fp32", items="*i32",
            cnt="*i32", plen="*i32")


def compile_verify(C, rows, warps, stages=3, G=4, D=128, approx=False, tma=True, lazy=False, gated=False,
                   fold=False):
    desc = f"tensordesc<bf16[1,64,{D}]>" if tma else "*bf16"
    sig = dict(PTRS, k_desc=desc, v_desc=desc, scale="fp32", **{n: "i32" for n in INTS})
    order = list(nsa_verify_fwd_kernel.arg_names)
    sig = {n: sig.get(n, "constexpr") for n in order}
    cq = 1 if approx else C
    const = dict(G=G, C=C, CQ=cq, CE=cq * 16, BM=rows, D=D, BS=64, NSEL=16, NSELP=16, BT=64, NWP=16, NTB=4, GATED=gated,
                 APPROX=approx, SPLIT=True, TMA=tma, LAZY=lazy, FOLD=fold)
    div = [order.index(n) for n in list(PTRS) + [n for n in INTS if n != "NSPLIT"]]
    src = ASTSource(fn=nsa_verify_fwd_kernel, signature=sig, constexprs={(order.index(k),): v for k, v in const.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i in div})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))


def main_loop(ttgir: str) -> str:
    lines = ttgir.splitlines()
    i0 = next(i for i, l in enumerate(lines) if "scf.for" in l)
    ind = len(lines[i0]) - len(lines[i0].lstrip())
    i1 = next(i for i in range(i0 + 1, len(lines))
              if lines[i].strip().startswith("scf.yield") and len(lines[i]) - len(lines[i].lstrip()) == ind + 2)
    return "\n".join(lines[i0:i1])


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def sass_summary(cc) -> str:
    """Registers, stack bytes, and the SASS of the first loop with tensor-core ops (the main K/V loop)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cc.asm["cubin"])
    try:
        use = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        text = subprocess.run([_tool("nvdisasm"), "-c", f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    reg, stack = re.search(r"REG:(\d+) STACK:(\d+)", use).groups()
    ins, labels = [], {}
    for line in text.splitlines():
        m = re.match(r"^\.(L_x_\d+):", line.strip())
        if m:
            labels[m.group(1)] = len(ins)
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(.*?);", line)
        if m:
            ins.append(m.group(1))
    back = [(labels[m.group(1)], i) for i, t in enumerate(ins)
            if (m := re.search(r"BRA\s+`?\(?\.?(L_x_\d+)", t)) and labels.get(m.group(1), i) < i]
    back = [(a, b) for a, b in back if any(t.startswith("HMMA") for t in ins[a:b + 1])]  # K/V loops only
    if not back:
        return f"registers {reg}, stack {stack} B, no mma.sync loop found (wgmma or none)"
    a, b = back[0]
    ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in ins[a:b + 1])
    top = ", ".join(f"{k} {v}" for k, v in ops.most_common(8))
    return f"registers {reg}, stack {stack} B, main loop {b - a + 1} instructions ({top}; BAR {ops['BAR']})"


def main() -> int:
    if "--sass" in sys.argv:
        for C, rows, warps, stages in ((1, 16, 4, 3), (4, 16, 4, 3), (8, 32, 4, 3), (16, 64, 8, 3)):
            for tma, lazy in ((True, False), (False, False), (True, True)):
                cc = compile_verify(C, rows, warps, stages, tma=tma, lazy=lazy)
                print(f"C={C:2d} rows={rows} warps={warps} stages={stages} tma={tma!s:5s} lazy={lazy!s:5s}: "
                      f"{sass_summary(cc)}")
        return 0
    for C, rows, warps in ((1, 16, 4), (4, 16, 4), (16, 64, 4), (16, 64, 8)):
        cc = compile_verify(C, rows, warps)
        body = main_loop(cc.asm["ttgir"])
        ops = Counter(re.findall(r'= "?([a-z_]+\.[a-z_\.]+)', body))
        sync_loads = len(re.findall(r"tt.load [^\n]*tensor<64x128", body))
        print(f"C={C:2d} rows={rows} warps={warps}: async copies {ops['ttg.async_copy_global_to_local']}, "
              f"synchronous tile loads {sync_loads}, "
              f"layout conversions {ops['ttg.convert_layout']}, reductions {ops['tt.reduce']}, "
              f"MMA {ops['tt.dot']} (mma.sync) + {ops['ttng.warp_group_dot']} (wgmma), "
              f"shared stores {ops['ttg.local_alloc']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
