"""Would drafting from the context (prompt lookup: the text that followed the last occurrence of the
current suffix) add acceptance to the head? Offline, on the target's own greedy continuation of each
`ssv bench spec` prompt (CPU fp32; no timing):
- the head's teacher-forced first choice at each continuation position (one committed row at a time);
- the lookup's proposal at each position: the K tokens after the latest earlier occurrence of the
  longest suffix of N_MAX..N_MIN tokens;
- chains simulated round by round from the continuation's start: a round accepts the head's run of
  right first choices, or the lookup's run, or the longer of the two, plus the bonus token.
The chains are a proxy for the tree's MAL (a tree holds more than one chain): what they show is where
the lookup is right and the head is not.

    python scripts/lookup_probe_cpu.py [CONTEXT] [NEW] [DOCS] [out.json] [FAMILY,...]
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

N_MAX, N_MIN, K = 4, 2, 6


def lookup(seq: list, j: int, k: int = K) -> list:
    """The k tokens after the latest earlier occurrence of the longest suffix (N_MAX..N_MIN tokens)
    of seq[:j]; [] when none occurs."""
    for n in range(N_MAX, N_MIN - 1, -1):
        if j < n + 1:
            continue
        suf = seq[j - n:j]
        for m in range(j - n - 1, -1, -1):
            if seq[m:m + n] == suf:
                return seq[m + n:min(m + n + k, j)]
    return []


def run_len(pred: list, seq: list, j: int) -> int:
    n = 0
    while n < len(pred) and j + n < len(seq) and pred[n] == seq[j + n]:
        n += 1
    return n


def main(context=4096, new=128, docs=2, out=None, families=None):
    model, tok = load_model("default", "cpu", progress=False)
    drafter = load_drafter("default", model)
    prompts = json.load(open(".stage/e2e-prompts.json"))
    r = Runner(model, attention="nsa", max_len=context + new + 16)
    rows = []
    for family, texts in prompts.items():
        if families and family not in families:
            continue
        for i, text in enumerate(texts[:docs]):
            ids = prompt_ids(tok, family, text, context)
            cont = generate_ar(r, ids, SamplingParams(temperature=0.0), new).token_ids
            seq = ids + cont
            r.reset()
            _, chunks = r.prefill(seq[:-1], taps=drafter.taps)
            taps = [torch.cat([c[j] for c in chunks]) for j in range(len(drafter.taps))]
            P = len(ids)
            head = {}   # position j -> the head's first choice for seq[j], from seq[:j]
            drafter.reset()
            logp = drafter.commit([t[:P] for t in taps], torch.tensor(seq[1:P + 1]))   # predicts seq[P + 1]
            for j in range(P + 1, len(seq)):
                head[j] = int(logp.argmax())
                if j + 1 < len(seq):
                    logp = drafter.commit([t[j - 1:j] for t in taps], torch.tensor([seq[j]]))
            hit = {j: head[j] == seq[j] for j in head}
            look = {j: lookup(seq, j) for j in head}
            lhit = {j: bool(look[j]) and look[j][0] == seq[j] for j in head}

            def chain(use_head, use_look):
                j, rounds, toks = P + 1, 0, 0
                while j < len(seq):
                    h = 0
                    while use_head and j + h < len(seq) and hit[j + h]:
                        h += 1
                    lk = run_len(look[j], seq, j) if use_look else 0
                    a = max(h, lk)
                    rounds += 1
                    toks += a + 1
                    j += a + 1
                return toks / rounds
            n = len(head)
            rows.append(dict(family=family, doc=i, context=len(ids), positions=n,
                             head_top1=sum(hit.values()) / n, lookup_proposes=sum(bool(v) for v in look.values()) / n,
                             lookup_first_right=sum(lhit.values()) / n,
                             lookup_right_head_wrong=sum(lhit[j] and not hit[j] for j in head) / n,
                             chain_head=chain(True, False), chain_lookup=chain(False, True), chain_both=chain(True, True)))
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    if out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        env = dict(device="cpu", torch=torch.__version__, date=datetime.datetime.now(datetime.timezone.utc)
                   .isoformat(timespec="seconds"), commit=commit, lookup=dict(n_max=N_MAX, n_min=N_MIN, k=K))
        json.dump(dict(env=env, rows=rows), open(out, "w"), indent=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]) if a else 4096, int(a[1]) if len(a) > 1 else 128, int(a[2]) if len(a) > 2 else 2,
         a[3] if len(a) > 3 else None, a[4].split(",") if len(a) > 4 else None)
