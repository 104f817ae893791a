#!/usr/bin/env bash
# Session 43's device calls, chained AT ONCE (the machine keeps /tmp only while warm, ~30 s): three
# packages side by side on one machine -- base = 97f0ccf (before the draft level's launches),
# mid = 38a458d (session 42's head: the draft level in fewer launches, never run on a GPU), head = the
# working tree (the drafter's ring commit in one launch). Here, once:
#   git archive 97f0ccf ssv | tar -x -C .stage/base43 --exclude=ssv/data   (likewise 38a458d -> .stage/mid43)
#   tar -C .stage -cJf .stage/pk43.tar.xz base43 mid43   (0.2 MB: the tree and a GGUF part leave ~1 MiB)
#   scripts/train_draft_gpu.sh stage; python3 scripts/make_e2e_prompts.py
#   b:  carry [".stage/draft/gguf.part0", ".whl", ".stage/pk43.tar.xz"]  the CUDA tests of the
#       changed ops and the device round at head, then scripts/profile_round.py (random weights, 4K)
#       base / mid / head
#   q1, q2, q3: carry [".stage/draft/gguf.partN"]
#   ab: carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256", ".stage/draft/gguf.parts", ".whl",
#       ".stage/e2e-prompts.json"]  `ssv bench e2e` at 4K for WHO (default "base mid"), then ab with
#       WHO=head in the next call
# Next (ee2353f, not yet run on a GPU): stage 0829937 as .stage/mid43 (and pk43.tar.xz anew), then b, q1..q3 and
#   ab with WHO="mid head" MID_COMMIT=0829937.
# SSV_COMMIT / MID_COMMIT / BASE_COMMIT name the commits (no git there).
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH; unpack_pkgs, e2e_pkgs
pkg() {  # $1 who -> "package-root commit"
    case $1 in base) echo "/tmp/base43 ${BASE_COMMIT:-97f0ccf}" ;; mid) echo "/tmp/mid43 ${MID_COMMIT:-38a458d}" ;;
    *) echo "$R ${SSV_COMMIT:-head}" ;; esac
}
case "${1:?call}" in
b)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    bash scripts/train_draft_gpu.sh receive 0 >/dev/null
    unpack_pkgs .stage/pk43.tar.xz base43 mid43
    timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider ${TESTS_B:-tests/ops/test_ring_commit.py \
        tests/ops/test_topk.py tests/ops/test_glue.py tests/ops/test_draft_fused.py tests/ops/test_engine_kernels.py \
        tests/draft/test_cuda.py tests/engine/test_device_round.py} 2>&1 | tail -4 | tee "$OUTD/tests-head.log"
    for rep in ${REPS:-1}; do
        for who in base mid head; do
            read -r pp c <<< "$(pkg $who)"
            mkdir -p "$OUTD/profile-$who-$rep"
            (cd $pp && SSV_COMMIT=$c OUT="$OUTD/profile-$who-$rep" MODES="ssv strict,sd-naive" ROUNDS=50 timeout 100 \
                python3 "$R/scripts/profile_round.py" 2>&1 | grep "==")
        done
    done
    ;;
q1|q2|q3) bash scripts/train_draft_gpu.sh receive ${1#q} >/dev/null ;;
ab)  # `ssv bench e2e` at 4K for each of WHO, each from an empty directory with its own package
    e2e_pkgs ${WHO:-base mid}
    ;;
esac
