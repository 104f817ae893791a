"""Grow a head's draft vocabulary with the target tokens of general text it lacks, without training.

The shipped head's 8,192-token vocabulary was counted on Python sources and docs: " sky", " blue",
" light", " air" are not in it, so the drafter can never propose them (18 of the 48 tokens of `make
demo`'s answer). This keeps every weight and old row, adds the most frequent missing tokens of the
corpus' train split (`python -m ssv.draft.corpus`: manual pages, package docs; git's pages are held
out) and gives each added token the row `ssv.draft.vocab.grow_rows` maps from the target's output
layer. A start for `ssv train-draft --init-from`, measured as is by `ssv bench spec`.

    python scripts/grow_draft_vocab.py OUT_DIR --corpus .stage/corpus/corpus.part0.jsonl.xz,... [--size 12288]
"""
from __future__ import annotations

import argparse
import json
import shutil

import torch

from ssv.cli import load_model
from ssv.draft import default_head_path
from ssv.draft.corpus import read_corpus
from ssv.draft.eagle3 import grow_head
from ssv.draft.io import load_eagle3, save_eagle3
from ssv.draft.vocab import count_tokens, coverage, grow_ids


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--corpus", required=True, help="comma list of corpus files")
    p.add_argument("--families", default="man,doc")
    p.add_argument("--size", type=int, default=12288)
    p.add_argument("--head", default=str(default_head_path()))
    p.add_argument("--max-chars", type=int, default=20_000_000, help="characters counted per split")
    a = p.parse_args()
    model, tok = load_model("default", "cpu", progress=False)
    head, _ = load_eagle3(a.head, target=model.cfg)
    docs = [d for d in read_corpus(a.corpus.split(",")) if d["family"] in a.families.split(",")]
    counts = {}
    for split in ("train", "eval"):
        texts, n = [], 0
        for d in docs:
            if d["split"] == split and n < a.max_chars:
                texts.append(d["text"])
                n += len(d["text"])
        counts[split] = count_tokens((tok.encode(t) for t in texts), model.cfg.vocab_size)
    new = grow_ids(head.target_ids(), counts["train"], a.size)
    rows = model.state_dict().get("lm_head.weight", model.state_dict()["embed_tokens.weight"])
    grown = grow_head(head, new, rows)
    save_eagle3(a.out, grown)
    for f in ("eval_prompts.jsonl",):
        shutil.copyfile(f"{a.head}/{f}", f"{a.out}/{f}")
    meta = {"grown_from": a.head, "size": a.size, "families": a.families, "corpus": a.corpus,
            "coverage_old": {s: coverage(c, head.target_ids()) for s, c in counts.items()},
            "coverage_new": {s: coverage(c, new) for s, c in counts.items()},
            "tokens_counted": {s: int(c.sum()) for s, c in counts.items()}}
    json.dump(meta, open(f"{a.out}/train_meta.json", "w"), indent=2)
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    with torch.no_grad():
        main()
