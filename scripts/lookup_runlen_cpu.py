"""Per position of the target's greedy continuation of each `ssv bench spec` prompt (CPU fp32): the
context lookup's matched suffix length n (4, 3, 2; 0 = no match) and how many of its chain's tokens
(up to 6) are right; prints P(run >= d) per family and n, writes OUT.json with the environment.

    PYTHONPATH=. python scripts/lookup_runlen_cpu.py CONTEXT NEW DOCS OUT.json
"""
import collections
import datetime
import json
import subprocess
import sys

import torch
from ssv.bench.e2e import prompt_ids
from ssv.cli import load_model
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.spec.accept import SamplingParams


def lookup(seq, j, k=6):
    """(n, the chain): the k tokens after the latest earlier occurrence of the longest suffix of seq[:j]."""
    for n in range(4, 1, -1):
        if j < n + 1:
            continue
        suf = seq[j - n:j]
        for m in range(j - n - 1, -1, -1):
            if seq[m:m + n] == suf:
                return n, seq[m + n:min(m + n + k, j)]
    return 0, []


ctx, new, docs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
model, tok = load_model("default", "cpu", progress=False)
prompts = json.load(open(".stage/e2e-prompts.json"))
r = Runner(model, attention="nsa", max_len=ctx + new + 16)
out = {}
for family, texts in prompts.items():
    stats = collections.defaultdict(list)
    for text in texts[:docs]:
        ids = prompt_ids(tok, family, text, ctx)
        cont = generate_ar(r, ids, SamplingParams(temperature=0.0), new).token_ids
        seq = ids + cont
        for j in range(len(ids) + 1, len(seq)):
            n, ch = lookup(seq, j)
            run = 0
            while run < len(ch) and j + run < len(seq) and ch[run] == seq[j + run]:
                run += 1
            stats[n].append((len(ch), run))
    out[family] = {n: v for n, v in stats.items()}
    for n in sorted(stats):
        v = stats[n]
        ge = [sum(1 for L, r_ in v if r_ >= d) / len(v) for d in range(1, 7)]
        print(family, "n=%d" % n, "count", len(v), "P(run>=d)", [round(x, 2) for x in ge])
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
env = dict(device="cpu", torch=torch.__version__, date=datetime.date.today().isoformat(), commit=commit)
summary = {f: {n: [sum(1 for _, r_ in v if r_ >= d) / len(v) for d in range(1, 7)] for n, v in st.items()}
           for f, st in out.items()}
json.dump(dict(env=env, context=ctx, new_tokens=new, docs=docs, p_run_at_least=summary, positions=out),
          open(sys.argv[4], "w"))
