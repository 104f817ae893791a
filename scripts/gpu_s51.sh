#!/usr/bin/env bash
# Session 51's device calls.
#   a: carry [".whl"]  the dense kernel's CUDA tests at the final code of session 50 (its one-tile merge never
#      ran on a GPU); where a Llama-shape step's kernel time goes at 64K (scripts/profile_steps.py: ar-nsa,
#      ssv strict, sd-naive, verify dense; PDL off); `ssv bench kernels` at Llama 64K / 64 (#12's case)
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH; e2e's GGUF assembly
trap 'cd "$OUTD" && ls | grep -v "^call-" | tar -czf "call-${1:-x}.tgz" -T - --remove-files' EXIT
export SSV_COMMIT=${SSV_COMMIT:-head}
case "${1:?call}" in
a)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/ops/test_dense_verify.py tests/ops/test_pdl.py 2>&1 \
        | tail -3 | tee "$OUTD/tests-dense.log"
    OUT=$OUTD CTX=65536 timeout 130 python3 scripts/profile_steps.py 2>&1 | grep -v -i warn | tee "$OUTD/profile-steps-64k.txt"
    # #12's kernel matrix at its case (Llama 64K / 64): the exact grouping's ratio and the dense verify row
    timeout 90 python3 -m ssv bench kernels --shapes llama3.1-8b --contexts 65536 --trees 64 --matrix cross \
        --out "$OUTD/kernels-64k" 2>&1 | grep -v -i warn | tail -30
    ;;
esac
