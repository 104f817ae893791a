"""Merge `ssv bench e2e` files of one commit, run as separate processes (each context set in its own
call), into one e2e-cuda.json: rows concatenated, summaries recomputed (every ratio against the
ar-nsa of the same process: the files must not share a (family, context)), a plot beside it.

    python3 scripts/merge_e2e.py OUT.json A.json B.json ... --note "what each process ran"
"""
from __future__ import annotations

import argparse
import json
import os

from ssv.bench.e2e import plot, summarize


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("inputs", nargs="+")
    p.add_argument("--note", default="")
    a = p.parse_args()
    docs = [json.load(open(f)) for f in a.inputs]
    commits = {d["env"]["commit"] for d in docs}
    if len(commits) != 1:
        raise ValueError(f"the files come from different commits: {sorted(commits)}")
    seen = {}
    for f, d in zip(a.inputs, docs):
        for r in d["rows"]:
            key = (r["family"], r["target_context"])
            if seen.setdefault(key, f) != f:
                raise ValueError(f"{key} is in both {seen[key]} and {f}: its ratios would mix processes")
    rows = [r for d in docs for r in d["rows"]]
    env = dict(docs[0]["env"], processes=a.note or f"{len(docs)} processes: {', '.join(map(os.path.basename, a.inputs))}",
               dates=[d["env"]["date"] for d in docs])
    out = {"env": env, "summary": summarize(rows), "steps": [s for d in docs for s in d.get("steps", [])], "rows": rows}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    plot(out["summary"], os.path.splitext(a.out)[0] + ".png")
    print(f"wrote {a.out}: {len(rows)} rows, {len(out['summary'])} summary rows")


if __name__ == "__main__":
    main()
