#!/usr/bin/env bash
# Session 42's device calls, chained AT ONCE (the machine keeps /tmp only while warm, ~30 s): session 41's
# two GPU-facing changes (the new head, the H100's q|k|v + RoPE tile entry) end to end beside accee8f,
# session 40's last commit, which carries session 39's head and no H100 RoPE entry.
# Here, once: git archive accee8f ssv | tar -x -C .stage/base42 --exclude=ssv/data/eagle3-smollm2/model.safetensors
#             and session 39's head weights as .stage/base42/oldhead.safetensors.xz (17 MB: xz fits it beside
#             the 44 MB tree, a GGUF part does not).
#   a:  carry [".stage/tiles-accee8f.json", ".whl", ".stage/draft/gguf.part0"]  the linear / RoPE CUDA tests, then
#       the step table (random weights, 4K) with HEAD's tiles and with accee8f's, A/B/A
#   p1: carry [".stage/draft/gguf.part1", ".whl"]  (TESTS=1: the engine / model / head CUDA tests at HEAD)
#   p2, p3: carry [".stage/draft/gguf.part2"] / [".stage/draft/gguf.part3"]
#   h:  carry [".stage/base42"]  the base package and session 39's head into /tmp/base42
#   ab: carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256", ".stage/draft/gguf.parts", ".whl",
#       ".stage/e2e-prompts.json"]  `ssv bench e2e` at 4K, base then HEAD, one machine
# The draft level's A/B these calls were to run (its second machine was never lent in session 42) ran in
# session 43 as scripts/gpu_s43.sh, with the next commit beside it.
# SSV_COMMIT / BASE_COMMIT name the commits (no git there).
set -uo pipefail
export PYTHONUNBUFFERED=1
R=$PWD; OUTD=$(mkdir -p "${OUT:-bench/results}" && cd "${OUT:-bench/results}" && pwd)
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$R:/tmp/site
steps() {  # $1 package root, $2 out folder: the step table at 4K, from an empty directory
    mkdir -p /tmp/cwd-$2 && (cd /tmp/cwd-$2 && PYTHONPATH=$1:/tmp/site SSV_COMMIT=${3:-head} timeout 100 \
        python3 -m ssv bench e2e --no-default --steps 4096 --steps-shape ${STEPS_SHAPE:-smollm2-135m} --out "$OUTD/$2" 2>&1 | grep -v -i warn | tail -12)
}
e2e_ab() {  # $1 base package, $2 its commit, $3 out prefix, $4 the call that staged the base, then the modes:
    # `ssv bench e2e` at 4K, base then head, each from an empty directory (its own package imported)
    local base=$1 bc=$2 prefix=$3 stager=$4; shift 4
    bash scripts/train_draft_gpu.sh receive 4 >/dev/null
    bash scripts/train_draft_gpu.sh assemble || exit 1
    [ -d $base/ssv ] || { echo "no $base: send $stager first"; exit 2; }
    for who in base head; do
        pp=$R c=${SSV_COMMIT:-head}; [ $who = base ] && { pp=$base; c=$bc; }
        mkdir -p /tmp/cwd-$prefix-$who
        (cd /tmp/cwd-$prefix-$who && PYTHONPATH=$pp:/tmp/site python3 -c "import ssv; print('package', ssv.__file__)" && \
         PYTHONPATH=$pp:/tmp/site SSV_COMMIT=$c timeout ${E2E_TIMEOUT:-270} \
            python3 -m ssv bench e2e --model /tmp/ssv-smollm2.gguf --prompts "$R/.stage/e2e-prompts.json" \
            --contexts ${CONTEXTS:-4096} --families code prose chat --docs 1 --new-tokens 128 \
            --modes "$@" --out "$OUTD/$prefix-$who" 2>&1 | grep -v -i warn | tail -30)
    done
}
case "${1:?call}" in
a)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    bash scripts/train_draft_gpu.sh receive 0 >/dev/null
    timeout 90 python3 -m pytest -q -p no:cacheprovider tests/ops/test_linear_rope.py tests/ops/test_linear.py 2>&1 \
        | tail -4 | tee "$OUTD/tests-linear-rope.log"
    rm -rf /tmp/prev && mkdir -p /tmp/prev && cp -r ssv /tmp/prev/ && cp .stage/tiles-accee8f.json /tmp/prev/ssv/ops/linear/tiles.json
    steps "$R" steps-head-1 ${SSV_COMMIT:-head}; steps /tmp/prev steps-tiles-accee8f "${SSV_COMMIT:-head}+accee8f-tiles"
    steps "$R" steps-head-2 ${SSV_COMMIT:-head}
    ;;
p1)
    bash scripts/train_draft_gpu.sh receive 1 >/dev/null
    [ -n "${TESTS:-}" ] && timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider tests/engine \
        tests/test_model.py tests/ops/test_engine_kernels.py tests/draft/test_cuda.py 2>&1 | tail -8 \
        | tee "$OUTD/tests-engine.log"
    ;;
p2) bash scripts/train_draft_gpu.sh receive 2 >/dev/null ;;
p3) bash scripts/train_draft_gpu.sh receive 3 >/dev/null ;;
h)
    rm -rf /tmp/base42 && cp -r .stage/base42 /tmp/base42
    xz -d -c /tmp/base42/oldhead.safetensors.xz > /tmp/base42/ssv/data/eagle3-smollm2/model.safetensors
    rm /tmp/base42/oldhead.safetensors.xz; sha256sum /tmp/base42/ssv/data/eagle3-smollm2/model.safetensors; ls /tmp/stage
    ;;
ab)
    e2e_ab /tmp/base42 ${BASE_COMMIT:-accee8f} e2e h ar-nsa sd-naive "ssv strict" "ssv strict lookup" "ar dense" \
        "eagle3 dense lookup"
    ;;
esac
