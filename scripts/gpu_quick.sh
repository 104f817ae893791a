#!/usr/bin/env bash
# A quick GPU check through the device tool: the CUDA tests of the device round and its kernels, then the
# random-weight round table (scripts/repro_draft_capture.py). Carry [".whl"]; argument: the commit.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/ops/test_nsa_plan.py tests/ops/test_commit.py tests/ops/test_route_topk.py tests/engine/test_fallback.py tests/ops/test_engine_kernels.py tests/ops/test_nsa_device_len.py tests/ops/test_glue.py tests/engine/test_device_round.py 2>&1 | tail -25
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/ops/test_nsa_kernels.py -k "route or path or device" 2>&1 | tail -3
SSV_COMMIT=$1 timeout 200 python3 scripts/repro_draft_capture.py 2>&1 | grep -v Warning | tail -12
SSV_COMMIT=$1 timeout 100 python3 scripts/profile_round.py 2>&1 | grep -v Warn | tail -48
