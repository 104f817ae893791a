#!/usr/bin/env bash
# Routing at a base commit beside the working tree, back to back on one machine, in one device call:
# probe_route.py over each package from an empty directory (so `ssv` resolves to the package named,
# each printed), base then head, ROUNDS times; selections compared (--against the base's .pt); then
# the routing CUDA tests of the head. Here first:
#   rm -rf .stage/base-route && mkdir -p .stage/base-route && git archive BASE ssv | tar -x -C .stage/base-route --exclude=ssv/data
# carry [".whl", ".stage/base-route"]; BASE_COMMIT / SSV_COMMIT name them; CASES: probe_route's case indices.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
R=$PWD; OUTD=$(mkdir -p "${OUT:-bench/results}" && cd "${OUT:-bench/results}" && pwd)
mkdir -p /tmp/ab-route && cd /tmp/ab-route
for i in $(seq 1 ${ROUNDS:-2}); do
    for who in base head; do
        pp=$R; c=${SSV_COMMIT:-head}; [ $who = base ] && { pp=$R/.stage/base-route; c=${BASE_COMMIT:-base}; }
        against=""; [ $who = head ] && against="--against $OUTD/probe-route-base-$i.pt"
        PYTHONPATH=$pp:/tmp/site python3 -c "import ssv; print('package', ssv.__file__)"
        PYTHONPATH=$pp:/tmp/site SSV_COMMIT=$c timeout ${PROBE_TIMEOUT:-90} python3 "$R/scripts/probe_route.py" \
            "$OUTD/probe-route-$who-$i.json" --cases ${CASES:-0 6 1 2} $against 2>&1 | grep -v -i warn | cut -c1-160
    done
done
cd "$R"
[ -n "${NO_TESTS:-}" ] || PYTHONPATH=$R:/tmp/site timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider \
    tests/ops/test_nsa_device_len.py tests/ops/test_route_topk.py tests/ops/test_nsa_kernels.py -k "route or plan" 2>&1 \
    | tail -4 | tee "$OUTD/tests-route-${SSV_COMMIT:-head}.log"
rm -f "$OUTD"/probe-route-head-*.pt
