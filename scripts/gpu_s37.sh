#!/usr/bin/env bash
# Session 37's device calls (no checkpoint needed), chained AT ONCE:
#   call 1: bash scripts/gpu_s37.sh 1   carry [".whl", ".stage/base-route"] (git archive BASE_COMMIT, as
#           scripts/gpu_route_ab.sh says): routing at BASE_COMMIT beside the head (the top-n's tail tile:
#           probe_route.py's "no tail" and warps variants), then the Llama-8B step table at STEPS (64K) for
#           the base and the head, each from an empty directory (`ssv bench e2e --no-default --steps`)
#   call 2: bash scripts/gpu_s37.sh 2   carry [".whl"]: the routing CUDA tests in full
#   call 3: bash scripts/gpu_s37.sh 3   carry [".whl", ".stage/base-route"]: see below
# BASE_COMMIT / SSV_COMMIT name them. Results: $OUT/probe-route-*.json, $OUT/steps-{base,head}/, logs.
set -uo pipefail
export PYTHONUNBUFFERED=1
R=$PWD; OUTD=$(mkdir -p "${OUT:-bench/results}" && cd "${OUT:-bench/results}" && pwd)
case "${1:?call number}" in
1)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    NO_TESTS=1 CASES="${CASES:-0 6 2}" bash scripts/gpu_route_ab.sh 2>&1 | grep -v "^package" | cut -c1-200
    for who in base head; do
        pp=$R; c=${SSV_COMMIT:-head}; [ $who = base ] && { pp=$R/.stage/base-route; c=${BASE_COMMIT:-base}; }
        mkdir -p /tmp/steps-cwd-$who
        (cd /tmp/steps-cwd-$who && PYTHONPATH=$pp:/tmp/site SSV_COMMIT=$c timeout ${STEPS_TIMEOUT:-170} python3 -m ssv \
            bench e2e --no-default --steps ${STEPS:-65536} --out "$OUTD/steps-$who" 2>&1 | grep -v -i warn | tail -14)
    done
    ;;
2)
    ROUNDS=0 TESTS_TIMEOUT=${TESTS_TIMEOUT:-540} bash scripts/gpu_route_ab.sh 2>&1 | tail -6
    ;;
3)  # after the importance sweep's compile fix (6d05a3c), carry [".whl", ".stage/base-route"]: the head's step
    # table at STEPS (ar-nsa at 64K compiles again), one routing A/B round over the AR and verify-pass cases,
    # then the routing CUDA tests with the call's remaining time
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    mkdir -p /tmp/steps-cwd-head
    (cd /tmp/steps-cwd-head && PYTHONPATH=$R:/tmp/site SSV_COMMIT=${SSV_COMMIT:-head} timeout ${STEPS_TIMEOUT:-200} \
        python3 -m ssv bench e2e --no-default --steps ${STEPS:-65536 131072} --out "$OUTD/steps-head" 2>&1 \
        | grep -v -i warn | tail -22)
    ROUNDS=1 NO_TESTS=1 CASES="${CASES:-0 15 16 6 17}" bash scripts/gpu_route_ab.sh 2>&1 | grep -v "^package" | cut -c1-200
    # the two-sweep routing tests first (call 2 failed 4 of them), then the device-length and top-n files
    PYTHONPATH=$R:/tmp/site timeout ${TESTS_TIMEOUT:-280} python3 -m pytest -q -p no:cacheprovider \
        tests/ops/test_nsa_kernels.py -k "sweeps or twin or device_len or route_topk" tests/ops/test_nsa_device_len.py tests/ops/test_route_topk.py \
        2>&1 | tail -6 | tee "$OUTD/tests-route-${SSV_COMMIT:-head}.log"
    ;;
esac
