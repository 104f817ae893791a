#!/usr/bin/env bash
# Session 56's device calls (branch s54-ar-logits: the AR step's sampled token from its logits). Chained calls AT
# ONCE (the machine keeps /tmp only while warm, ~30 s), with bench/results moved out of the tree for the chain.
# Here, once:
#   git archive main ssv | tar -x -C .stage/prev56 --exclude=ssv/data; tar -C .stage -cJf .stage/pk56.tar.xz prev56
#   scripts/train_draft_gpu.sh stage; python3 scripts/make_e2e_prompts.py
#   l0: carry [".stage/draft/gguf.part0", ".whl"]  sample_logits_row's tests compiled, the AR token's probe rows
#   q1: carry [".stage/draft/gguf.part1"]  and, with PROF=1, the 64K Llama step's kernel profile (#12 on an H200)
#   q2, q3: carry [".stage/draft/gguf.partN"]
#   t: carry [".whl"]  the engine's CUDA tests of the AR step from its logits (l0's first run timed out before them);
#      on an H200 with PROF=1 also the 64K Llama step's kernel profile (#12)
#   ab: carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256", ".stage/draft/gguf.parts",
#       ".stage/e2e-prompts.json", ".stage/pk56.tar.xz", ".whl"]  `ssv bench e2e` at 4K, sampled (temperature 0.7),
#       prev = main (ea1ff4a; GPU code = 02f0be2) and head, one machine (WHO, E2E_MODES, E2E_FAMILIES)
# SSV_COMMIT names head's commit (no git there).
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH; unpack_pkgs, e2e_pkgs, steps, receive_part
trap 'cd "$OUTD" && ls | grep -v "^call-" | tar -czf "call-${1:-x}.tgz" -T - --remove-files' EXIT
pkg() {  # $1 who -> "package-root commit"
    case $1 in prev) echo "/tmp/prev56 ea1ff4a" ;; *) echo "$R ${SSV_COMMIT:-head}" ;; esac
}
case "${1:?call}" in
l0)   # part 0, then sample_logits_row's tests compiled and its row in the probe
    bash scripts/train_draft_gpu.sh receive 0 >/dev/null
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUTD/gpu.txt"
    timeout 400 python3 -m pytest -q -p no:cacheprovider -rs \
        tests/ops/test_accept_sample.py tests/engine/test_prepare.py \
        2>&1 | tail -3 | tee "$OUTD/tests-accept-cuda.log"
    SSV_COMMIT=${SSV_COMMIT:-head} timeout 60 python3 scripts/probe_accept_sampled.py "$OUTD/accept-sampled.json" 2>&1 \
        | grep -v -i warn | tee "$OUTD/accept-sampled.txt"
    ;;
q1) NO_STEPS=1 receive_part 1
    [ -z "${PROF:-}" ] || OUT=$OUTD CTX=65536 STEPS="ar-nsa,ssv strict,sd-naive" SSV_COMMIT=${SSV_COMMIT:-head} \
        timeout 200 python3 scripts/profile_steps.py 2>&1 | grep -v -i warn | tail -60 | tee "$OUTD/profile-64k.txt"
    ;;
q2|q3) receive_part ${1#q} ;;
t)    # the engine's CUDA tests that l0's first run (150 s) did not reach: the sampled AR step from its logits
    timeout 450 python3 -m pytest -q -p no:cacheprovider -rs tests/engine/test_prepare.py \
        -k "ar_step_equals_the_twin or evicted" \
        2>&1 | tail -3 | tee "$OUTD/tests-engine-cuda.log"
    # and on an H200 with PROF=1, #12's 64K step profile (no GGUF: random Llama-shape weights)
    nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUTD/gpu.txt" | grep -q H200 && [ -n "${PROF:-}" ] && \
        OUT=$OUTD CTX=65536 STEPS="ar-nsa,ssv strict,sd-naive" SSV_COMMIT=${SSV_COMMIT:-head} timeout 200 \
        python3 scripts/profile_steps.py 2>&1 | grep -v -i warn | tail -60 | tee "$OUTD/profile-64k.txt"
    ;;
ab)
    unpack_pkgs .stage/pk56.tar.xz prev56
    E2E_TIMEOUT=${E2E_TIMEOUT:-150} E2E_EXTRA=${E2E_EXTRA:---temperature 0.7} e2e_pkgs ${WHO:-prev head}
    ;;
esac
