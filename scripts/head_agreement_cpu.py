"""Where the shipped head's acceptance goes, by family: the target's own greedy continuation of each
held-out prompt of `ssv bench spec` (ar, CONTEXT tokens of prompt, NEW tokens) teacher-forced through the target and the
head, and per continuation token whether it is in the draft vocabulary and whether the head's first
choice (top-1) or any of its first 8 (top-8) names it, and the target's median top-2 logit margin over those
tokens (how decided the text is). A token outside the vocabulary ends a round
whatever the head's quality; one inside it that the head misses is the head's. CPU fp32; no timing.

    python scripts/head_agreement_cpu.py [CONTEXT] [NEW] [DOCS] [out.json]
"""
from __future__ import annotations

import datetime
import json
import subprocess
import sys

import torch

from ssv.bench.e2e import prompt_ids
from ssv.cli import load_model
from ssv.draft import load_drafter
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.spec.accept import SamplingParams


def main(context=4096, new=128, docs=2, out=None):
    model, tok = load_model("default", "cpu", progress=False)
    drafter = load_drafter("default", model)
    vocab = set(drafter.vocab_ids.tolist())
    prompts = json.load(open(".stage/e2e-prompts.json"))
    r = Runner(model, attention="nsa", max_len=context + new + 16)   # as `ssv bench spec`: room past 8K
    rows = []
    for family, texts in prompts.items():
        for i, text in enumerate(texts[:docs]):
            ids = prompt_ids(tok, family, text, context)   # chat: a question in the chat template, as benchmarked
            res = generate_ar(r, ids, SamplingParams(temperature=0.0), new, margins=True)
            cont = res.token_ids
            margins = sorted(res.stats["top2_margins"][1:])   # the target's top-2 logit gap at each token
            seq = ids + cont
            r.reset()
            _, chunks = r.prefill(seq[:-1], taps=drafter.taps)
            taps = [torch.cat([c[j] for c in chunks]) for j in range(len(drafter.taps))]
            drafter.reset()
            # rows p predict seq[p + 1]; agreement over the continuation's rows only
            drafter.commit(taps, torch.tensor(seq[1:]), agree=(8, len(cont)))
            top1, top8, pairs = drafter.agreement
            oov = sum(t not in vocab for t in cont[1:])   # cont[0] is the target's own (a round's bonus)
            rows.append(dict(family=family, doc=i, context=len(ids), tokens=len(cont), pairs=pairs,
                             out_of_vocab=oov / (len(cont) - 1), top1=top1 / pairs, top8=top8 / pairs,
                             target_margin_median=margins[len(margins) // 2],
                             oov_tokens=sorted({tok.decode([t]) for t in cont[1:] if t not in vocab})))
            print(f"{family:6s} doc {i}: out of vocab {oov / (len(cont) - 1):.3f}, top-1 {top1 / pairs:.3f}, "
                  f"top-8 {top8 / pairs:.3f} ({pairs} pairs), target margin median {margins[len(margins) // 2]:.2f}; missing {rows[-1]['oov_tokens'][:12]}", flush=True)
    if out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        env = dict(device="cpu", torch=torch.__version__, date=datetime.datetime.now(datetime.timezone.utc)
                   .isoformat(timespec="seconds"), commit=commit, draft_vocab=len(vocab))
        json.dump(dict(env=env, rows=rows), open(out, "w"), indent=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]) if a else 4096, int(a[1]) if len(a) > 1 else 128, int(a[2]) if len(a) > 2 else 2,
         a[3] if len(a) > 3 else None)
