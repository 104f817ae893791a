#!/usr/bin/env bash
# Session 57's device call.
#   t: carry [".whl"]  the engine's CUDA tests that session 56 wrote and could not run (the sampled AR step from its
#      logits against its twin, graphed and eager; the evicted buckets' graphs captured again); on an H200 also
#      #12's numbers on the issue's own machine: where the Llama 64K step's kernel time goes
#      (scripts/profile_steps.py, PDL off) and `ssv bench kernels` at Llama 64K / 64
# SSV_COMMIT names the commit (no git there).
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH
trap 'cd "$OUTD" && ls | grep -v "^call-" | tar -czf "call-${1:-x}.tgz" -T - --remove-files' EXIT
export SSV_COMMIT=${SSV_COMMIT:-head}
case "${1:?call}" in
t)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUTD/gpu.txt"
    timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/engine/test_prepare.py \
        -k "ar_step_equals_the_twin or evicted" 2>&1 | tail -4 | tee "$OUTD/tests-engine-cuda.log"
    grep -q H200 "$OUTD/gpu.txt" || exit 0
    OUT=$OUTD CTX=65536 STEPS="ar-nsa,ssv strict,sd-naive" timeout 150 python3 scripts/profile_steps.py 2>&1 \
        | grep -v -i warn | tail -40 | tee "$OUTD/profile-64k.txt"
    timeout 100 python3 -m ssv bench kernels --shapes llama3.1-8b --contexts 65536 --trees 64 --matrix cross \
        --out "$OUTD/kernels-64k" 2>&1 | grep -v -i warn | tail -30
    ;;
esac
