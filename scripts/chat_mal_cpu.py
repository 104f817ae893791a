"""`ssv generate --chat` on short questions with two heads: per question ar, then ssv with each head (the
CPU's default tree, lookup and fall-back), fresh processes; mean accepted length, AR fall-back steps and
tok/s (decoding only) of every run, and whether every run's tokens equal ar's. CPU.
    python scripts/chat_mal_cpu.py OUT.json PROMPTS.json HEAD_A HEAD_B [NEW]
(scripts/heldout_chat.json: questions on the self-prompt topics the head's training holds out.)
"""
from __future__ import annotations

import datetime
import json
import subprocess
import sys

from demo_cpu import run as generate   # scripts/ is on the path when this runs as a script


def run(prompt: str, new: int, mode: str, head: str = "") -> dict:
    r = generate(mode, f"--draft {head}" if head else "", prompt, new)
    return dict(r, mode=mode, head=head or None)


def main(out: str, prompts: str, heads: list, new: int = 64) -> None:
    rows = []
    for p in json.load(open(prompts)):
        ar = run(p, new, "ar")
        rs = [ar] + [run(p, new, "ssv", h) for h in heads]
        for r in rs:
            r.update(prompt=p, identical_to_ar=r["token_ids"] == ar["token_ids"],
                     speedup_vs_ar=r["tokens_per_second"] / ar["tokens_per_second"])
            print(f"{p[:40]!r:44s} {r['mode']:4s} {str(r['head'] or ''):20s} {r['tokens_per_second']:6.2f} tok/s  "
                  f"MAL {r['mean_accepted_length']:.2f}  AR steps {r['ar_steps']}  == ar {r['identical_to_ar']}", flush=True)
        rows += rs
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    env = dict(device="cpu", commit=commit, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    json.dump(dict(env=env, new_tokens=new, heads=heads, rows=rows), open(out, "w"), indent=1)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], [a[2], a[3]], int(a[4]) if len(a) > 4 else 64)
