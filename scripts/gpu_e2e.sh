#!/usr/bin/env bash
# The `ssv bench e2e` session through the device tool (one H200), in four chained calls: the 98 MB
# GGUF travels in four parts (scripts/train_draft_gpu.sh stage makes them and the wheels), so each
# call does work that needs no checkpoint while the parts arrive.
#   here, once:   scripts/train_draft_gpu.sh stage && python3 scripts/make_e2e_prompts.py
#   call 1:  bash scripts/gpu_e2e.sh 1   carry [".stage/draft/gguf.part0", ".whl"]
#            the CUDA tests of the device round (graph replay vs eager, kernels), then the step table
#   call 2 (AT ONCE):  bash scripts/gpu_e2e.sh 2   carry [".stage/draft/gguf.part1", ".whl"]
#            more of the step table if call 1 ran out of time, else the kernel tests
#   call 2b (AT ONCE): bash scripts/gpu_e2e.sh 2   carry [".stage/draft/gguf.part2", ".whl"] (SKIP2=1: nothing else)
#   call 3 (AT ONCE):  bash scripts/gpu_e2e.sh 3   carry [".stage/draft/gguf.part3", ".stage/draft/gguf.sha256",
#            ".stage/e2e-prompts.json", ".whl"]: the default model's e2e table
#   or call 3 as `planner` (carry .stage/planner-prompts.json instead): `ssv bench planner`
#   or the last call as `ab` (a base package beside the head, .stage/base, 0.9 MB): with the tracked tree at
#            ~41 MB a quarter of the GGUF, the prompts and the base no longer fit 64 MiB; stage five parts
#            (GGUF_PARTS=5 scripts/train_draft_gpu.sh stage, ~19.7 MB each) and chain one more call
# SSV_COMMIT names the commit (no git there). Results: $OUT/e2e-cuda.json, e2e-cuda.png, logs.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site
mkdir -p /tmp/stage /tmp/e2e
for f in .stage/draft/gguf.part*; do [ -f "$f" ] && cp "$f" /tmp/stage/; done
OUTD=${OUT:-bench/results}
cp /tmp/e2e/* "$OUTD"/ 2>/dev/null || true   # earlier calls' results travel on
case "${1:?call number}" in
1)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
    timeout 300 python3 -m pytest -q -p no:cacheprovider ${TESTS1:-tests/ops/test_engine_kernels.py tests/ops/test_nsa_device_len.py \
        tests/ops/test_glue.py tests/ops/test_route_topk.py tests/engine/test_fallback.py} 2>&1 | tee "$OUTD/e2e-tests-h200.log" | tail -25
    [ -n "${PROBE_PREFILL:-}" ] && OUT="$OUTD" timeout 200 python3 scripts/probe_prefill.py $PROBE_PREFILL 2>&1 | tail -12
    [ -n "${PROBE_DENSE:-}" ] && timeout 150 python3 scripts/probe_dense.py "$OUTD/probe-dense-$SSV_COMMIT.json" 2>&1 | tail -40
    [ -n "${NO_STEPS:-}" ] || timeout ${STEPS_TIMEOUT:-240} python3 -m ssv bench e2e --no-default --steps ${STEPS:-8192 65536 131072} --out "$OUTD" 2>&1 | tail -40
    ;;
2)
    [ -n "${SKIP2:-}" ] && exit 0
    timeout 500 python3 -m pytest -q -p no:cacheprovider -x tests/ops/test_nsa_kernels.py -k "route or device or path" \
        2>&1 | tail -5
    ;;
3)
    bash scripts/train_draft_gpu.sh assemble
    timeout 560 python3 -m ssv bench e2e --model /tmp/ssv-smollm2.gguf --prompts .stage/e2e-prompts.json \
        --contexts ${CONTEXTS:-4096 1024 8192 2048} --families ${FAMILIES:-code prose chat} --docs 1 \
        --new-tokens ${NEW_TOKENS:-128} --out "$OUTD" "${@:2}" 2>&1 | tail -60
    ;;
ab)  # e2e at HEAD beside a base package, back to back on one machine (base first), one JSON each in
    # $OUT/ab-base, $OUT/ab-head; here: git archive BASE ssv | tar -x -C .stage/base --exclude=ssv/data
    # (the head's ssv/data is linked in), carry .stage/base too; BASE_COMMIT / SSV_COMMIT name them
    # each run from an empty directory: `python3 -m` puts the working directory first on sys.path, so
    # from the repository's root the head's package would shadow the base's (session 33's first A/Bs
    # ran the head twice)
    bash scripts/train_draft_gpu.sh assemble
    ln -sfn "$PWD/ssv/data" .stage/base/ssv/data
    root=$PWD; outa=$(mkdir -p "$OUTD" && cd "$OUTD" && pwd)
    for who in base head; do
        pp=$root; c=${SSV_COMMIT:-?}; [ $who = base ] && { pp=$root/.stage/base; c=${BASE_COMMIT:-base}; }
        mkdir -p /tmp/ab-cwd-$who
        (cd /tmp/ab-cwd-$who && PYTHONPATH=$pp:/tmp/site SSV_COMMIT=$c timeout ${AB_TIMEOUT:-280} python3 -c \
            "import ssv, sys; print('package', ssv.__file__, file=sys.stderr)" && \
         PYTHONPATH=$pp:/tmp/site SSV_COMMIT=$c timeout ${AB_TIMEOUT:-280} python3 -m ssv bench e2e \
            --model /tmp/ssv-smollm2.gguf --prompts "$root/.stage/e2e-prompts.json" --contexts ${CONTEXTS:-4096} \
            --families ${FAMILIES:-code prose chat} --docs 1 --new-tokens ${NEW_TOKENS:-128} --out "$outa/ab-$who" \
            "${@:2}" 2>&1 | tail -16)
    done
    ;;
spec)  # `ssv bench spec` on the graphed CUDA round in place of (or after) call 3: MAL by family and
      # depth; arguments after `spec` go to it (e.g. --lookup 8 --modes "ssv strict" "ssv strict lookup 8")
    bash scripts/train_draft_gpu.sh assemble
    timeout ${SPEC_TIMEOUT:-560} python3 -m ssv bench spec --model /tmp/ssv-smollm2.gguf --device cuda --device-round \
        --prompts .stage/e2e-prompts.json --out "$OUTD/spec" "${@:2}" 2>&1 | tail -40
    ;;
cli)  # `ssv generate --device cuda` as a user runs it, --mode ar then --mode ssv, each a fresh process:
     # first with an empty Triton cache (a fresh machine), then again (the cache warm). The prose
     # document's first 14,000 characters; JSON per run in $OUT/cli/ (setup_seconds: compiles + capture)
    bash scripts/train_draft_gpu.sh assemble
    python3 -c "import json; open('/tmp/cli-prompt.txt', 'w').write(json.load(open('.stage/e2e-prompts.json'))['prose'][0][:14000])"
    mkdir -p "$OUTD/cli"
    export TRITON_CACHE_DIR=$(mktemp -d)
    for run in cold second; do
        for mode in ar ssv; do
            timeout 200 python3 -m ssv generate --model /tmp/ssv-smollm2.gguf --device cuda --prompt-file /tmp/cli-prompt.txt \
                --max-new-tokens 128 --mode $mode --json > "$OUTD/cli/$run-$mode.json" 2>"$OUTD/cli/$run-$mode.log"
            python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stats']; print(sys.argv[1], {k: s.get(k) for k in ('prefill_seconds','setup_seconds','decode_seconds','tokens_per_second','mean_accepted_length')})" "$OUTD/cli/$run-$mode.json"
        done
    done
    ;;
planner)  # `ssv bench planner` (carry .stage/planner-prompts.json: scripts/make_e2e_prompts.py --docs 4
          # --out .stage/planner-prompts.json) after calls 1 and 2, in place of call 3
    bash scripts/train_draft_gpu.sh assemble
    [ -n "${PLANNER_TESTS:-}" ] && timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_bench_planner.py 2>&1 | tail -3
    timeout ${PLANNER_TIMEOUT:-560} python3 -m ssv bench planner --model /tmp/ssv-smollm2.gguf \
        --prompts .stage/planner-prompts.json --out "$OUTD" "${@:2}" 2>"$OUTD/planner-cuda.log" | tail -30
    tail -3 "$OUTD/planner-cuda.log"
    ;;
esac
cp "$OUTD"/e2e-cuda.json "$OUTD"/e2e-cuda.png "$OUTD"/e2e-tests-h200.log /tmp/e2e/ 2>/dev/null || true
