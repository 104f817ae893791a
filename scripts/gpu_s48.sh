#!/usr/bin/env bash
# Session 48's device calls (after gpu_s47.sh's d, q0..q3 and ab ran at 7cb2b62: bench/results/gpu-s48/).
#   e: no carry needed  the verify launch's prologue bound (scripts/probe_verify_prologue.py: the default model
#      at 4K / 48 and Llama's shape at 64K / 64), its phases (scripts/verify_timeline.py at 4K / 48), the draft
#      ops at the working tree, the tree finish under ncu (scripts/ncu_tree_finish.py), the CUDA tests of the
#      draft attention, the top-k and the tree
# SSV_COMMIT names the working tree's commit (no git there).
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH
trap 'cd "$OUTD" && ls | grep -v "^call-" | tar -czf "call-${1:-x}.tgz" -T - --remove-files' EXIT
case "${1:?call}" in
e)  # the most wanted first: a call may be cut
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    SSV_COMMIT=${SSV_COMMIT:-head} timeout 150 python3 scripts/probe_verify_prologue.py "$OUTD/verify-prologue.json" 2>&1 \
        | grep -v -i warn | tee "$OUTD/verify-prologue.txt"
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/ops/test_draft_attn.py tests/ops/test_topk.py \
        tests/ops/test_tree.py 2>&1 | tail -4 | tee "$OUTD/tests-draft-topk-tree-head.log"
    PROBE_SHAPE=smollm2-135m PROBE_T=4096 PROBE_N=48 timeout 60 python3 scripts/verify_timeline.py \
        "exact4 defaults,naive defaults" 2>&1 | grep -v -i warn | tee "$OUTD/timeline-4k48-head.txt"
    # the tree finish under Nsight Compute: its stall samples by SASS line (the second launch)
    timeout 90 ncu --clock-control none --set full -k regex:tree_finish -s 1 -c 1 -o /tmp/tf -f \
        python3 scripts/ncu_tree_finish.py > /tmp/ncu.log 2>&1; tail -2 /tmp/ncu.log
    ncu -i /tmp/tf.ncu-rep > "$OUTD/ncu-tree-finish.txt" 2>&1
    grep -E "Duration|Registers Per|Achieved Occ|Warp Cycles Per Issued|Executed Ipc A" "$OUTD/ncu-tree-finish.txt"
    ncu -i /tmp/tf.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>&1
    python3 scripts/ncu_stalls.py /tmp/src.csv > "$OUTD/ncu-tree-finish-stalls.txt" 2>&1
    head -40 "$OUTD/ncu-tree-finish-stalls.txt"
    timeout 90 python3 scripts/probe_draft_ops.py "$OUTD/draft-ops-head.json" --tag head 2>&1 | grep -v -i warn \
        | tee "$OUTD/draft-ops-head.txt"
    ;;
esac
