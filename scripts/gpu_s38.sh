#!/usr/bin/env bash
# Session 38's device calls (no checkpoint needed; export PYTHONPATH=$PWD first):
#   call 1: bash scripts/gpu_s38.sh 1   carry [".stage/base-route"] (git archive of BASE 220cea0): which
#           two-sweep top-n launches disagree with the top-n of their own importance on the routing test's
#           case 7 (scripts/diag_route_rows.py over the tail, the warps and the tile loads; the base without
#           the tail's knobs), then compute-sanitizer's racecheck and memcheck on the failing form
#   call 2: bash scripts/gpu_s38.sh 2   the routing CUDA tests (the two-sweep forms, device lengths, top-n)
#           after the policy's fix (no one-warp top-n with the tail), and the diagnosis again
set -u
export PYTHONUNBUFFERED=1
OUTD=$(mkdir -p "${OUT:-bench/results}" && cd "${OUT:-bench/results}" && pwd)
nvidia-smi --query-gpu=name --format=csv,noheader
case "${1:?call number}" in
1)
    python3 scripts/diag_route_rows.py 7 5 2>&1 | grep -v -i warn | tee "$OUTD/diag-head.txt"
    (PYTHONPATH=$PWD/.stage/base-route python3 scripts/diag_route_rows.py 7 2>&1 | grep -v -i warn | tee "$OUTD/diag-base.txt")
    cat > /tmp/one.py <<'P'
import sys; sys.argv = ["x", "7"]
exec(open("scripts/diag_route_rows.py").read().replace("for tail in (False, True) if knobs else (None,)", "for tail in (True,)")
     .replace("for warps in (1, 2, 4) if knobs", "for warps in (1,) if knobs").replace("for tma in (False, True)", "for tma in (False,)")
     .replace("T.DTYPES if dev", "T.DTYPES[:1] if dev"))
P
    timeout 200 compute-sanitizer --tool racecheck --racecheck-report all python3 /tmp/one.py > "$OUTD/racecheck-all.txt" 2>&1
    timeout 150 compute-sanitizer --tool memcheck python3 /tmp/one.py > "$OUTD/memcheck.txt" 2>&1
    grep -h "SUMMARY" "$OUTD"/racecheck-all.txt "$OUTD"/memcheck.txt
    ;;
2)
    python3 scripts/diag_route_rows.py 7 2>&1 | grep -v -i warn | tee "$OUTD/diag-fix.txt" | grep -v "bad rows 0 of"
    echo "variants agreeing: $(grep -c 'bad rows 0 of' "$OUTD/diag-fix.txt")"
    # isolation: the count from the ranks' maximum (the scan rematerialized in the count's layout) at
    # 663f930's policy (one warp with the tail): still wrong -> the store's scan layout is the bad one
    rm -rf /tmp/v && mkdir -p /tmp/v && cp -r ssv /tmp/v/ && git show 663f930:ssv/ops/nsa/route_policy.py > /tmp/v/ssv/ops/nsa/route_policy.py 2>/dev/null \
        || cp .stage/route_policy-663f930.py /tmp/v/ssv/ops/nsa/route_policy.py
    python3 - <<'P'
p = "/tmp/v/ssv/ops/nsa/route_kernels.py"
s = open(p).read()
a = "        cnt = tl.sum(sel.to(tl.int32), 1)\n"
b = "            cnt += tl.sum(sel_t.to(tl.int32), 1)\n"
assert a in s and b in s
s = s.replace(a, "        cnt = tl.max(rank, 1) + 1\n").replace(b, "            cnt = tl.max(rank_t, 1) + 1\n")
open(p, "w").write(s)
P
    (PYTHONPATH=/tmp/v python3 scripts/diag_route_rows.py 7 2>&1 | grep -v -i warn | tee "$OUTD/diag-count-from-ranks.txt" | grep -v "bad rows 0 of")
    timeout ${TESTS_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider tests/ops/test_nsa_kernels.py -k route \
        tests/ops/test_nsa_device_len.py tests/ops/test_route_topk.py 2>&1 | tail -5 | tee "$OUTD/tests-route.log"
    ;;
esac
