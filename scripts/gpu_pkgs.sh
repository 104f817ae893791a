# Sourced by the session scripts that run several packages side by side on one machine (gpu_s43.sh,
# gpu_s44.sh, gpu_s45.sh, gpu_s46.sh): the setup every call of theirs needs, staged packages unpacked, `ssv
# bench e2e` over packages, and a package's step table. The caller defines pkg WHO -> "package-root commit"
# (the working tree for any WHO it does not stage).
set -uo pipefail
export PYTHONUNBUFFERED=1
R=$PWD; OUTD=$(mkdir -p "${OUT:-bench/results}" && cd "${OUT:-bench/results}" && pwd)
[ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$R:/tmp/site

unpack_pkgs() {  # $1 a staged .tar.xz of package folders, $2.. their names: each unpacked under /tmp (what
    # was there first removed) with the working tree's ssv/data linked in (a staged package leaves it out)
    local tarball=$1 w; shift
    for w in "$@"; do rm -rf /tmp/$w; done
    tar -C /tmp -xJf "$tarball" || exit 2
    for w in "$@"; do ln -sfn "$R/ssv/data" /tmp/$w/ssv/data; done
}

e2e_pkgs() {  # $@: who; `ssv bench e2e` at CONTEXTS (4K) for each, each from an empty directory with its own
    # package, after assembling the GGUF (its last part carried by this call, the others by q1..q3)
    bash scripts/train_draft_gpu.sh receive 4 >/dev/null
    bash scripts/train_draft_gpu.sh assemble || exit 1
    python3 -c "import gguf" 2>/dev/null || { echo "no gguf module: carry .whl on this chain's first call"; exit 2; }
    local who pp c
    # E2E_MODES: the modes, space-separated, with '_' for a space inside a mode's name; E2E_EXTRA: more options
    # (e.g. '--temperature 0.7')
    local MODES_E2E=(ar-nsa sd-naive "ssv strict" "ssv strict lookup" "eagle3 dense lookup")
    [ -n "${E2E_MODES:-}" ] && { MODES_E2E=(); for m in $E2E_MODES; do MODES_E2E+=("${m//_/ }"); done; }
    for who in "$@"; do
        read -r pp c <<< "$(pkg $who)"
        [ -d $pp/ssv ] || { echo "no $pp: send b first"; exit 2; }
        mkdir -p /tmp/cwd-$who
        (cd /tmp/cwd-$who && PYTHONPATH=$pp:/tmp/site python3 -c "import ssv; print('package', ssv.__file__)" && \
         PYTHONPATH=$pp:/tmp/site SSV_COMMIT=$c timeout ${E2E_TIMEOUT:-270} \
            python3 -m ssv bench e2e --model /tmp/ssv-smollm2.gguf --prompts "$R/.stage/e2e-prompts.json" \
            --contexts ${CONTEXTS:-4096} --families ${E2E_FAMILIES:-code prose chat} --docs 1 --new-tokens 128 \
            --modes "${MODES_E2E[@]}" ${E2E_EXTRA:-} \
            --out "$OUTD/e2e-$who" 2>&1 | grep -v -i warn | tail -24)
    done
}

steps() {  # $1 who, $2 out folder: the step table at STEPS (4K; random weights), from an empty directory;
    # PATCH: launch-policy constants patched first (scripts/patched.py)
    read -r pp c <<< "$(pkg $1)"
    mkdir -p /tmp/cwd-$2 && (cd /tmp/cwd-$2 && PYTHONPATH=$pp:/tmp/site SSV_COMMIT=$c timeout 100 \
        python3 "$R/scripts/patched.py" ${PATCH:-} -- bench e2e --no-default --steps ${STEPS:-4096} \
        --steps-shape ${STEPS_SHAPE:-smollm2-135m} --out "$OUTD/$2" 2>&1 | grep -v -i warn | tail -12)
}

receive_part() {  # $1 N: the GGUF's part N (carried by this call); with part 1 also the Llama step table at 64K
    # (#12) from an empty directory, unless NO_STEPS=1
    bash scripts/train_draft_gpu.sh receive $1 >/dev/null
    [ "$1" = 1 ] && [ -z "${NO_STEPS:-}" ] || return 0
    mkdir -p /tmp/cwd-steps && (cd /tmp/cwd-steps && SSV_COMMIT=${SSV_COMMIT:-head} timeout 150 python3 -m ssv \
        bench e2e --no-default --steps 65536 --steps-shape llama3.1-8b --out "$OUTD/steps-llama-64k" 2>&1 \
        | grep -v -i warn | tail -14)
}
