"""Static sm_90 SASS counts (triton's own ptxas, no GPU) of two draft-phase kernels of the package on
PYTHONPATH: the vocabulary top-k over logits with the folded norm (V = 8,192, k = 8, 8 warps, the default
head's level) and the tree finish (the default 6 x 8 / 48 tree's 329-node pool at 4 / 8 / 16 / 32 warps).
Instruction totals, barriers, shuffles, local-memory spills, registers / stack / shared memory.
    PYTHONPATH=. python scripts/draft_sass_counts.py"""
import os
import re
import subprocess
import sys

import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm90 import compile_sm90, sass_lines  # noqa: E402

import ssv  # noqa: E402
from ssv.ops.topk.kernels import vocab_topk_fwd_kernel  # noqa: E402
from ssv.ops.tree.kernels import tree_finish_fwd_kernel  # noqa: E402

KINDS = ("BAR", "SHFL", "LDL", "STL", "ISETP", "SEL", "FMNMX", "FSETP", "DSETP")


def counts(cc) -> str:
    ops = [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*(@!?U?P\w+\s+)?", "", ln).split()[0] for ln in sass_lines(cc)]
    return f"SASS {len(ops)} " + " ".join(f"{k} {sum(o.startswith(k) for o in ops)}" for k in KINDS)


def main():
    here = os.path.dirname(ssv.__file__)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=here).stdout.strip() or os.environ.get("SSV_COMMIT", "?")
    print(f"package {here} commit {commit} triton {triton.__version__} target sm_90")
    cc, use = compile_sm90(vocab_topk_fwd_kernel, dict(x="*fp32", vals="*fp64", ids="*i64", id_map="*i64", xn="*bf16",
                                                       s_x="i32", s_o="i32", s_xn="i32", eps="fp32"),
                           dict(V=8192, BV=8192, K=8, MAP=True, CLAMP=True, LOGITS=True, NORM=True, DM=576, BDM=1024,
                                PDL=True), warps=8)
    print(f"vocab_topk warps 8: REG/STACK/SHARED {'/'.join(use)} {counts(cc)}")
    sig = {n: "*i64" for n in ("tok", "par", "dlen", "ws_new", "ws_node", "o_tok", "o_par", "o_depth", "o_pos", "ws_sp",
                               "o_sp_tok", "o_sp_par", "o_sp_depth", "ws_par", "ws_dig", "ws_pos")}
    sig.update(score="*fp64", o_score="*fp32", o_mask="*i1", o_sp_score="*fp32")
    sig = {n: t for n, t in sig.items() if n in tree_finish_fwd_kernel.arg_names}   # a package's own workspaces
    for w in (4, 8, 16, 32):
        cc, use = compile_sm90(tree_finish_fwd_kernel, sig, dict(M=329, T=48, K=8, D=6, BITS=4, LEVEL=True, BM=512,
                                                                 BJ=32, BT=64, SP=0, BSP=16, PDL=True), warps=w)
        print(f"tree_finish warps {w}: REG/STACK/SHARED {'/'.join(use)} {counts(cc)}")


if __name__ == "__main__":
    main()
