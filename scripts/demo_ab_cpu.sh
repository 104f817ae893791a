#!/bin/bash
# `make demo`'s job (ssv generate --json, fresh processes) with two packages alternating, REPEATS times each per
# mode: prev = PREV (a `git archive <commit> ssv` root with ssv/data linked in; default .stage/prev55), head = this
# tree. Prints "who mode tok/s MAL tokens hash(token ids)" a run.   bash scripts/demo_ab_cpu.sh [REPEATS]
cd "$(dirname "$0")/.." || exit 1
[ -f .venv/bin/activate ] && . .venv/bin/activate   # make install's environment
R=$PWD; PREV=${PREV:-$R/.stage/prev55}
P="Explain in two sentences why the sky is blue."
for i in $(seq "${1:-6}"); do for mode in ar ssv; do for who in prev head; do
  root=$R; [ $who = prev ] && root=$PREV
  (cd /tmp && PYTHONPATH=$root python -m ssv generate --model default --attention nsa --mode $mode --chat \
     --max-new-tokens 48 --prompt "$P" --json 2>/dev/null | python -c "import json, sys; d = json.load(sys.stdin); \
s = d['stats']; print('$who', '$mode', round(s['tokens_per_second'], 2), s.get('mean_accepted_length'), \
len(d['token_ids']), hash(tuple(d['token_ids'])))")
done; done; done
