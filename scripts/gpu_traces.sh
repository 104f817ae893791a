#!/usr/bin/env bash
# On the lent GPU: record real routing (the default model verifying draft trees at ~6K context) and
# time the verify kernels on it (`ssv bench kernels --traces`, the kernels-traces.json rows).
# Four back-to-back calls (the GGUF and the ~34 MB working tree exceed one call's 64 MiB carry; parts
# made by `scripts/train_draft_gpu.sh stage`):
#   bash scripts/train_draft_gpu.sh receive 0   (carry .stage/draft/gguf.part0)
#   bash scripts/train_draft_gpu.sh receive 1   (carry .stage/draft/gguf.part1)
#   bash scripts/train_draft_gpu.sh receive 2   (carry .stage/draft/gguf.part2)
#   bash scripts/gpu_traces.sh                  (carry .stage/draft/gguf.part3, .stage/draft/gguf.sha256, .whl)
set -euo pipefail
export PYTHONUNBUFFERED=1 SSV_CACHE=/tmp/ssvcache
bash scripts/train_draft_gpu.sh assemble
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/gguf-*.whl .whl/fla_core-*.whl .whl/flash_linear_attention-*.whl
export PYTHONPATH=/tmp/site:$PWD
ssv() { python3 -c "import sys; from ssv.cli import main; sys.exit(main())" "$@"; }
# ~20K characters of typing.py: about 6K tokens, inside the default model's 8K context
python3 -c "import typing, inspect; print(inspect.getsource(typing)[:20000])" > /tmp/prompt.txt
ssv generate --model /tmp/ssv-smollm2.gguf --device cuda --dtype bfloat16 --mode ssv --no-chat \
  --prompt-file /tmp/prompt.txt --max-new-tokens 64 --tree-depth 6 --tree-topk 4 --tree-tokens 32 \
  --record-routing "${OUT:-/tmp}/routing.pt" --json > "${OUT:-/tmp}/generate.json"
ssv bench kernels --traces "${OUT:-/tmp}/routing.pt" --traces-only --out "${OUT:-bench/results}"
