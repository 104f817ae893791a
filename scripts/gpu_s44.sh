#!/usr/bin/env bash
# Session 44's device calls, chained AT ONCE (the machine keeps /tmp only while warm, ~30 s): three
# packages side by side on one machine -- base = 0829937 (session 43's measured head), mid = d799cdb
# (ee2353f's accept phase in fewer ATen launches + its review, never run on a GPU), gemm = 5385b14 (the
# GEMMs' weights prefetched into L2 before the PDL wait), head = the working tree (and the KV the verify
# and route-score launches read first). Here, once:
#   git archive 0829937 ssv | tar -x -C .stage/base44 --exclude=ssv/data   (likewise d799cdb -> .stage/mid44)
#   (5385b14 -> .stage/gemm44); tar -C .stage -cJf .stage/pk44.tar.xz base44 mid44 gemm44
#   scripts/train_draft_gpu.sh stage; python3 scripts/make_e2e_prompts.py
#   b:  carry [".stage/draft/gguf.part0", ".whl", ".stage/pk44.tar.xz"]  the CUDA tests of the changed
#       kernels at head, then the step table (random weights, 4K) mid / gemm / head, twice
#   q1, q2, q3: carry [".stage/draft/gguf.partN"]
#   ab: carry [".stage/draft/gguf.part4", ".stage/draft/gguf.sha256", ".stage/draft/gguf.parts", ".whl",
#       ".stage/e2e-prompts.json"]  `ssv bench e2e` at 4K for WHO (default "base mid gemm head")
# Next (not run: the budget was spent): 5a5bcf2's cap on the verify window's prefetch, the step table at 8K
# (`STEPS=8192 ... steps`) and `ssv bench e2e --contexts 8192 --modes 'eagle3 dense lookup' ar-nsa 'ssv strict'`
# for 4567695 (staged as a package) beside the head; 90fd755's draft level (66 -> 61 launches) in the 4K e2e
# A/B against 4567695; and why the 48-row GEMMs do not gain (ncu on one
# verify layer's linear launches, with and without the prefetch: scripts/ncu_stalls.py).
# SSV_COMMIT / MID_COMMIT / BASE_COMMIT name the commits (no git there).
source scripts/gpu_pkgs.sh   # R, OUTD, /tmp/site on PYTHONPATH; unpack_pkgs, e2e_pkgs
pkg() {  # $1 who -> "package-root commit"
    case $1 in base) echo "/tmp/base44 ${BASE_COMMIT:-0829937}" ;; mid) echo "/tmp/mid44 ${MID_COMMIT:-d799cdb}" ;;
    gemm) echo "/tmp/gemm44 5385b14" ;;
    *) echo "$R ${SSV_COMMIT:-head}" ;; esac
}
steps() {  # $1 who, $2 out folder: the step table at 4K (random weights), from an empty directory
    read -r pp c <<< "$(pkg $1)"
    mkdir -p /tmp/cwd-$2 && (cd /tmp/cwd-$2 && PYTHONPATH=$pp:/tmp/site SSV_COMMIT=$c timeout 100 \
        python3 -m ssv bench e2e --no-default --steps ${STEPS:-4096} --steps-shape ${STEPS_SHAPE:-smollm2-135m} \
        --out "$OUTD/$2" 2>&1 | grep -v -i warn | tail -12)
}
case "${1:?call}" in
b)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
    bash scripts/train_draft_gpu.sh receive 0 >/dev/null
    unpack_pkgs .stage/pk44.tar.xz base44 mid44 gemm44
    timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider ${TESTS_B:-tests/ops/test_pdl.py \
        tests/ops/test_linear.py tests/ops/test_linear_rope.py tests/ops/test_nsa_kernels.py tests/ops/test_nsa_device_len.py \
        tests/ops/test_route_topk.py tests/engine/test_device_round.py} \
        2>&1 | tail -4 | tee "$OUTD/tests-head.log"
    for rep in ${REPS:-1 2}; do
        for who in mid gemm head; do steps $who steps-$who-$rep; done
    done
    ;;
q1|q2|q3) bash scripts/train_draft_gpu.sh receive ${1#q} >/dev/null ;;
ab)  # `ssv bench e2e` at 4K for each of WHO, each from an empty directory with its own package
    e2e_pkgs ${WHO:-base mid gemm head}
    ;;
esac
