#!/usr/bin/env bash
# Session 46's device calls, chained AT ONCE (the machine keeps /tmp only while warm, ~30 s). Packages side by
# side on one machine -- base = ca85724 (session 45's head), mid = d03e290 (the verify launch's KV splits take
# runs of the work items, split 0 fewer beside the tree's tiles), head = the working tree (f73590c in call b:
# and the group's union and query bits from one OR-reduction over the entry pairs; a7158b8 and after in b2:
# and the lazy softmax's check per KV split), alt = a7158b8 with the items dealt round robin again. Here, once:
#   git archive ca85724 ssv | tar -x -C .stage/base46 --exclude=ssv/data   (likewise d03e290 -> .stage/mid46,
#   a7158b8 -> .stage/alt46, then in .stage/alt46/ssv/ops/nsa/verify_kernels.py both
#   `for it in range(it_lo, it_hi):` -> `for it in range(i_k, n_a + n_w, NSPLIT):`)
#   tar -C .stage -cJf .stage/pk46.tar.xz base46 mid46 alt46
#   scripts/train_draft_gpu.sh stage; python3 scripts/make_e2e_prompts.py
#   b:  carry [".whl", ".stage/pk46.tar.xz"]  (ran, 23:50) the verify launch's variants (scripts/gpu_probe.py)
#       base / mid / head at the default model's 4K / 48; the step table base / mid / head; the launch's phases
#       inside its programs (scripts/verify_timeline.py) mid / head and head at TREE_COST 0 / 2 / 6; the verify
#       tests at head (cut at 150 s)
#   b2: carry [".whl", ".stage/pk46.tar.xz"]  (not run: no machine) base / head / alt: the launch's variants, the
#       step table; TIMELINE=1 head's phases; TESTS=1 the verify tests at head
#   q0, q1, q2, q3: carry [".stage/draft/gguf.partN"] (the tree and a part and the wheels pass the 64 MiB)
#   ab: carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256", ".stage/draft/gguf.parts",
#       ".stage/e2e-prompts.json"]  `ssv bench e2e` at 4K for WHO (default "base head"); E2E_MODES="ar-nsa
#       sd-naive ssv_strict" for a short call ('_' for a space in a mode's name)
# SSV_COMMIT names head's commit (no git there).
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH; unpack_pkgs, e2e_pkgs, steps
# what comes back is at most 8 files: everything a call wrote, packed into one at its end
trap 'cd "$OUTD" && ls | grep -v "^call-" | tar -czf "call-${1:-x}.tgz" -T - --remove-files' EXIT
pkg() {  # $1 who -> "package-root commit"
    case $1 in base) echo "/tmp/base46 ca85724" ;; mid) echo "/tmp/mid46 d03e290" ;; alt) echo "/tmp/alt46 a7158b8-strided" ;;
    *) echo "$R ${SSV_COMMIT:-head}" ;; esac
}
probes() {  # $1 file prefix, $2.. who: the verify launch's variants at the default model's 4K / 48, each package
    local tag=$1 who pp c; shift
    for who in "$@"; do
        read -r pp c <<< "$(pkg $who)"
        echo "== $who"; PYTHONPATH=$pp:/tmp/site PROBE_SHAPE=smollm2-135m PROBE_T=4096 PROBE_N=48 timeout 60 \
            python3 scripts/gpu_probe.py time "naive defaults,exact4 lazy defaults,approx16 lazy" 2>&1 \
            | grep -v -i warn | tee "$OUTD/$tag-verify-4k48-$who.txt"
    done
}
case "${1:?call}" in
b2)  # base against head (a7158b8: the lazy check per KV split) and alt (head with the items dealt round robin
    # over the splits, as before d03e290): the verify launch's variants, the step table, the verify tests at head
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    unpack_pkgs .stage/pk46.tar.xz base46 mid46 alt46
    probes probe2 base head alt
    for who in base head alt; do steps $who steps2-$who; done
    [ -n "${TIMELINE:-}" ] && PROBE_SHAPE=smollm2-135m PROBE_T=4096 PROBE_N=48 timeout 60 python3 \
        scripts/verify_timeline.py "exact4 defaults,naive defaults" 2>&1 | grep -v -i warn \
        | tee "$OUTD/timeline2-4k48-head.txt"
    [ -n "${TESTS:-}" ] && timeout ${TESTS_TIMEOUT:-100} python3 -m pytest -q -p no:cacheprovider \
        tests/ops/test_nsa_kernels.py -k "verify and (default or lazy or edge or item)" 2>&1 | tail -4 \
        | tee "$OUTD/tests2-verify-head.log"
    ;;
b)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    unpack_pkgs .stage/pk46.tar.xz base46 mid46
    probes probe base mid head
    for who in base mid head; do steps $who steps-$who; done
    for who in mid head; do
        read -r pp c <<< "$(pkg $who)"
        PYTHONPATH=$pp:/tmp/site PROBE_SHAPE=smollm2-135m PROBE_T=4096 PROBE_N=48 timeout 90 python3 \
            scripts/verify_timeline.py "exact4 defaults,naive defaults" 2>&1 | grep -v -i warn \
            | tee "$OUTD/timeline-4k48-$who.txt"
    done
    for tc in 0 2 6; do  # head with split 0's tree tiles weighted otherwise (0: an even share beside them)
        TREE_COST=$tc PROBE_SHAPE=smollm2-135m PROBE_T=4096 PROBE_N=48 timeout 60 python3 scripts/verify_timeline.py \
            "exact4 defaults" 2>&1 | grep -v -i warn | tee "$OUTD/timeline-4k48-head-tc$tc.txt"
    done
    timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider tests/ops/test_nsa_kernels.py -k verify 2>&1 | tail -4 \
        | tee "$OUTD/tests-verify-head.log"
    ;;
q0|q1|q2|q3) bash scripts/train_draft_gpu.sh receive ${1#q} >/dev/null ;;
ab)  # `ssv bench e2e` at 4K for each of WHO, each from an empty directory with its own package
    e2e_pkgs ${WHO:-base head}
    ;;
esac
