#!/usr/bin/env bash
# Session 40's device calls, chained AT ONCE (the machine keeps /tmp only while warm). tiles.json had
# tuned small-M linear tiles for the H200 alone, so on an H100 every decode GEMM ran on cuBLAS with a
# SwiGLU launch after gate|up. These calls measure the H100's own table:
#   a:  carry [".stage/draft/gguf.part0", ".whl"]
#       the default model's step table (random weights) at 4K / 8K with the table as it is; then
#       scripts/probe_linear.py --pdl --batch-invariant writing the H100 entry into /tmp/s40/tiles.json
#       (also returned in $OUT); then the step table again with it, and the first table again (A/B/A)
#   r1: carry [".stage/draft/gguf.part1"]   the linear / glue CUDA tests with the new table
#   r2: carry [".stage/draft/gguf.part2"]   r3: carry [".stage/draft/gguf.part3"]
#   e:  carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256", ".whl", ".stage/e2e-prompts.json"]
#       `ssv bench e2e` on the default model, the table as it is then the new one, back to back
# SSV_COMMIT names the commit (no git there).
set -uo pipefail
export PYTHONUNBUFFERED=1
R=$PWD; OUTD=$(mkdir -p "${OUT:-bench/results}" && cd "${OUT:-bench/results}" && pwd)
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$R:/tmp/site
copy_with_tiles() {  # $1 folder: the package and tests with /tmp/s40/tiles.json as the table
    rm -rf "$1" && mkdir -p "$1" && cp -r ssv tests pyproject.toml "$1"/ && cp /tmp/s40/tiles.json "$1/ssv/ops/linear/tiles.json"
}
steps() {  # $1 package root, $2 out folder, rest: contexts; from an empty directory so that $1 is the package run
    local pp=$1 out=$2; shift 2
    mkdir -p /tmp/cwd-$(basename "$out")
    (cd /tmp/cwd-$(basename "$out") && PYTHONPATH=$pp:/tmp/site SSV_COMMIT=${SSV_COMMIT:-head} timeout ${STEPS_TIMEOUT:-150} \
        python3 -m ssv bench e2e --no-default --steps-shape smollm2-135m --steps "$@" --out "$OUTD/$out" 2>&1 | grep -v -i warn | tail -14)
}
case "${1:?call}" in
a)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    bash scripts/train_draft_gpu.sh receive 0 >/dev/null
    steps "$R" steps-base-1 4096 8192
    mkdir -p /tmp/s40 && cp ssv/ops/linear/tiles.json /tmp/s40/tiles.json
    SSV_COMMIT=${SSV_COMMIT:-head} timeout ${PROBE_TIMEOUT:-300} python3 scripts/probe_linear.py "$OUTD/probe-linear-h100.json" \
        --pdl --batch-invariant --tiles /tmp/s40/tiles.json 2>&1 | grep -v -i warn | tail -24
    cp /tmp/s40/tiles.json "$OUTD/tiles.json"
    copy_with_tiles /tmp/t1
    steps /tmp/t1 steps-tiles-1 4096 8192
    steps "$R" steps-base-2 4096 8192
    ;;
r1)
    bash scripts/train_draft_gpu.sh receive 1 >/dev/null
    copy_with_tiles /tmp/t1
    (cd /tmp/t1 && timeout 200 python3 -m pytest -q -p no:cacheprovider tests/ops/test_linear.py tests/ops/test_glue.py \
        2>&1 | tail -6 | tee "$OUTD/tests-linear-h100.log")
    ;;
r2)
    bash scripts/train_draft_gpu.sh receive 2 >/dev/null
    ;;
r3)
    bash scripts/train_draft_gpu.sh receive 3 >/dev/null
    ;;
e)
    bash scripts/train_draft_gpu.sh receive 4 >/dev/null
    bash scripts/train_draft_gpu.sh assemble || exit 1
    copy_with_tiles /tmp/t1
    modes=(ar-nsa sd-naive "ssv strict" "ssv strict lookup" "ar dense" "eagle3 dense lookup")
    for who in base tiles; do
        pp=$R; [ $who = tiles ] && pp=/tmp/t1
        mkdir -p /tmp/cwd-e2e-$who
        (cd /tmp/cwd-e2e-$who && PYTHONPATH=$pp:/tmp/site SSV_COMMIT=${SSV_COMMIT:-head} timeout ${E2E_TIMEOUT:-250} \
            python3 -m ssv bench e2e --model /tmp/ssv-smollm2.gguf --prompts "$R/.stage/e2e-prompts.json" \
            --contexts ${CONTEXTS:-4096} --families code prose chat --docs 1 --new-tokens 128 \
            --modes "${modes[@]}" \
            --out "$OUTD/e2e-$who" 2>&1 | grep -v -i warn | tail -30)
    done
    ;;
rope)  # carry [".whl"]: the q|k|v projection with RoPE and the cache writes in one launch (linear_rope):
       # its CUDA tests, the probe with --rope writing /tmp/s40/tiles.json (a copy of the shipped table), then
       # the step table without and with the new entries (A/B/A)
    nvidia-smi --query-gpu=name --format=csv,noheader
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/ops/test_linear_rope.py tests/ops/test_linear.py 2>&1 \
        | tail -4 | tee "$OUTD/tests-linear-rope.log"
    mkdir -p /tmp/s40 && cp ssv/ops/linear/tiles.json /tmp/s40/tiles.json
    SSV_COMMIT=${SSV_COMMIT:-head} timeout ${PROBE_TIMEOUT:-240} python3 scripts/probe_linear.py "$OUTD/probe-linear-rope.json" \
        --pdl --batch-invariant --rope --tiles /tmp/s40/tiles.json 2>&1 | grep -v -i warn | grep -i "rope\|qkv" | tail -12
    cp /tmp/s40/tiles.json "$OUTD/tiles.json"
    copy_with_tiles /tmp/t1
    STEPS_TIMEOUT=100 steps "$R" steps-norope-1 4096 8192
    STEPS_TIMEOUT=100 steps /tmp/t1 steps-rope-1 4096 8192
    STEPS_TIMEOUT=100 steps "$R" steps-norope-2 4096 8192
    ;;
esac
