"""Held-out prompt texts for `ssv bench e2e`, made on this machine and carried to the GPU (--prompts).

code:  standard-library files of the draft's evaluation split ("# file: <path>" + source, as trained
       and evaluated), concatenated into documents;
prose: git's manual pages rendered to plain text (not Python documentation; no training set of ssv
       holds them);
chat:  other git manual pages, which the benchmark wraps in the chat template with a question.
Each document is at least --chars characters (~4 per token: 40,000 covers the 8K context).
Writes JSON {family: [text, ...]} (default .stage/e2e-prompts.json, git-ignored).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess

PROSE = ["git-rebase", "git-merge", "git-commit", "git-log", "git-push", "git-branch", "git-reset",
         "git-checkout", "git-fetch", "git-config", "git-diff", "git-stash"]
CHAT = ["git-bisect", "git-worktree", "git-tag", "git-remote", "git-submodule", "git-cherry-pick",
        "git-revert", "git-clone", "git-am", "git-blame", "git-status", "git-add",
        # session 57: four more documents (--docs 8) for chat's 8K MAL; appended, so the first four are unchanged
        "git-grep", "git-show", "git-init", "git-rm", "git-restore", "git-switch", "git-gc", "git-notes",
        "git-describe", "git-pull", "git-apply", "git-sparse-checkout", "git-format-patch", "git-range-diff"]


def man_text(page: str) -> str:
    env = dict(os.environ, MANWIDTH="100", LC_ALL="C.UTF-8")
    raw = subprocess.run(["man", "-P", "cat", page], capture_output=True, text=True, env=env, check=True).stdout
    return subprocess.run(["col", "-bx"], input=raw, capture_output=True, text=True, check=True).stdout


def documents(texts, chars: int, count: int) -> list:
    docs, cur = [], ""
    for t in texts:
        cur += t + "\n\n"
        if len(cur) >= chars:
            docs.append(cur)
            cur = ""
            if len(docs) == count:
                break
    if len(docs) < count:
        raise SystemExit(f"only {len(docs)} documents of {chars} characters")
    return docs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=".stage/e2e-prompts.json")
    p.add_argument("--docs", type=int, default=2)
    p.add_argument("--chars", type=int, default=40000)
    a = p.parse_args()
    from ssv.draft.data import document_text, split_files
    code = (document_text(path, rel) for path, rel in split_files("eval"))
    out = {"code": documents(code, a.chars, a.docs),
           "prose": documents((man_text(x) for x in PROSE), a.chars, a.docs),
           "chat": documents((man_text(x) for x in CHAT), a.chars, a.docs)}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f)
    print({k: [len(t) for t in v] for k, v in out.items()}, "->", a.out)


if __name__ == "__main__":
    main()
