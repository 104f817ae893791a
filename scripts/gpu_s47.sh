#!/usr/bin/env bash
# Session 47's device calls, chained AT ONCE (the machine keeps /tmp only while warm, ~30 s). Packages side by
# side on one machine -- base = ca85724 (session 45's head), prev = 759014f (session 46's head: a7158b8's lazy
# check per KV split, never run on a GPU before), head = the working tree (the draft attention's window split
# over programs, the vocabulary top-k's one-key rounds). Here, once:
#   git archive 759014f ssv | tar -x -C .stage/prev47 --exclude=ssv/data   (base46: see gpu_s46.sh)
#   tar -C .stage -cJf .stage/pk47.tar.xz base46 prev47
#   scripts/train_draft_gpu.sh stage; python3 scripts/make_e2e_prompts.py
#   c:  carry [".whl", ".stage/pk47.tar.xz"]  the draft ops (scripts/probe_draft_ops.py) prev / head; (PROBES=1) the
#       verify launch's variants base / head; the step table base / prev / head; the CUDA tests of the draft attention
#       and the top-k, then the verify tests (cut at TESTS_TIMEOUT)
#   d:  carry [".whl", ".stage/pk47.tar.xz"]  (after c) the draft ops prev / head and head's CUDA tests of them;
#       whole graphed rounds (scripts/probe_round.py) prev / head twice, interleaved; STEPS_WARM=1 the step table base / prev
#   q0, q1, q2, q3: carry [".stage/draft/gguf.partN"] (the tree and a part and the wheels pass the 64 MiB);
#       DRAFT=1: also head's draft ops and the CUDA tests of the draft attention and the top-k
#   ab: carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256", ".stage/draft/gguf.parts",
#       ".stage/e2e-prompts.json"]  `ssv bench e2e` at 4K for WHO (default "prev head"); E2E_MODES as in
#       gpu_pkgs.sh
# SSV_COMMIT names head's commit (no git there).
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH; unpack_pkgs, e2e_pkgs, steps
# what comes back is at most 8 files: everything a call wrote, packed into one at its end
trap 'cd "$OUTD" && ls | grep -v "^call-" | tar -czf "call-${1:-x}.tgz" -T - --remove-files' EXIT
pkg() {  # $1 who -> "package-root commit"
    case $1 in base) echo "/tmp/base46 ca85724" ;; prev) echo "/tmp/prev47 759014f" ;;
    *) echo "$R ${SSV_COMMIT:-head}" ;; esac
}
draft_ops() {  # $1 suffix of the files ('' for none), $2.. who: the draft ops (scripts/probe_draft_ops.py), each package
    local sfx=$1 who pp c; shift
    for who in "$@"; do
        read -r pp c <<< "$(pkg $who)"
        PYTHONPATH=$pp:/tmp/site timeout 90 python3 scripts/probe_draft_ops.py "$OUTD/draft-ops-$who$sfx.json" \
            --tag $who 2>&1 | grep -v -i warn | tee "$OUTD/draft-ops-$who$sfx.txt"
    done
}
draft_tests() {  # $1 suffix of the log: the CUDA tests of the draft attention and the top-k at the working tree
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/ops/test_draft_attn.py tests/ops/test_topk.py 2>&1 \
        | tail -4 | tee "$OUTD/tests-draft-topk-head${1:-}.log"
}
case "${1:?call}" in
c)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    unpack_pkgs .stage/pk47.tar.xz base46 prev47
    draft_ops '' prev head
    [ -n "${PROBES:-}" ] && for who in base head; do
        read -r pp c <<< "$(pkg $who)"
        PYTHONPATH=$pp:/tmp/site PROBE_SHAPE=smollm2-135m PROBE_T=4096 PROBE_N=48 timeout 60 \
            python3 scripts/gpu_probe.py time "naive defaults,exact4 lazy defaults,approx16 lazy" 2>&1 \
            | grep -v -i warn | tee "$OUTD/probe-verify-4k48-$who.txt"
    done
    for who in base prev head; do steps $who steps-$who; done
    draft_tests
    timeout ${TESTS_TIMEOUT:-100} python3 -m pytest -q -p no:cacheprovider tests/ops/test_nsa_kernels.py \
        -k "verify and (default or lazy or edge or item)" 2>&1 | tail -4 | tee "$OUTD/tests-verify-head.log"
    ;;
d)  # after c's compile failure at head: the draft ops prev / head, their CUDA tests at head, whole graphed rounds
    # (random weights, the draft phase included) prev / head interleaved, the step table base / prev once warm
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    unpack_pkgs .stage/pk47.tar.xz base46 prev47
    draft_ops '' prev head
    draft_tests
    for i in ${ROUND_PAIRS:-1 2}; do for who in prev head; do
        read -r pp c <<< "$(pkg $who)"
        PYTHONPATH=$pp:/tmp/site SSV_COMMIT=$c TAG=$who-$i OUT=$OUTD timeout 120 python3 scripts/probe_round.py 2>&1 \
            | grep -v -i warn | tail -4
    done; done
    [ -n "${STEPS_WARM:-}" ] && for who in base prev; do steps $who steps-warm-$who; done
    ;;
q0|q1|q2|q3) bash scripts/train_draft_gpu.sh receive ${1#q} >/dev/null
    if [ -n "${DRAFT:-}" ]; then   # head's draft ops and their CUDA tests, beside a part of the GGUF
        draft_ops -$1 head
        draft_tests -$1
    fi ;;
ab) e2e_pkgs ${WHO:-prev head} ;;
esac
