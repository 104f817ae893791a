#!/usr/bin/env bash
# Session 50's device calls: dense tree verification on its own kernel (ssv/ops/dense) against the NSA verify
# kernel's window form that KernelDensePlan ran before (`ssv.attention_device.DENSE_KERNEL_MIN_N=129` restored it
# at 1ec1663..98ae585, where calls a, q0, ab and b ran; since then the plan runs the dense kernel alone).
#   a: carry [".whl"]  the CUDA tests of the new kernel and the dense kernel round; scripts/probe_dense.py (the
#      attention alone at the Llama and default shapes, then the Llama dense AR step and verify pass)
#   b: carry [".whl"]  the final code's CUDA tests, dense steps and Llama step table
#   q0..q3: q0 also the attention probe again (the split policy's one-wave rule); carry [".stage/draft/gguf.partN"]; ab: carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256",
#      ".stage/draft/gguf.parts", ".stage/e2e-prompts.json"]  `ssv bench e2e` at 4K, old then new then old again;
#      ab2 (same carry): every mode at the final code
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH; e2e's GGUF assembly
trap 'cd "$OUTD" && ls | grep -v "^call-" | tar -czf "call-${1:-x}.tgz" -T - --remove-files' EXIT
e2e_min_n() {  # $1 DENSE_KERNEL_MIN_N, $2 out folder
    mkdir -p /tmp/cwd-$2 && (cd /tmp/cwd-$2 && SSV_COMMIT=${SSV_COMMIT:-head} timeout 200 \
        python3 "$R/scripts/patched.py" ssv.attention_device.DENSE_KERNEL_MIN_N=$1 -- bench e2e \
        --model /tmp/ssv-smollm2.gguf --prompts "$R/.stage/e2e-prompts.json" --contexts ${CONTEXTS:-4096} \
        --families code prose chat --docs 1 --new-tokens 128 --modes ar-nsa "ar dense" "eagle3 dense" \
        "eagle3 dense lookup" --out "$OUTD/$2" 2>&1 | grep -v -i warn | tail -16)
}
case "${1:?call}" in
a)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/ops/test_dense_verify.py \
        "tests/ops/test_engine_kernels.py::test_kernel_round_emits_reference_ar_tokens" \
        "tests/ops/test_engine_kernels.py::test_graph_replay_equals_eager_round" 2>&1 | tail -5 | tee "$OUTD/tests-dense.log"
    timeout 330 python3 scripts/probe_dense.py "$OUTD/probe-dense.json" 2>&1 | grep -v -i warn | tee "$OUTD/probe-dense.txt"
    ;;
b)  # the final code: CUDA tests, the dense steps (window form / kernel without and with prefetch / AR too), the
    # Llama step table in full
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/ops/test_dense_verify.py tests/ops/test_pdl.py 2>&1 \
        | tail -3 | tee "$OUTD/tests-dense-b.log"
    PROBE_ATTENTION= PROBE_STEP_SHAPES="smollm2-135m llama3.1-8b" PROBE_STEP_REPS=2 timeout 240 \
        python3 scripts/probe_dense.py "$OUTD/probe-dense-steps.json" 2>&1 | grep -v -i warn | tee "$OUTD/probe-dense-steps.txt"
    mkdir -p /tmp/cwd-steps && (cd /tmp/cwd-steps && timeout 200 python3 -m ssv bench e2e --no-default \
        --steps 8192 32768 65536 131072 --steps-shape llama3.1-8b --out "$OUTD/steps-llama" 2>&1 | grep -v -i warn | tail -40)
    ;;
q0)  # after the split policy counts the step's-tokens split (one wave): the attention alone again
    bash scripts/train_draft_gpu.sh receive 0 >/dev/null
    PROBE_STEPS= PROBE_SPLITS="None 10 16" timeout 150 python3 scripts/probe_dense.py "$OUTD/probe-dense-2.json" 2>&1 \
        | grep -v -i warn | tee "$OUTD/probe-dense-2.txt"
    ;;
c0)  # the final code (9d4070d): GGUF part 0, the dense steps at both shapes, the Llama step table in full
    bash scripts/train_draft_gpu.sh receive 0 >/dev/null
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    PROBE_ATTENTION= PROBE_STEP_SHAPES="smollm2-135m llama3.1-8b" timeout 150 \
        python3 scripts/probe_dense.py "$OUTD/probe-dense-steps-final.json" 2>&1 | grep -v -i warn | tee "$OUTD/probe-dense-steps-final.txt"
    mkdir -p /tmp/cwd-steps && (cd /tmp/cwd-steps && timeout 200 python3 -m ssv bench e2e --no-default \
        --steps 8192 32768 65536 131072 --steps-shape llama3.1-8b --out "$OUTD/steps-llama-final" 2>&1 | grep -v -i warn | tail -40)
    ;;
wt)  # carry [".whl"]: the final code's CUDA tests of the dense kernel, the kernel rounds, PDL and the launch compiles
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/ops/test_dense_verify.py tests/ops/test_pdl.py \
        tests/ops/test_engine_kernels.py tests/ops/test_nsa_device_len.py 2>&1 | tail -3 | tee "$OUTD/tests-final.log"
    ;;
next)  # for the next session's first call, carry [".whl"]: the final code's (3770cfc) CUDA tests of the dense kernel
    # and the dense kernel rounds (run apart: wt's 200 s did not cover them), then its dense steps (the merge's one tile)
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/ops/test_dense_verify.py \
        "tests/ops/test_engine_kernels.py::test_kernel_round_emits_reference_ar_tokens" \
        "tests/ops/test_engine_kernels.py::test_graph_replay_equals_eager_round" 2>&1 | tail -3 | tee "$OUTD/tests-next.log"
    PROBE_ATTENTION= PROBE_STEP_SHAPES="smollm2-135m llama3.1-8b" PROBE_STEP_REPS=2 timeout 240 \
        python3 scripts/probe_dense.py "$OUTD/probe-dense-steps-next.json" 2>&1 | grep -v -i warn | tee "$OUTD/probe-dense-steps-next.txt"
    ;;
w) ;;   # carry [".whl"] alone (the tree and a GGUF part leave no room for it): gpu_pkgs.sh installs it
q1|q2|q3) bash scripts/train_draft_gpu.sh receive ${1#q} >/dev/null ;;
ab)
    bash scripts/train_draft_gpu.sh receive 4 >/dev/null
    bash scripts/train_draft_gpu.sh assemble || exit 1
    python3 -c "import gguf" 2>/dev/null || { echo "no gguf module: carry .whl on this chain's first call"; exit 2; }
    e2e_min_n 129 e2e-old; e2e_min_n 2 e2e-new; e2e_min_n 129 e2e-old2; e2e_min_n 2 e2e-new2
    ;;
ab2)  # the final code, every mode: 4K (all the issue names), 8K (all but reuse/2 and transformers)
    bash scripts/train_draft_gpu.sh receive 4 >/dev/null
    bash scripts/train_draft_gpu.sh assemble || exit 1
    python3 -c "import gguf" 2>/dev/null || { echo "no gguf module: carry .whl on this chain's first call"; exit 2; }
    ALL=(ar-nsa sd-naive "ssv strict" "ssv strict lookup" "ssv approx C16" "ar dense" "eagle3 dense" "eagle3 dense lookup")
    for c in 4096 8192; do
        extra=(); [ $c = 4096 ] && extra=("ssv approx C16 reuse/2" transformers)
        mkdir -p /tmp/cwd-all-$c && (cd /tmp/cwd-all-$c && SSV_COMMIT=${SSV_COMMIT:-head} timeout 260 python3 -m ssv \
            bench e2e --model /tmp/ssv-smollm2.gguf --prompts "$R/.stage/e2e-prompts.json" --contexts $c --families \
            code prose chat --docs 1 --new-tokens 128 --modes "${ALL[@]}" "${extra[@]}" \
            --out "$OUTD/e2e$c-all" 2>&1 | grep -v -i warn | tail -34)
    done
    ;;
esac
