#!/usr/bin/env bash
# Routing (#12) on the GPU in one device call: the routing CUDA tests, probe_route.py (every case, each
# form), then Nsight Compute over the policy's launches at Llama 64K / 64 (the whole report, and the
# SASS lines with the most stall samples of each kernel). SSV_COMMIT names the commit; files in $OUT.
#   carry [".whl"]: python3 -m pip install ... --target /tmp/site .whl/*.whl first (gpu_e2e.sh does)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
OUTD=${OUT:-bench/results}
c=${SSV_COMMIT:-head}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
[ -n "${NO_TESTS:-}" ] || timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider tests/ops/test_nsa_device_len.py \
    tests/ops/test_nsa_kernels.py -k "route" 2>&1 | tail -4 | tee "$OUTD/tests-route-$c.log"
[ -n "${NO_PROBE:-}" ] || timeout ${PROBE_TIMEOUT:-300} python3 scripts/probe_route.py "$OUTD/probe-route-$c.json" ${PROBE_ARGS:-} 2>&1 | tail -70
[ -n "${NO_NCU:-}" ] || {
    timeout 240 ncu --clock-control none --set full --import-source yes -k regex:nsa_route -c ${NCU_KERNELS:-3} \
        -o /tmp/route -f python3 scripts/sweep_route.py /tmp/unused.json --ncu --case ${CASE:-0} > /tmp/ncu.log 2>&1; tail -3 /tmp/ncu.log
    ncu -i /tmp/route.ncu-rep > "$OUTD/ncu-route-$c.txt" 2>&1
    grep -E "^  [a-z_]+|Duration|Registers Per|Achieved Occ|Theoretical Occ|Warp Cycles Per Issued|Waves Per" "$OUTD/ncu-route-$c.txt"
    ncu -i /tmp/route.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>&1
    python3 scripts/ncu_stalls.py /tmp/src.csv > "$OUTD/ncu-route-stalls-$c.txt" 2>&1; head -80 "$OUTD/ncu-route-stalls-$c.txt"
}
