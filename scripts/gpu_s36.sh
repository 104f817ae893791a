#!/usr/bin/env bash
# Session 36's one device call (no checkpoint needed): routing at BASE_COMMIT beside the head
# (scripts/gpu_route_ab.sh without its tests), then the round's kernels greedy and sampled at
# temperature 0.7 (scripts/profile_round.py, random weights: launches per round and round time of the
# sampled round, which no file had), then the routing CUDA tests, cut by the call's time if need be.
# carry [".whl", ".stage/base-route"]; BASE_COMMIT / SSV_COMMIT name them.
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
NO_TESTS=1 CASES="${CASES:-0 6 2}" bash scripts/gpu_route_ab.sh 2>&1 | grep -v "^package" | cut -c1-150
export PYTHONPATH=$PWD:/tmp/site
for t in 0.7 0; do
    TEMP=$t ROUNDS=20 MODES="ar-nsa,sd-naive,ssv strict" timeout 120 python3 scripts/profile_round.py 2>&1 | grep "^==" 
done
ROUNDS=0 TESTS_TIMEOUT=${TESTS_TIMEOUT:-200} bash scripts/gpu_route_ab.sh 2>&1 | tail -4   # its tests only
