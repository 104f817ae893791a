#!/usr/bin/env bash
# One device call (nvidia-h200-x2) that decides the launch defaults: the kernel tests on GPU 0 while
# GPU 1 runs the probe's variants of this version (key split, folded merge, window pass) beside the
# last defaults, on the Llama shape, then a shorter list on the other two shapes.
# Carry .whl; set SSV_COMMIT. Files in $OUT: kernel-tests.log, probe-*.txt.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site SSV_COMMIT=${SSV_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,temperature.gpu --format=csv
LLAMA="naive,naive lazy,naive split2,naive lazy kw,naive lazy kw split2 fold,exact4,exact4 lazy,exact4 lazy split3,\
exact4 lazy defaults,exact4 lazy kw,exact4 lazy kw split3,exact4 lazy kw s2,exact4 lazy kw s4,exact4 lazy fold,\
exact4 lazy fold split3,exact4 lazy fold split4,exact4 lazy kw fold,exact4 lazy kw fold split3,\
exact4 lazy kw fold split4,exact4 lazy wg16,exact4 lazy wg8,exact4 lazy kw wg16,exact4 online wg16,\
exact2 lazy wg16,exact8 lazy,exact8 lazy split4,exact8 lazy fold,exact8 lazy wg16,exact16 lazy fold s8 w8,\
approx4,approx4 fold,approx4 lazy kw,approx4 lazy kw fold,approx16,block-major plan only,exact4 block-major plan reused"
OTHER="naive lazy,naive lazy kw,exact4 lazy defaults,exact4 lazy kw,exact4 lazy fold split3,exact4 lazy kw fold split3,\
exact4 lazy wg16,exact4 lazy kw wg16,exact8 lazy wg16,approx4,approx4 lazy kw fold"
( CUDA_VISIBLE_DEVICES=0 timeout "${TEST_S:-480}" python3 -m pytest tests/ops -n 8 -q -p no:cacheprovider -rs \
    > "$OUT/kernel-tests.log" 2>&1; echo "pytest exit $?" >> "$OUT/kernel-tests.log" ) &
export CUDA_VISIBLE_DEVICES=1
timeout "${PROBE_S:-330}" python3 scripts/gpu_probe.py time "$LLAMA" > "$OUT/probe-llama.txt" 2>&1
cat "$OUT/probe-llama.txt"
for s in nsa-1b smollm2-135m; do
    PROBE_SHAPE=$s timeout 90 python3 scripts/gpu_probe.py time "$OTHER" > "$OUT/probe-$s.txt" 2>&1
    cat "$OUT/probe-$s.txt"
done
wait
tail -8 "$OUT/kernel-tests.log"
