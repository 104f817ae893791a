#!/usr/bin/env bash
# Session 39's device calls, chained AT ONCE (the machine keeps /tmp and runs/ only while warm): the GGUF
# arrives in five parts (scripts/train_draft_gpu.sh stage with GGUF_PARTS=5) and the corpus in two
# (python -m ssv.draft.corpus), while the first calls do work that needs no checkpoint.
#   r0: carry [".stage/draft/gguf.part0", ".stage/corpus/corpus.part0.jsonl.xz", ".whl"]
#       the Llama-8B step table at 64K and 128K (#12's verify <= 1.2x ar-nsa, on whatever card came)
#   r1: carry [".stage/draft/gguf.part1", ".stage/corpus/corpus.part1.jsonl.xz"]
#       the step table at 64K again beside a copy whose approximate verify launches at 8 warps (its
#       spills at 4: scripts/compile_verify_warps.py)
#   r2: carry [".stage/draft/gguf.part2"]   the one-warp scan reproducer (scripts/repro_scan_one_warp.py)
#   r3: carry [".stage/draft/gguf.part3"]
#   t:  carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256", ".whl", ".stage/e2e-prompts.json"]
#       the shipped head fine-tuned longer on more chat (self-prompts and corpus prompts); exit 75 = out
#       of time: send it again. On exit 0, `ssv bench spec` on CUDA for the new head and the shipped one.
# SSV_COMMIT names the commit (no git there).
set -uo pipefail
export PYTHONUNBUFFERED=1
R=$PWD; OUTD=$(mkdir -p "${OUT:-bench/results}" && cd "${OUT:-bench/results}" && pwd)
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$R:/tmp/site
steps() {  # $1 package root, $2 out folder, rest: contexts; from an empty directory so that $1 is the package run
    local pp=$1 out=$2; shift 2
    mkdir -p /tmp/cwd-$(basename "$out")
    (cd /tmp/cwd-$(basename "$out") && PYTHONPATH=$pp:/tmp/site SSV_COMMIT=${SSV_COMMIT:-head} timeout ${STEPS_TIMEOUT:-240} \
        python3 -m ssv bench e2e --no-default --steps "$@" --out "$OUTD/$out" 2>&1 | grep -v -i warn | tail -22)
}
case "${1:?call}" in
r0)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    bash scripts/train_draft_gpu.sh receive 0 >/dev/null
    steps "$R" steps-head 65536 131072
    ;;
r1)
    nvidia-smi --query-gpu=name --format=csv,noheader
    bash scripts/train_draft_gpu.sh receive 1 >/dev/null
    rm -rf /tmp/w8 && mkdir -p /tmp/w8 && cp -r ssv /tmp/w8/
    python3 - <<'P'
p = "/tmp/w8/ssv/ops/nsa/verify_policy.py"
s = open(p).read()
a = "num_warps=8 if not approx and bm * d >= 8192 else 4"
assert a in s, "launch_config changed"
open(p, "w").write(s.replace(a, "num_warps=8 if (approx and bm >= 64) or bm * d >= 8192 else 4"))
P
    steps /tmp/w8 steps-approx8 65536
    steps "$R" steps-head-2 65536
    ;;
r2)
    bash scripts/train_draft_gpu.sh receive 2 >/dev/null
    timeout 200 python3 scripts/repro_scan_one_warp.py 2>&1 | grep -v -i warn | tail -20 | tee "$OUTD/repro-scan.txt"
    ;;
r3)
    bash scripts/train_draft_gpu.sh receive 3
    ;;
t)
    TIME_BUDGET=${TIME_BUDGET:-560} bash scripts/train_draft_gpu.sh finetune-general --draft-vocab 12288 \
        --num-prompts 1000 --self-prompts 1500 --corpus-prompts 2000 --max-steps ${MAX_STEPS:-3600} --lr 1.5e-4
    rc=$?
    [ $rc -ne 0 ] && exit $rc
    for who in new shipped; do
        d=runs/draft/head; [ $who = shipped ] && d=ssv/data/eagle3-smollm2
        HEAD_DIR=$d SSV_COMMIT=${SSV_COMMIT:-head} timeout ${SPEC_TIMEOUT:-120} bash scripts/train_draft_gpu.sh spec --device cuda \
            --prompts .stage/e2e-prompts.json --contexts 4096 --docs 1 --new-tokens 128 --modes 'ssv strict' \
            --out "$OUTD/spec-$who" 2>&1 | grep -v -i warn | tail -8
    done
    ;;
esac
