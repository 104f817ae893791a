#!/usr/bin/env bash
# Session 53's device calls. Chained calls AT ONCE (the machine keeps /tmp only while warm, ~30 s), with bench/results
# moved out of the tree for the chain (the tree, a GGUF part and the wheels pass the 64 MiB otherwise).
#   t:  carry [".whl"]  the CUDA tests of the sampling parameters as device scalars (bf1788d, 26c2494: one graph set
#       serves every setting), then the engine's and the model's CUDA tests
# SSV_COMMIT names head's commit (no git there).
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH; unpack_pkgs, e2e_pkgs, steps
trap 'cd "$OUTD" && ls | grep -v "^call-" | tar -czf "call-${1:-x}.tgz" -T - --remove-files' EXIT
case "${1:?call}" in
t)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider -rs tests/engine/test_prepare.py \
        tests/spec/test_accept.py tests/ops/test_accept_sample.py -k "cuda or device_sampling or sampl" 2>&1 \
        | tail -6 | tee "$OUTD/tests-sampling-cuda.log"
    timeout ${CUDA_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -rs -m cuda tests/engine tests/ops/test_engine_kernels.py \
        tests/test_model.py tests/test_cli.py 2>&1 | tail -8 | tee "$OUTD/tests-engine-cuda.log"
    ;;
esac
