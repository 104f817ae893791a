"""Compile the draft level's fused kernels for sm_90 without a GPU (triton's own ptxas): the two input
norms in one launch (`rmsnorm_pair_fwd_kernel`) and the vocabulary top-k over logits with the final
norm folded (`vocab_topk_fwd_kernel`, LOGITS and NORM), at the default head's shapes (576 wide, a
12,288-token draft vocabulary), and the drafter's ring commit (`ring_commit_fwd_kernel`, 3 x 64 keys a
row, a 512-slot window, the default), and the level's and the commit rows' attention (`draft_attn_fwd_kernel`,
8 frontier nodes / 7 rows over a 512-key window in its default 4 splits) with the splits' merge, PDL on. Prints their registers / stack / shared memory; a lowering
failure raises. tests/ops/test_compile_launches.py runs it."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm90 import compile_sm90  # noqa: E402

from ssv.ops.glue.kernels import rmsnorm_pair_fwd_kernel  # noqa: E402
from ssv.ops.ring_commit.kernels import ring_commit_fwd_kernel  # noqa: E402
from ssv.ops.topk.kernels import vocab_topk_fwd_kernel  # noqa: E402

for gather in (False, True):   # the level's parent features gathered and copied (a level > 2), or not
    _, use = compile_sm90(rmsnorm_pair_fwd_kernel, dict(x1="*bf16", w1="*bf16", rows="*i64", x2="*bf16", w2="*bf16",
                                                        y="*bf16", rows2="*i64", raw="*bf16", eps1="fp32", eps2="fp32",
                                                        s_x1="i32", s_x2="i32", s_y="i32", s_raw="i32"),
                          dict(D=576, BD=1024, GATHER2=gather, RAW=True, PDL=True), warps=4)
    print(f"rmsnorm_pair gather={gather} REG %s STACK %s SHARED %s" % use)
for norm in (False, True):
    _, use = compile_sm90(vocab_topk_fwd_kernel, dict(x="*fp32", vals="*fp64", ids="*i64", id_map="*i64", xn="*bf16",
                                                      s_x="i32", s_o="i32", s_xn="i32", eps="fp32"),
                          dict(V=12288, BV=16384, K=8, MAP=True, CLAMP=True, LOGITS=True, NORM=norm,
                               DM=576 if norm else 1, BDM=1024 if norm else 1, PDL=True), warps=8)
    print(f"vocab_topk logits norm={norm} REG %s STACK %s SHARED %s" % use)
_, use = compile_sm90(ring_commit_fwd_kernel, dict(k_new="*bf16", v_new="*bf16", k_ring="*bf16", v_ring="*bf16",
                                                   slot_pos="*i64", x="*bf16", hid="*bf16", n="*i64", dlen="*i64",
                                                   R="i32", s_kn="i32", s_kr="i32", s_x="i32"),
                      dict(W=512, E=192, H=576, BR=8, BE=256, BH=1024, PDL=True), warps=4)
print("ring_commit REG %s STACK %s SHARED %s" % use)
from ssv.ops.draft_attn.kernels import draft_attn_fwd_kernel, draft_attn_merge_fwd_kernel  # noqa: E402
for rows in (False, True):   # the level's attention (8 frontier nodes' paths), the commit's rows (7)
    _, use = compile_sm90(draft_attn_fwd_kernel, dict(
        q="*bf16", k_ring="*bf16", v_ring="*bf16", ring_pos="*i64", k_scr="*bf16", v_scr="*bf16", path="*i64",
        dlen="*i64", n_real="*i64", ws_m="*fp32", ws_l="*fp32", ws_a="*fp32", level="i32", scale="fp32", s_qn="i32",
        s_qh="i32", s_rk="i32", s_rh="i32", s_sk="i32", s_sh="i32", s_pn="i32"),
        dict(W=512, G=3, BM=16, D=64, BD=64, BK=64, TPS=2, NS=4, DP=7 if rows else 6, BP=16, ROWS=rows, PDL=True),
        warps=4)
    print(f"draft_attn rows={rows} REG %s STACK %s SHARED %s" % use)
_, use = compile_sm90(draft_attn_merge_fwd_kernel, dict(ws_m="*fp32", ws_l="*fp32", ws_a="*fp32", o="*bf16",
                                                       s_on="i32"),
                      dict(HQ=9, BH=16, D=64, BD=64, NS=4, PDL=True), warps=4)
print("draft_attn merge REG %s STACK %s SHARED %s" % use)
