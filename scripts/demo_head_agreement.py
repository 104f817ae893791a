"""How well the shipped head drafts short chat answers like `make demo`'s: each prompt in the chat template,
the target's greedy answer (ar, NEW tokens), teacher-forced through the target and the head; per answer
the head's top-1 / top-2 / top-8 agreement with the target's next token and the answer's tokens outside
the draft vocabulary (a drafter can never propose them). CPU fp32; no timing.
    python scripts/demo_head_agreement.py [OUT.json] [NEW] [HEAD] [PROMPTS.json]
HEAD: a head folder (default the shipped one); PROMPTS.json: a JSON list of questions in place of PROMPTS
(scripts/heldout_chat.json: questions on the self-prompt topics the head's training holds out).
"""
from __future__ import annotations

import datetime
import json
import subprocess
import sys

import torch

from ssv.cli import load_model
from ssv.draft import load_drafter
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.spec.accept import SamplingParams

PROMPTS = ["Explain in two sentences why the sky is blue.",   # the Makefile's PROMPT
           "Write a short poem about the sea.",
           "What is the capital of France? Answer briefly and explain its history.",
           "How do I reverse a list in Python?"]


def main(out: str, new: int = 64, head: str = "default", prompts: list = PROMPTS) -> None:
    model, tok = load_model("default", "cpu", progress=False)
    drafter = load_drafter(head, model)
    vocab = set(drafter.vocab_ids.tolist())
    r = Runner(model, attention="nsa", max_len=512)
    rows = []
    for p in prompts:
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True))
        cont = generate_ar(r, ids, SamplingParams(temperature=0.0), new).token_ids
        seq = ids + cont
        r.reset()
        _, chunks = r.prefill(seq[:-1], taps=drafter.taps)
        taps = [torch.cat([c[j] for c in chunks]) for j in range(len(drafter.taps))]
        hits = {}
        for k in (2, 8):   # rows p predict seq[p + 1]; agreement over the answer's rows only
            drafter.reset()
            drafter.commit(taps, torch.tensor(seq[1:]), agree=(k, len(cont)))
            top1, hits[k], pairs = drafter.agreement
        oov = [t for t in cont[1:] if t not in vocab]   # cont[0] is the target's own (a round's bonus)
        rows.append(dict(prompt=p, prompt_tokens=len(ids), answer_tokens=len(cont), pairs=pairs, top1=top1 / pairs,
                         top2=hits[2] / pairs, top8=hits[8] / pairs, out_of_vocab=len(oov),
                         out_of_vocab_tokens=sorted({tok.decode([t]) for t in oov})))
        print(f"{p[:44]!r:48s} top-1 {top1 / pairs:.2f}  top-2 {hits[2] / pairs:.2f}  top-8 {hits[8] / pairs:.2f}  "
              f"outside the draft vocabulary {len(oov)}/{len(cont) - 1}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    env = dict(device="cpu", torch=torch.__version__, commit=commit, draft_vocab=len(vocab), head=head,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    json.dump(dict(env=env, new_tokens=new, rows=rows), open(out, "w"), indent=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0] if a else "bench/results/cpu-s37/demo-head-agreement.json", int(a[1]) if len(a) > 1 else 64,
         a[2] if len(a) > 2 else "default", json.load(open(a[3])) if len(a) > 3 else PROMPTS)
