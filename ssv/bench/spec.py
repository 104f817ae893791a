"""`ssv bench spec`: speculative decoding by context length on held-out real documents.

For each context length, each document is cut to that many tokens and continued greedily by:
`ar` (autoregressive NSA, the 1.00x baseline), `ssv strict` (must reproduce `ar` token for token),
`ssv approx` (shared selections and cross-layer routing reuse: its deviation from `ar` and its
acceptance are measured, not assumed), and EAGLE-3 over dense attention (`dense`). Reported: mean
accepted length (tokens per verify round, bonus included), acceptance by depth, tokens/s, and for
every speculative mode the position of the first token that differs from `ar`.
Documents: standard-library files from the draft's evaluation split (never trained on).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.engine.spec import generate_spec
from ssv.spec.accept import SamplingParams
from ssv.spec.tree import TreeSpec


def eval_documents(tok, min_tokens: int, count: int) -> list:
    """`count` token lists of >= min_tokens each, from eval-split stdlib files concatenated in order."""
    from ssv.draft.data import document_text, split_files

    docs, cur = [], []
    for path, rel in split_files("eval"):
        cur += tok.encode(document_text(path, rel))
        if len(cur) >= min_tokens:
            docs.append(cur[:min_tokens])
            cur = []
            if len(docs) == count:
                break
    if len(docs) < count:
        raise ValueError(f"only {len(docs)} held-out documents of {min_tokens} tokens are available")
    return docs


def modes(tree: TreeSpec, order: str = "pos", group_size: int = 4, extra_trees=()) -> dict:
    """name -> (attention, Strategy). extra_trees add strict modes with other tree shapes, so the
    planner's profile can rank tree shapes too."""
    from ssv.spec.planner import Strategy
    table = {
        "sd-naive": ("nsa", Strategy("sd-naive", tree, order, 1)),
        "ssv strict": ("nsa", Strategy("ssv strict", tree, order, group_size)),
        "ssv approx C16": ("nsa", Strategy("ssv approx C16", tree, order, 16, "approx")),
        "ssv approx C16 reuse/2": ("nsa", Strategy("ssv approx C16 reuse/2", tree, order, 16, "approx", 2)),
        "eagle3 dense": ("dense", Strategy("eagle3 dense", tree, order, 1)),
    }
    for t in extra_trees:
        name = f"ssv strict tree {t.depth}x{t.top_k}x{t.total_tokens}"
        table[name] = ("nsa", Strategy(name, t, order, group_size))
    return table


def strategies(tree: TreeSpec, order: str, group_size: int = 4, extra_trees=()) -> dict:
    """The benchmark's NSA modes as planner strategies (ar and dense attention are not strategies)."""
    return {name: s for name, (att, s) in modes(tree, order, group_size, extra_trees).items() if att == "nsa"}


def first_diff(a: list, b: list):
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)


def eval_spec(model, drafter, docs: list, contexts: list, new_tokens: int, tree: TreeSpec,
              order: str = "pos", which=None, progress: bool = False, make_runner=None, on_row=None,
              warmup: int = 0, extra_trees=()) -> list:
    """Rows per (context, document, mode). make_runner(attention) -> Runner (default: model defaults);
    on_row(rows) after every row (the benchmark writes its JSON there, so a run cut short keeps them).
    warmup > 0: first generate that many tokens in every mode (untimed), so kernel compilation and
    launch-config tuning do not land in the first document's tokens/s."""
    make_runner = make_runner or (lambda att: Runner(model, attention=att))
    rows = []
    n_layers = model.cfg.n_layers
    table = {name: (att, s.options(n_layers)) for name, (att, s) in modes(tree, order, extra_trees=extra_trees).items()
             if not which or name in which}
    if warmup and docs and contexts:
        ids = docs[0][:contexts[0]]
        generate_ar(make_runner("nsa"), ids, SamplingParams(), warmup)
        for att, opts in table.values():
            generate_spec(make_runner(att), drafter, ids, SamplingParams(), warmup, opts)
    for L in contexts:
        for d, doc in enumerate(docs):
            ids = doc[:L]
            ar = generate_ar(make_runner("nsa"), ids, SamplingParams(), new_tokens, margins=True)
            rows.append(dict(context=L, doc=d, mode="ar", mean_accepted_length=1.0,
                             tokens_per_second=ar.stats["tokens_per_second"], first_diff_vs_ar=None,
                             min_top2_margin=min(ar.stats["top2_margins"])))
            for name, (att, opts) in table.items():
                sd = generate_spec(make_runner(att), drafter, ids, SamplingParams(), new_tokens, opts)
                st = sd.stats
                diff = first_diff(ar.token_ids, sd.token_ids)
                rows.append(dict(context=L, doc=d, mode=name, tokens=len(sd.token_ids),
                                 mean_accepted_length=st["mean_accepted_length"],
                                 acceptance_by_depth=st["acceptance_by_depth"], rounds=st["rounds"],
                                 tokens_per_second=st["tokens_per_second"],
                                 speedup_vs_ar=st["tokens_per_second"] / max(ar.stats["tokens_per_second"], 1e-9),
                                 first_diff_vs_ar=diff,
                                 ar_margin_at_diff=None if diff is None else ar.stats["top2_margins"][diff]))
                if progress:
                    print(rows[-1], file=sys.stderr, flush=True)
                if on_row:
                    on_row(rows)
    return rows


def summarize(rows: list, new_tokens: int = 0) -> list:
    """Per (context, mode): means, and agreement with `ar`. A run agrees with `ar` up to its first
    differing token; `divergence_rate` is first differences per token compared (rows without a
    `tokens` count, from older files, count new_tokens)."""
    out = []
    for key in sorted({(r["context"], r["mode"]) for r in rows}):
        rs = [r for r in rows if (r["context"], r["mode"]) == key]
        diffs = [r["first_diff_vs_ar"] for r in rs]
        margins = [r.get("ar_margin_at_diff") for r in rs if r.get("ar_margin_at_diff") is not None]
        compared = sum(r.get("tokens", new_tokens) if r["first_diff_vs_ar"] is None else r["first_diff_vs_ar"] + 1
                       for r in rs)
        n_div = sum(d is not None for d in diffs)
        out.append(dict(context=key[0], mode=key[1], docs=len(rs),
                        divergences=n_div, tokens_compared=compared,
                        divergence_rate=n_div / compared if compared else None,
                        mean_accepted_length=sum(r["mean_accepted_length"] for r in rs) / len(rs),
                        tokens_per_second=sum(r["tokens_per_second"] for r in rs) / len(rs),
                        speedup_vs_ar=sum(r.get("speedup_vs_ar", 1.0) for r in rs) / len(rs),
                        identical_to_ar=sum(d is None for d in diffs),
                        max_ar_margin_at_diff=max(margins) if margins else None))
    return out


def add_args(p) -> None:
    p.add_argument("--model", default="default")
    p.add_argument("--draft", default="default", help="EAGLE-3 head folder ('default': the shipped head)")
    p.add_argument("--contexts", nargs="+", type=int, default=[1024, 2048, 4096, 6144])
    p.add_argument("--docs", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--tree-depth", type=int, default=6)
    p.add_argument("--tree-topk", type=int, default=8)
    p.add_argument("--tree-tokens", type=int, default=48)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--modes", nargs="+", help="subset of: 'ssv strict', 'ssv approx C16', "
                   "'ssv approx C16 reuse/2', 'eagle3 dense', 'ssv strict tree DxKxN' (default: all)")
    p.add_argument("--warmup", type=int, default=8, help="untimed tokens per mode before measuring (0: none)")
    p.add_argument("--extra-trees", nargs="*", default=[], metavar="D,K,N",
                   help="also measure ssv strict with these tree shapes (depth,top-k,tokens), for the profile")
    p.add_argument("--out", default="bench/results")


def _tree_arg(text: str) -> TreeSpec:
    try:
        d, k, n = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--extra-trees takes depth,top-k,tokens (e.g. 4,4,16), got {text!r}") from None
    return TreeSpec(d, k, n)


def cmd_bench_spec(args) -> int:
    from ssv.bench.kernels import _commit, environment
    from ssv.cli import load_model
    from ssv.draft import Eagle3Drafter, load_default_head, load_eagle3

    model, tok = load_model(args.model, args.device)
    p = next(model.parameters())
    if args.draft == "default":
        head, _ = load_default_head(device=p.device, dtype=p.dtype, target_cfg=model.cfg)
    else:
        head, _ = load_eagle3(args.draft, device=p.device, dtype=p.dtype, target=model.cfg)
    drafter = Eagle3Drafter(head, model)
    docs = eval_documents(tok, max(args.contexts), args.docs)
    tree = TreeSpec(args.tree_depth, args.tree_topk, args.tree_tokens)
    extra = [_tree_arg(t) for t in args.extra_trees]   # bad shapes fail before any generation
    if args.device == "cuda":
        env = environment()
    else:
        import datetime
        import platform
        env = {"device": f"cpu ({os.cpu_count()} cores)", "torch": torch.__version__, "python": platform.python_version(),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "commit": _commit()}
    os.makedirs(args.out, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "func"}

    def save(rows):
        tmp = os.path.join(args.out, f".spec-{args.device}.json.tmp")
        with open(tmp, "w") as f:
            json.dump({"env": env, "args": settings, "summary": summarize(rows, args.new_tokens), "rows": rows},
                      f, indent=1)
        os.replace(tmp, os.path.join(args.out, f"spec-{args.device}.json"))

    rows = eval_spec(model, drafter, docs, args.contexts, args.new_tokens, tree, progress=True,
                     which=set(args.modes) if args.modes else None, on_row=save, warmup=args.warmup,
                     extra_trees=extra)
    save(rows)
    from ssv.spec.planner import Profile
    try:  # the offline profile of the adaptive planner (`ssv generate --profile`)
        prof = Profile.from_rows(rows, strategies(tree, "pos", extra_trees=extra),
                                 meta={"env": env, "source": f"ssv bench spec, {len(docs)} documents"})
        prof.save(os.path.join(args.out, f"profile-{args.device}.json"))
    except ValueError as e:
        print(f"no profile written: {e}", file=sys.stderr)
    summary = summarize(rows, args.new_tokens)
    print(f"{'context':>8s} {'mode':24s} {'docs':>4s} {'MAL':>6s} {'tok/s':>8s} {'== ar':>6s} {'div/tok':>8s} "
          f"{'max margin':>10s}")
    for s in summary:
        mm = s["max_ar_margin_at_diff"]
        print(f"{s['context']:8d} {s['mode']:24s} {s['docs']:4d} {s['mean_accepted_length']:6.2f} "
              f"{s['tokens_per_second']:8.1f} {s['identical_to_ar']:6d} {s['divergence_rate'] or 0:8.4f} "
              f"{'' if mm is None else f'{mm:.3f}':>10s}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="ssv bench spec", description=__doc__)
    add_args(p)
    return cmd_bench_spec(p.parse_args(argv))
