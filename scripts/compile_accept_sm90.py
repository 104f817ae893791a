"""Compile the accept kernels (the greedy walk, the sampled ones) for sm_90 on a machine without a GPU (triton's own ptxas):
that the walk (fp64 reductions, a bitcast) and the bonus launches build for Hopper, with their
registers and spills, before any device time is spent. usage: python scripts/compile_accept_sm90.py"""
from sm90 import compile_sm90

from ssv.ops.accept import kernels as K

CASES = [  # kernel, pointer / int arguments, constexprs, warps
    (K.accept_greedy_fwd_kernel, dict(parents="*i64", tokens="*i64", scores="*fp32", best="*i64", path="*i64",
                                      length="*i64", bonus="*i64", rows="*i64", nxt_tok="*i64"),
     dict(T=57, BT=64, D=9, BD=16, RECORD=True), 1),
    (K.row_mass_fwd_kernel, dict(probs="*fp32", total="*fp64", V="i32", s_p="i32"), dict(BV=8192), 8),
    (K.probs_rows_fwd_kernel, dict(logits="*fp32", inv_t="*fp32", probs="*fp32", total="*fp64", V="i32", s_l="i32",
                                   s_p="i32"), dict(BV=4096), 8),
    (K.accept_sample_fwd_kernel, dict(parents="*i64", tokens="*i64", scores="*fp32", probs="*fp32", total="*fp64",
                                      coins="*fp32", path="*i64", length="*i64", rows="*i64", nxt_tok="*i64",
                                      stop="*i64", s_p="i32", s_c="i32"),
     dict(T=57, BT=64, D=9, BD=16, K=10, BK=16), 1),
    (K.bonus_mass_fwd_kernel, dict(probs="*fp32", stop="*i64", part="*fp64", lastp="*i32", V="i32", s_p="i32"),
     dict(BV=1024), 4),
    (K.bonus_pick_fwd_kernel, dict(probs="*fp32", stop="*i64", coin="*i64", part="*fp64", lastp="*i32",
                                   length="*i64", bonus="*i64", nxt_tok="*i64", V="i32", NC="i32", s_p="i32"),
     dict(BV=1024, NCP=64), 4),
    (K.bonus_mass_fwd_kernel, dict(probs="*fp32", stop="*fp32", part="*fp64", lastp="*i32", V="i32", s_p="i32"),
     dict(BV=1024, STOP=False), 4),
    (K.bonus_pick_fwd_kernel, dict(probs="*fp32", stop="*fp32", coin="*fp32", part="*fp64", lastp="*i32",
                                   length="*i64", bonus="*i64", nxt_tok="*i64", V="i32", NC="i32", s_p="i32"),
     dict(BV=1024, NCP=64, STOP=False), 4),
    (K.logits_mass_fwd_kernel, dict(logits="*fp32", inv_t="*fp32", cmax="*fp32", part="*fp64", V="i32"),
     dict(BV=1024), 4),
    (K.logits_pick_fwd_kernel, dict(logits="*fp32", inv_t="*fp32", coin="*fp32", cmax="*fp32", part="*fp64",
                                    out="*i64", out2="*i64", V="i32", NC="i32"), dict(BV=1024, NCP=64), 4),
]


def main():
    for fn, args, const, warps in CASES:
        cc, (reg, stack, _) = compile_sm90(fn, args, {**const, "PDL": True}, warps)
        print(f"{fn.__name__:28s} warps {warps}  registers {reg}  stack {stack}  sass lines {cc.asm['sass'].count(chr(10)) if 'sass' in cc.asm else '-'}")


if __name__ == "__main__":
    main()
