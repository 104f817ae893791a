#!/usr/bin/env bash
# Session 54's device calls. Chained calls AT ONCE (the machine keeps /tmp only while warm, ~30 s), with bench/results
# moved out of the tree for the chain (the tree, a GGUF part and the wheels pass the 64 MiB otherwise). Here, once:
#   git archive a2b7136 ssv | tar -x -C .stage/prev54 --exclude=ssv/data; tar -C .stage -cJf .stage/pk54.tar.xz prev54
#   scripts/train_draft_gpu.sh stage; python3 scripts/make_e2e_prompts.py
#   a:  carry [".whl"]  the accept probe (both walks, both row-mass tiles) and the sampled accept's tests compiled
#   q0: carry [".stage/draft/gguf.part0", ".whl"]  a's tests while the GGUF's parts arrive
#   q1, q2, q3: carry [".stage/draft/gguf.partN"]; q1 also the Llama step table at 64K (#12) unless NO_STEPS=1
#   ab: carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256", ".stage/draft/gguf.parts",
#       ".stage/e2e-prompts.json", ".stage/pk54.tar.xz", ".whl"]  `ssv bench e2e` at 4K, sampled (temperature 0.7),
#       prev = a2b7136 (code f1e7d54, session 53's final) and head, one machine (WHO, E2E_MODES, E2E_FAMILIES)
# SSV_COMMIT names head's commit (no git there).
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH; unpack_pkgs, e2e_pkgs, steps, receive_part
trap 'cd "$OUTD" && ls | grep -v "^call-" | tar -czf "call-${1:-x}.tgz" -T - --remove-files' EXIT
pkg() {  # $1 who -> "package-root commit"
    case $1 in prev) echo "/tmp/prev54 a2b7136" ;; *) echo "$R ${SSV_COMMIT:-head}" ;; esac
}
accept_cuda() {
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUTD/gpu.txt"
    SSV_COMMIT=${SSV_COMMIT:-head} timeout 90 python3 scripts/probe_accept_sampled.py "$OUTD/accept-sampled.json" 2>&1 \
        | grep -v -i warn | tee "$OUTD/accept-sampled.txt"
    timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -rs tests/ops/test_accept_sample.py \
        tests/engine/test_prepare.py 2>&1 | tail -4 | tee "$OUTD/tests-accept-cuda.log"
    timeout ${CUDA_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -rs -m cuda tests/ops/test_engine_kernels.py \
        2>&1 | tail -4 | tee "$OUTD/tests-engine-kernels-cuda.log"
}
case "${1:?call}" in
a) accept_cuda ;;
l0)   # (branch s54-ar-logits) part 0, then sample_logits_row's tests compiled and its row in the probe
    bash scripts/train_draft_gpu.sh receive 0 >/dev/null
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUTD/gpu.txt"
    timeout 120 python3 -m pytest -q -p no:cacheprovider -rs \
        tests/ops/test_accept_sample.py -k "logits_row or from_logits" \
        tests/engine/test_prepare.py 2>&1 | tail -3 | tee "$OUTD/tests-logits-row-cuda.log"
    SSV_COMMIT=${SSV_COMMIT:-head} timeout 60 python3 scripts/probe_accept_sampled.py "$OUTD/accept-sampled.json" 2>&1 \
        | grep -v -i warn | grep "AR token" | tee "$OUTD/accept-sampled.txt"
    ;;
q0) bash scripts/train_draft_gpu.sh receive 0 >/dev/null; accept_cuda ;;
q1|q2|q3) receive_part ${1#q} ;;
ab)
    unpack_pkgs .stage/pk54.tar.xz prev54
    E2E_TIMEOUT=${E2E_TIMEOUT:-150} E2E_EXTRA=${E2E_EXTRA:---temperature 0.7} e2e_pkgs ${WHO:-prev head}
    ;;
esac
