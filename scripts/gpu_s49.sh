#!/usr/bin/env bash
# Session 49's device calls: the verify launch's folded merge with its splits' states gathered in chunks
# (head) against main's serial gather (base49 = main's code at 6021345, staged here once:
#   git archive <base> ssv | tar -x -C .stage/base49 --exclude=ssv/data; tar -C .stage -cJf .stage/pk49.tar.xz base49)
#   f: carry [".whl", ".stage/pk49.tar.xz"]  step tables (random weights; the default model at 4K, then the Llama
#      shape at 64K) of base49 and head, each at the policy's FOLD_MAX_SPLITS (2: the combine launch past 2
#      splits) and at 32 (every split launch folded), interleaved; the folded merge's CUDA tests at head
#   q0, q1, q2, q3: carry [".stage/draft/gguf.partN"] (q0 on a fresh machine: ".whl" too, which ab has no room
#       for; session 49's ab failed on it); ab: carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256",
#       ".stage/draft/gguf.parts", ".stage/e2e-prompts.json"]  `ssv bench e2e` at 4K for WHO (default "base49 head")
# SSV_COMMIT names the working tree's commit, BASE_COMMIT base49's (no git there).
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH; unpack_pkgs, e2e_pkgs, steps
pkg() {  # $1 who -> "package-root commit"
    case $1 in base49) echo "/tmp/base49 ${BASE_COMMIT:-base49}" ;; *) echo "$R ${SSV_COMMIT:-head}" ;; esac
}
trap 'cd "$OUTD" && ls | grep -v "^call-" | tar -czf "call-${1:-x}.tgz" -T - --remove-files' EXIT
FOLD32=ssv.ops.nsa.verify_policy.FOLD_MAX_SPLITS=32
case "${1:?call}" in
f)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    unpack_pkgs .stage/pk49.tar.xz base49
    for i in 1 2; do
        for who in base49 head; do
            PATCH= steps $who steps-$who-$i
            PATCH=$FOLD32 steps $who steps-$who-fold32-$i
        done
    done
    for who in base49 head; do
        STEPS=65536 STEPS_SHAPE=llama3.1-8b PATCH= steps $who steps64k-$who
        STEPS=65536 STEPS_SHAPE=llama3.1-8b PATCH=$FOLD32 steps $who steps64k-$who-fold32
    done
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/ops/test_nsa_kernels.py -k "folded_merge or fold2 or fold3" \
        2>&1 | tail -4 | tee "$OUTD/tests-fold-head.log"
    ;;
q0|q1|q2|q3) bash scripts/train_draft_gpu.sh receive ${1#q} >/dev/null ;;
ab) e2e_pkgs ${WHO:-base49 head} ;;
esac
