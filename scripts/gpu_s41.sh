#!/usr/bin/env bash
# Session 41's device calls, chained AT ONCE (the machine keeps /tmp and runs/ only while warm, ~30 s):
# the GGUF in five parts (scripts/train_draft_gpu.sh stage, GGUF_PARTS=5), the corpus's two parts beside
# parts 2 and 3 (the tracked tree is ~43 MB: a GGUF part and a corpus part fit beside it only just).
#   r0: carry [".stage/draft/gguf.part0"]
#   r1: carry [".stage/draft/gguf.part1", ".whl"]   `ssv bench linear --pdl --batch-invariant --rope` on this
#       GPU into a copy of the tile table (session 40 probed linear_rope's first form on an H100 only)
#   r2: carry [".stage/draft/gguf.part2", ".stage/corpus/corpus.part0.jsonl.xz"]
#   r3: carry [".stage/draft/gguf.part3", ".stage/corpus/corpus.part1.jsonl.xz"]
#   rope: carry [".stage/tiles-accee8f.json", ".whl"]   the linear CUDA tests with the H100's re-probed entry
#       (q|k|v + RoPE in one launch), then the Llama-free step table (random weights, 4K) with it and with
#       the table before it (accee8f's, no -rope entries for the H100), A/B
#   t:  carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256", ".stage/draft/gguf.parts", ".whl"]
#       the shipped head fine-tuned with its draft vocabulary chosen anew (--balanced-vocab: the answers
#       to the target's own general questions weigh as much as the other answers and the documents);
#       exit 75 = out of time: send it again. On exit 0 the head comes back in $OUT/head.
# SSV_COMMIT names the commit (no git there).
set -uo pipefail
export PYTHONUNBUFFERED=1
R=$PWD; OUTD=$(mkdir -p "${OUT:-bench/results}" && cd "${OUT:-bench/results}" && pwd)
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$R:/tmp/site
keep_corpus() { mkdir -p /tmp/stage && cp .stage/corpus/*.jsonl.xz /tmp/stage/ 2>/dev/null; ls /tmp/stage; }
case "${1:?call}" in
r0)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    bash scripts/train_draft_gpu.sh receive 0 >/dev/null; ls /tmp/stage
    ;;
r1)
    nvidia-smi --query-gpu=name --format=csv,noheader
    bash scripts/train_draft_gpu.sh receive 1 >/dev/null; ls /tmp/stage
    cp ssv/ops/linear/tiles.json /tmp/tiles-probe.json
    (cd /tmp && timeout ${LINEAR_TIMEOUT:-150} python3 -m ssv bench linear --pdl --batch-invariant --rope \
        --tiles /tmp/tiles-probe.json --out "$OUTD/linear" 2>&1 | grep -v -i warn | tail -30)
    cp /tmp/tiles-probe.json "$OUTD/linear/tiles-probed.json"
    ;;
r2)
    bash scripts/train_draft_gpu.sh receive 2 >/dev/null; keep_corpus
    ;;
r3)
    bash scripts/train_draft_gpu.sh receive 3 >/dev/null; keep_corpus
    ;;
rope)
    nvidia-smi --query-gpu=name --format=csv,noheader
    timeout 75 python3 -m pytest -q -p no:cacheprovider tests/ops/test_linear_rope.py tests/ops/test_linear.py 2>&1 \
        | tail -4 | tee "$OUTD/tests-linear-rope-h100.log"
    rm -rf /tmp/prev && mkdir -p /tmp/prev && cp -r ssv /tmp/prev/ && cp .stage/tiles-accee8f.json /tmp/prev/ssv/ops/linear/tiles.json
    steps() {  # $1 package root, $2 out folder: the step table at 4K, from an empty directory
        mkdir -p /tmp/cwd-$2 && (cd /tmp/cwd-$2 && PYTHONPATH=$1:/tmp/site SSV_COMMIT=${SSV_COMMIT:-head} timeout 100 \
            python3 -m ssv bench e2e --no-default --steps 4096 --out "$OUTD/$2" 2>&1 | grep -v -i warn | tail -12)
    }
    steps "$R" steps-rope; steps /tmp/prev steps-norope
    ;;
t)
    TIME_BUDGET=${TIME_BUDGET:-560} bash scripts/train_draft_gpu.sh finetune-general --draft-vocab 12288 \
        --balanced-vocab --num-prompts 1000 --self-prompts 1500 --corpus-prompts 2000 \
        --max-steps ${MAX_STEPS:-3600} --lr 1.5e-4
    rc=$?
    exit $rc
    ;;
esac
