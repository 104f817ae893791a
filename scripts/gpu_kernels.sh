#!/usr/bin/env bash
# On the lent H200 (device tool): kernel tests compiled for real, then the kernel benchmark.
# usage: bash scripts/gpu_kernels.sh [bench args...]   (carry .whl for flash-linear-attention)
set -uo pipefail
export PYTHONUNBUFFERED=1
if ls .whl/fla_core-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/fla_core-*.whl .whl/flash_linear_attention-*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export SSV_COMMIT=${SSV_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0))"
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest ${TEST_PATHS:-tests/ops} -q -x -p no:cacheprovider -k "${TEST_FILTER:-not float16}" 2>&1 | tee ${OUT:-/tmp}/kernel-tests.log | tail -15
fi
[ -n "${SKIP_BENCH:-}" ] && exit 0
python3 -c "import sys; from ssv.cli import main; sys.exit(main())" bench kernels --out ${OUT:-bench/results} "$@"
