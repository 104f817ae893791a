#!/usr/bin/env bash
# One device call of a kernel session on a 2-GPU machine (device kind nvidia-h200-x2). Send the same
# call again, chained (the machine warm, state in /tmp/ssv-session), until the log says the matrix is
# complete; each call stops itself after BUDGET seconds (default 540) and copies what it has to $OUT.
#   first, once: a smoke test of the default launch on GPU 0 (a broken default stops the call in
#          seconds, not after the matrix's minutes)
#   GPU 0: the kernel tests (once), the launch-variant probe (once, PROBE_VARIANTS), the real-routing
#          traces (once all four GGUF parts have arrived), strict/sd-naive against ar on the default
#          model with the shipped head (`ssv bench spec`, once, after the traces), then matrix cases
#   GPU 1: cases of the matrix from the start (timings are CUDA-graph replays, and no launch is
#          autotuned by default, so compiles beside them cost only compile time)
# The two processes share the matrix (`ssv bench kernels --claims`), each writing its own kernels.json;
# `ssv bench kernels --merge` joins them here afterwards.
# Carry .whl and one GGUF part per call (.stage/draft/gguf.part0, then part1, part2, then part3 with
# gguf.sha256; parts made by `scripts/train_draft_gpu.sh stage`). Set SSV_COMMIT (no git there).
# MATRIX (default axes), SHAPES (default all) pass through to the benchmark.
set -uo pipefail
export PYTHONUNBUFFERED=1
S=/tmp/ssv-session
mkdir -p "$S" /tmp/stage
END=$((SECONDS + ${BUDGET:-540}))
left() { local l=$((END - SECONDS)); echo $((l > 1 ? l : 1)); }

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
export SSV_COMMIT=${SSV_COMMIT:-unknown}
for f in .stage/draft/gguf.part*; do [ -f "$f" ] && cp "$f" /tmp/stage/; done
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,temperature.gpu --format=csv
rm -rf "$S/claims"  # a case cut off by the last call's time limit is claimable again
if [ ! -f "$S/smoke.done" ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest tests/ops/test_nsa_kernels.py -q -p no:cacheprovider \
        -k "occupancy or (matches_reference and case3-gated-dtype0-default)" || { echo "smoke test failed"; exit 3; }
    touch "$S/smoke.done"
fi

bench() {  # $1: this process's folder, $2: the other's
    timeout "$(left)" python3 -c "import sys; from ssv.cli import main; sys.exit(main())" bench kernels \
        --resume --matrix "${MATRIX:-axes}" --shapes ${SHAPES:-llama3.1-8b nsa-1b smollm2-135m} \
        --claims "$S/claims" --skip-cases-in "$2/kernels.json" --out "$1"
    echo "bench exit $?"
}

gpu0() {
    export CUDA_VISIBLE_DEVICES=0
    if [ ! -f "$S/tests.done" ]; then
        timeout "$(left)" python3 -m pytest tests/ops -n 8 -q -p no:cacheprovider -rs > "$S/kernel-tests.log" 2>&1
        echo "pytest exit $?" >> "$S/kernel-tests.log"
        tail -4 "$S/kernel-tests.log"
        touch "$S/tests.done"
    fi
    if [ ! -f "$S/probe.done" ]; then
        timeout "$(left)" python3 scripts/gpu_probe.py time ${PROBE_VARIANTS:+"$PROBE_VARIANTS"} > "$S/probe.txt" 2>&1 \
            && touch "$S/probe.done"
        cat "$S/probe.txt"
    fi
    if [ ! -f "$S/traces.done" ] && [ -f /tmp/stage/gguf.part0 ] && [ -f /tmp/stage/gguf.part1 ] \
        && [ -f /tmp/stage/gguf.part2 ] && [ -f /tmp/stage/gguf.part3 ]; then
        mkdir -p "$S/traces"
        OUT="$S/traces" timeout "$(left)" bash scripts/gpu_traces.sh > "$S/traces.log" 2>&1 && touch "$S/traces.done"
        tail -40 "$S/traces.log"
    fi
    if [ -f "$S/traces.done" ] && [ ! -f "$S/spec.done" ]; then
        mkdir -p "$S/spec"
        HEAD_DIR=ssv/data/eagle3-smollm2 OUT="$S/spec" timeout "$(left)" bash scripts/train_draft_gpu.sh spec \
            --modes "ssv strict" sd-naive > "$S/spec.log" 2>&1 && touch "$S/spec.done"
        tail -30 "$S/spec.log"
    fi
    bench "$S/bench0" "$S/bench1"
}

gpu1() {
    export CUDA_VISIBLE_DEVICES=1
    bench "$S/bench1" "$S/bench0"
}

gpu0 > "$S/gpu0.log" 2>&1 &
gpu1 > "$S/gpu1.log" 2>&1 &
wait
for g in 0 1; do echo "== GPU $g"; grep -v "^\s*$" "$S/gpu$g.log" | tail -30; done
mkdir -p "${OUT:-/tmp/out}"
(cd "$S" && find . -type f ! -name "*.pt" ! -path "./claims/*" -size -15M -exec cp --parents {} "${OUT:-/tmp/out}/" \;)
