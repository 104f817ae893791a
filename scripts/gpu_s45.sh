#!/usr/bin/env bash
# Session 45's device calls, chained AT ONCE (the machine keeps /tmp only while warm, ~30 s): three
# packages side by side on one machine -- base = 4567695 (session 44's measured head), mid = 0f1839d
# (session 44's unmeasured commits: 90fd755's draft level in 5 launches fewer, 5a5bcf2's cap on the verify
# window's prefetch, cfc82f8, the review), head = the working tree (the greedy argmax in Triton, the wide
# taps written by the down projections' launches, the cache rows by the plan's launch). Here, once:
#   git archive 4567695 ssv | tar -x -C .stage/base45 --exclude=ssv/data   (likewise 0f1839d -> .stage/mid45)
#   tar -C .stage -cJf .stage/pk45.tar.xz base45 mid45
#   scripts/train_draft_gpu.sh stage; python3 scripts/make_e2e_prompts.py
#   b:  carry [".stage/draft/gguf.part0", ".whl", ".stage/pk45.tar.xz"]  the CUDA tests of the changed code
#       at head; the step table (random weights, 4K) mid / head, and head with the verify launch's KV splits
#       capped at 4 / 6 / 8 (scripts/patched.py); head's round kernels without PDL (each kernel's own
#       time); the verify launch's variants at the default model's 4K / 48
#   q1, q2, q3: carry [".stage/draft/gguf.partN"]
#   ab: carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256", ".stage/draft/gguf.parts", ".whl",
#       ".stage/e2e-prompts.json"]  `ssv bench e2e` at 4K for WHO (default "base mid head")
#   c8: (no carry beyond ab's) the same at 8K for base and head, three modes; the step table at 8K
#   t:  (the H100, after) the tree finish's rank launch (b9de61c, reverted: no gain)
# Next (not run): the verify launch at the default model's 4K / 48 (13.9 us of a ~43 us strict layer, a latency
# chain: `ncu-verify-4k48.txt`; 1,578 of its 4,080 SASS instructions before the first K/V tile, the union each of
# ~11 split programs rebuilds: scripts/verify_sass_regions.py) with the work list built once; the draft attention's window
# and the vocabulary top-k's rows over more programs; the tree finish's stage 2; the whole CUDA test suite in one
# go on a GPU machine (two forced-fused CPU-tensor cases failed there this session).
# SSV_COMMIT names head's commit (no git there).
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH; unpack_pkgs, e2e_pkgs, steps
pkg() {  # $1 who -> "package-root commit"
    case $1 in base) echo "/tmp/base45 4567695" ;; mid) echo "/tmp/mid45 0f1839d" ;;
    *) echo "$R ${SSV_COMMIT:-head}" ;; esac
}
case "${1:?call}" in
b)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    bash scripts/train_draft_gpu.sh receive 0 >/dev/null
    unpack_pkgs .stage/pk45.tar.xz base45 mid45
    timeout ${TESTS_TIMEOUT:-180} python3 -m pytest -q -p no:cacheprovider ${TESTS_B:-tests/ops/test_topk.py \
        tests/ops/test_nsa_plan.py tests/ops/test_engine_kernels.py tests/engine/test_device_round.py \
        tests/ops/test_linear.py tests/test_model.py -k "argmax or plan or graph or round or out2 or wide_taps or cuda"} \
        2>&1 | tail -4 | tee "$OUTD/tests-head.log"
    for who in mid head; do steps $who steps-$who; done
    for sp in 4 6 8; do PATCH=ssv.ops.nsa.verify_policy.MAX_SPLITS=$sp steps head steps-head-split$sp; done
    mkdir -p "$OUTD/profile-nopdl"
    OUT="$OUTD/profile-nopdl" PDL=0 MODES="ar-nsa,sd-naive,ssv strict" timeout 120 python3 scripts/profile_round.py \
        2>&1 | grep -v -i warn | tail -40
    PROBE_SHAPE=smollm2-135m PROBE_T=4096 PROBE_N=48 timeout 120 python3 scripts/gpu_probe.py time \
        "naive defaults,exact4 lazy defaults,exact4 lazy,exact4 lazy split3,exact4 lazy fold,exact4 lazy fold split4,exact2,exact8 lazy,approx16 lazy" \
        2>&1 | grep -v -i warn | tee "$OUTD/probe-verify-4k48.txt"
    ;;
q1|q2|q3) bash scripts/train_draft_gpu.sh receive ${1#q} >/dev/null ;;
ab)  # `ssv bench e2e` at 4K for each of WHO, each from an empty directory with its own package
    e2e_pkgs ${WHO:-base mid head}
    ;;
c8)  # 8K: the e2e of base and head (the GGUF assembled by ab), then their step tables
    for who in ${WHO8:-base head}; do
        read -r pp c <<< "$(pkg $who)"
        mkdir -p /tmp/cwd8-$who
        (cd /tmp/cwd8-$who && PYTHONPATH=$pp:/tmp/site SSV_COMMIT=$c timeout 200 \
            python3 -m ssv bench e2e --model /tmp/ssv-smollm2.gguf --prompts "$R/.stage/e2e-prompts.json" \
            --contexts 8192 --families code prose chat --docs 1 --new-tokens 128 \
            --modes ar-nsa "ssv strict" "eagle3 dense lookup" --out "$OUTD/e2e8k-$who" 2>&1 | grep -v -i warn | tail -14)
    done
    for who in base head; do STEPS=8192 steps $who steps8k-$who; done
    ;;
t)  # the tree finish's rank launch (b9de61c): carry [".whl", ".stage/pk45b.tar.xz"] (prev = d7cf2bb): its
    # CUDA tests, strict's graphed round (PDL on, random weights, 4K) prev / head / prev / head, head's kernels
    # without PDL, and the finish's launch forms against the tensor ops (scripts/probe_round_ops.py)
    unpack_pkgs .stage/pk45b.tar.xz prev45
    timeout 90 python3 -m pytest -q -p no:cacheprovider tests/ops/test_tree.py 2>&1 | tail -2 | tee "$OUTD/tests-tree.log"
    for rep in 1 2; do
        for who in prev head; do
            if [ $who = prev ]; then pp=/tmp/prev45 c=d7cf2bb; else pp=$R c=${SSV_COMMIT:-head}; fi
            mkdir -p /tmp/cwd-t$who$rep "$OUTD/round-$who-$rep"
            (cd /tmp/cwd-t$who$rep && PYTHONPATH=$pp:/tmp/site SSV_COMMIT=$c OUT="$OUTD/round-$who-$rep" \
                MODES="ssv strict" ROUNDS=40 timeout 100 python3 "$R/scripts/profile_round.py" 2>&1 | grep "== ")
        done
    done
    OUT="$OUTD" PDL=0 MODES="ssv strict" timeout 100 python3 scripts/profile_round.py 2>&1 | grep -E "== |tree_"
    timeout 100 python3 scripts/probe_round_ops.py "$OUTD/round-ops.json" --reps 20 --trials 10 2>&1 | grep -i -E "finish|wrote" | head
    ;;
esac
