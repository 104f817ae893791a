"""`ssv bench spec`: speculative decoding by family and context length on held-out real documents.

For each context length, family and document, the document is cut to that many tokens and continued
at each `--temperatures` value (0: greedy) by: `ar` (autoregressive NSA, the 1.00x baseline at the
same temperature), `ssv strict` (greedy: must reproduce `ar` token for token), `ssv approx` (shared
selections and cross-layer routing reuse: its deviation from `ar` and its acceptance are measured,
not assumed), and EAGLE-3 over dense attention (`dense`). Reported per (family, context, mode,
temperature): mean accepted length (tokens per verify round, bonus included), acceptance by depth,
tokens/s, and for greedy speculative rows the position of the first token that differs from `ar`.
Sampled rows (temperature > 0, fixed `--seed`) have no first difference (None): their tokens differ
from `ar`'s by design; acceptance keeps the target's distribution exactly (ssv.spec.accept).
Documents: families code, prose, chat from `--prompts` (scripts/make_e2e_prompts.py's JSON, prompts
built as `ssv bench e2e` builds them: chat wraps the document, cut to fit, with a question in the
chat template); without it, code only: standard-library files of the draft's evaluation split (never
trained on).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys

import torch

from ssv.bench.e2e import prompt_ids
from ssv.bench.paired import PairedAr
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


FAMILIES = ("code", "prose", "chat")


def load_prompts(path: str) -> dict:
    """--prompts: JSON {family: [text, ...]}."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--prompts {path} not found (make it with scripts/make_e2e_prompts.py)")
    with open(path, encoding="utf-8") as f:
        try:
            texts = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"--prompts {path}: not JSON ({e})") from None
    if not isinstance(texts, dict) or not all(isinstance(v, list) and all(isinstance(t, str) for t in v)
                                              for v in texts.values()):
        raise ValueError(f"--prompts {path} must hold JSON {{family: [text, ...]}}")
    return texts


def check_families(families, texts=None) -> list:
    """The families to measure: `families`, or by default code, prose, chat with --prompts (texts) and
    code alone without it (the held-out stdlib documents)."""
    if texts is None:
        fams = list(families or ["code"])
        bad = [f for f in fams if f != "code"]
        if bad:
            raise ValueError(f"unknown families {bad} without --prompts: only 'code' (held-out stdlib documents) "
                             "is available; the others need --prompts (scripts/make_e2e_prompts.py)")
    else:
        fams = list(families or FAMILIES)
        bad = [f for f in fams if f not in texts]
        if bad:
            raise ValueError(f"unknown families {bad}: --prompts has {sorted(texts)}")
    if len(set(fams)) != len(fams):
        raise ValueError(f"--families names a family twice: {fams}")
    return fams


def family_documents(tok, texts: dict, families, contexts, count: int, aligned: bool = False) -> dict:
    """family -> `count` documents, each {context: prompt ids} (`ssv.bench.e2e.prompt_ids`). Every text
    must have at least max(contexts) tokens (chat: then the document is cut to fit the template).
    aligned: every context's prompt ends at the document's token max(contexts), so each length continues
    the same text and the columns differ by context length alone; otherwise each prompt is the
    document's first `context` tokens and each length continues other text."""
    need, out = max(contexts), {}
    end = need if aligned else None
    for fam in families:
        items = texts[fam][:count]
        if len(items) < count:
            raise ValueError(f"--prompts has {len(items)} {fam} documents, fewer than --docs {count}")
        docs = []
        for i, text in enumerate(items):
            if fam == "chat" and (have := len(tok.encode(text))) < need:
                raise ValueError(f"chat document {i} has {have} tokens, fewer than {need}")
            try:
                docs.append({L: prompt_ids(tok, fam, text, L, end) for L in contexts})
            except ValueError as e:
                raise ValueError(f"{fam} document {i}: {e}") from None
        out[fam] = docs
    return out


def modes(tree: TreeSpec, order: str = "pos", group_size: int = 4, extra_trees=(), lookup: int = 0,
          spares: bool = True) -> dict:
    """name -> (attention, Strategy). extra_trees add strict modes with other tree shapes, so the
    planner's profile can rank tree shapes too. lookup = K adds `ssv strict lookup K`: the head's
    tree K nodes smaller and a chain of K tokens drafted from the context, the same rows verified
    (spares False: `ssv strict lookup K compact`, the K rows verified only where the chain needs them)."""
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
    if lookup:
        if tree.total_tokens - lookup < 1:
            raise ValueError(f"--lookup {lookup} leaves no head nodes in a tree of {tree.total_tokens}")
        name = f"ssv strict lookup {lookup}" + ("" if spares else " compact")
        table[name] = ("nsa", Strategy(name, TreeSpec(tree.depth, tree.top_k, tree.total_tokens - lookup), order,
                                       group_size, lookup=lookup, spares=spares))
    return table


def strategies(tree: TreeSpec, order: str, group_size: int = 4, extra_trees=(), lookup: int = 0,
               spares: bool = True) -> dict:
    """The benchmark's NSA modes as planner strategies (ar and dense attention are not strategies)."""
    return {name: s for name, (att, s) in modes(tree, order, group_size, extra_trees, lookup, spares).items()
            if att == "nsa"}


def first_diff(a: list, b: list):
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)


def eval_spec(model, drafter, docs, contexts: list, new_tokens: int, tree: TreeSpec,
              order: str = "pos", which=None, progress: bool = False, make_runner=None, on_row=None,
              warmup: int = 0, extra_trees=(), temperatures=(0.0,), seed: int = 0, repeats: int = 1,
              device_round: bool = False, paired: bool = False, lookup: int = 0, spares: bool = True) -> list:
    """Rows per (context, family, document, temperature, mode). docs: {family: [doc, ...]}, a doc being
    token ids (cut to each context) or {context: prompt ids} (`family_documents`); a plain list is the
    family "code". make_runner(attention) -> Runner (default: model defaults); on_row(rows) after every
    row (the benchmark writes its JSON there, so a run cut short keeps them). warmup > 0: first generate
    that many tokens in every mode at every temperature (untimed), so kernel compilation and
    launch-config tuning do not land in the first document's tokens/s. Sampling uses `seed` in every
    run (reproducible on the host). repeats > 1: each document's `ar` run and mode runs are repeated
    in turn (ar, modes, ar, modes, ...: the same machine state for each ratio), rows tagged `rep`.
    device_round: every run on a `DeviceEngine` (what `ssv generate` runs), no AR fall-back; ar then
    records no top-2 margins (they need the host step). Each run builds its own engine, so on CUDA it
    captures its graphs again (before its decode clock: `DeviceEngine.prepare`; a capture every run
    still costs the run's wall time): `ssv bench e2e` is the CUDA end-to-end benchmark.
    paired: each mode's run also steps an `ar` run between its own steps (`ssv.bench.paired`), and its
    speedup_vs_ar is over that paired ar (the unpaired ratio stays as speedup_vs_ar_run)."""
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    make_runner = make_runner or (lambda att: Runner(model, attention=att))
    docs = docs if isinstance(docs, dict) else {"code": docs}
    params = {float(t): SamplingParams(temperature=float(t)) for t in temperatures}   # bad values fail here
    cut = lambda doc, L: doc[L] if isinstance(doc, dict) else doc[:L]  # noqa: E731

    def engine(runner, head=None):
        if not device_round:
            return None
        from ssv.engine.device_round import DeviceEngine
        return DeviceEngine(runner, head)

    def run_ar(ids, sp, n, margins=False):
        r = make_runner("nsa")
        return generate_ar(r, ids, sp, n, seed=seed, margins=margins and not device_round, engine=engine(r))

    def run_spec(att, ids, sp, n, opts, between=None):
        r = make_runner(att)
        return generate_spec(r, drafter, ids, sp, n, opts, seed=seed, engine=engine(r, drafter), between=between)

    def shadow(ids, sp, n):
        if not paired:
            return None
        r = make_runner("nsa")
        return PairedAr(r, ids, sp, n, seed=seed, engine=engine(r))
    rows = []
    n_layers = model.cfg.n_layers
    table = {name: (att, s.options(n_layers)) for name, (att, s) in modes(tree, order, extra_trees=extra_trees, lookup=lookup, spares=spares).items()
             if not which or name in which}
    first = next((ds[0] for ds in docs.values() if ds), None)
    if warmup and first is not None and contexts:
        ids = cut(first, contexts[0])
        for sp in params.values():
            run_ar(ids, sp, warmup)
            for att, opts in table.values():
                run_spec(att, ids, sp, warmup, opts)
    items = [(family, d, doc) for family, fdocs in docs.items() for d, doc in enumerate(fdocs)]
    for L in contexts:   # context-major: a run cut short still covers every family
        for (family, d, doc), (T, sp) in itertools.product(items, params.items()):
            ids, greedy = cut(doc, L), sp.greedy
            for rep in range(repeats):
                base = dict(family=family, context=L, temperature=T, doc=d, rep=rep, prompt_tokens=len(ids))
                ar = run_ar(ids, sp, new_tokens, margins=greedy)
                ar_tps = ar.stats["tokens_per_second"]
                margins = ar.stats.get("top2_margins")
                margin = min(margins) if greedy and margins else None
                rows.append(dict(base, mode="ar", mean_accepted_length=1.0, tokens_per_second=ar_tps,
                                 first_diff_vs_ar=None, min_top2_margin=margin))
                for name, (att, opts) in table.items():
                    pair = shadow(ids, sp, new_tokens)
                    sd = run_spec(att, ids, sp, new_tokens, opts, between=pair)
                    st = sd.stats
                    # sampled: the tokens differ from ar's by design, there is no first difference
                    diff = first_diff(ar.token_ids, sd.token_ids) if greedy else None
                    rows.append(dict(base, mode=name, tokens=len(sd.token_ids),
                                     mean_accepted_length=st["mean_accepted_length"],
                                     acceptance_by_depth=st["acceptance_by_depth"], rounds=st["rounds"],
                                     tokens_per_second=st["tokens_per_second"],
                                     speedup_vs_ar=st["tokens_per_second"] / max(ar_tps, 1e-9),
                                     first_diff_vs_ar=diff,
                                     ar_margin_at_diff=None if diff is None or not margins else margins[diff]))
                    if pair is not None:
                        pair(len(sd.token_ids))   # a text cut at the context's end: ar catches up
                        rows[-1].update(paired_ar_tokens_per_second=pair.tokens_per_second,
                                        speedup_vs_ar_run=rows[-1]["speedup_vs_ar"],
                                        speedup_vs_ar=st["tokens_per_second"] / max(pair.tokens_per_second, 1e-9),
                                        paired_ar_identical=pair.token_ids == ar.token_ids)
                    if progress:
                        print(rows[-1], file=sys.stderr, flush=True)
                    if on_row:
                        on_row(rows)
    return rows


def _key(r: dict) -> tuple:
    # rows from older files have neither: they were greedy runs on code documents
    return r.get("family", "code"), r["context"], float(r.get("temperature", 0.0)), r["mode"]


def summarize(rows: list, new_tokens: int = 0) -> list:
    """Per (family, context, temperature, mode): means, and agreement with `ar`. A greedy run agrees with
    `ar` up to its first differing token; `divergence_rate` is first differences per token compared
    (rows without a `tokens` count, from older files, count new_tokens). Sampled groups (temperature
    > 0) are not compared with `ar` (None). acceptance_by_depth: the elementwise mean over documents,
    shorter lists padded with 0 (a tree that is not that deep never accepts there). Repeated runs
    (`rep` > 0, the same tokens again) count once for agreement and acceptance; a document's tok/s
    and speedup are the medians over its repeats (`speedup_range`: the extremes of the ratios); `paired`:
    the speedups are over an ar run interleaved with each run (`eval_spec(paired=True)`)."""
    out, groups = [], {}
    for r in rows:
        groups.setdefault(_key(r), []).append(r)
    for key in sorted(groups):
        every = groups[key]
        r0 = min(r.get("rep", 0) for r in every)
        rs = [r for r in every if r.get("rep", 0) == r0]   # one run per document
        family, context, temperature, mode = key
        per_doc = {}
        for r in every:
            per_doc.setdefault(r.get("doc", 0), []).append(r)
        tps = statistics.fmean(statistics.median(r["tokens_per_second"] for r in v) for v in per_doc.values())
        ratios = [r.get("speedup_vs_ar", 1.0) for r in every]
        speedup = statistics.fmean(statistics.median(r.get("speedup_vs_ar", 1.0) for r in v) for v in per_doc.values())
        diffs = [r["first_diff_vs_ar"] for r in rs]
        margins = [r.get("ar_margin_at_diff") for r in rs if r.get("ar_margin_at_diff") is not None]
        compared = sum(r.get("tokens", new_tokens) if r["first_diff_vs_ar"] is None else r["first_diff_vs_ar"] + 1
                       for r in rs)
        n_div = sum(d is not None for d in diffs)
        depth = [r["acceptance_by_depth"] for r in rs if r.get("acceptance_by_depth") is not None]
        width = max((len(a) for a in depth), default=0)
        greedy = temperature == 0.0
        out.append(dict(family=family, context=context, mode=mode, temperature=temperature, docs=len(rs),
                        divergences=n_div if greedy else None, tokens_compared=compared if greedy else None,
                        divergence_rate=(n_div / compared if compared else None) if greedy else None,
                        mean_accepted_length=sum(r["mean_accepted_length"] for r in rs) / len(rs),
                        acceptance_by_depth=[sum(a[i] if i < len(a) else 0.0 for a in depth) / len(depth)
                                             for i in range(width)] if depth else None,
                        tokens_per_second=tps, speedup_vs_ar=speedup, speedup_range=[min(ratios), max(ratios)],
                        repeats=len(every) // max(1, len(rs)),
                        identical_to_ar=sum(d is None for d in diffs) if greedy else None,
                        max_ar_margin_at_diff=max(margins) if margins else None,
                        paired=all("paired_ar_tokens_per_second" in r for r in every) and mode != "ar"))
    return out


def add_args(p) -> None:
    p.add_argument("--model", default="default")
    p.add_argument("--draft", default="default", help="EAGLE-3 head folder ('default': the shipped head)")
    p.add_argument("--contexts", nargs="+", type=int, default=[1024, 2048, 4096, 6144])
    p.add_argument("--docs", type=int, default=3, help="documents per family")
    p.add_argument("--prompts", help="JSON {family: [text, ...]} (scripts/make_e2e_prompts.py); "
                   "without it: code only, from the held-out stdlib files")
    p.add_argument("--families", nargs="+", help="default: code prose chat with --prompts, code without it")
    p.add_argument("--temperatures", nargs="+", type=float, default=[0.0],
                   help="0: greedy; > 0: sampled (every row at every temperature)")
    p.add_argument("--seed", type=int, default=0, help="the sampled runs' seed")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--tree-depth", type=int, default=6)
    p.add_argument("--tree-topk", type=int, default=8)
    p.add_argument("--tree-tokens", type=int, default=48)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--modes", nargs="+", help="subset of: 'ssv strict', 'ssv approx C16', "
                   "'ssv approx C16 reuse/2', 'eagle3 dense', 'ssv strict tree DxKxN', 'ssv strict lookup K' (default: all)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of every document, ar and modes in turn; tok/s and speedup are their medians")
    p.add_argument("--warmup", type=int, default=8, help="untimed tokens per mode before measuring (0: none)")
    p.add_argument("--extra-trees", nargs="*", default=[], metavar="D,K,N",
                   help="also measure ssv strict with these tree shapes (depth,top-k,tokens), for the profile")
    p.add_argument("--device-round", action="store_true",
                   help="run ar and every mode on the device-resident round, as `ssv generate` does (no "
                        "fall-back; for the CPU: on CUDA use `ssv bench e2e`, which captures graphs once)")
    p.add_argument("--lookup", type=int, default=0, metavar="K",
                   help="also measure 'ssv strict lookup K': K of the tree's nodes drafted from the context "
                        "(ssv.spec.lookup) instead of by the head")
    p.add_argument("--lookup-compact", action="store_true",
                   help="the lookup mode verifies the chain's rows only where it has tokens (the CPU's "
                        "form, `ssv strict lookup K compact`) instead of the head's spare nodes there")
    p.add_argument("--paired", action="store_true",
                   help="time every mode against an ar run stepped between its own steps (the same "
                        "machine state round by round: a noisy VM still gives a ratio); CPU, or no overlap")
    p.add_argument("--aligned", action="store_true",
                   help="every context's prompt ends at the same point of its document (the longest "
                        "context's end), so the context lengths continue the same text; default: each "
                        "prompt is the document's first CONTEXT tokens (needs --prompts)")
    p.add_argument("--out", default="bench/results")


def _tree_arg(text: str) -> TreeSpec:
    try:
        d, k, n = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--extra-trees takes depth,top-k,tokens (e.g. 4,4,16), got {text!r}") from None
    return TreeSpec(d, k, n)


def cmd_bench_spec(args) -> int:
    from ssv.bench.env import environment
    from ssv.cli import load_model
    from ssv.draft import load_drafter

    temps = [SamplingParams(temperature=t).temperature for t in args.temperatures]  # bad input fails first
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.docs < 1:
        raise ValueError(f"--docs must be >= 1, got {args.docs}")
    if min(args.contexts) < 1:
        raise ValueError(f"--contexts must be positive token counts, got {min(args.contexts)}")
    texts = load_prompts(args.prompts) if args.prompts else None
    if args.aligned and texts is None:
        raise ValueError("--aligned needs --prompts: the held-out stdlib documents are cut to the longest "
                         "context only")
    families = check_families(args.families, texts)
    tree = TreeSpec(args.tree_depth, args.tree_topk, args.tree_tokens)
    extra = [_tree_arg(t) for t in args.extra_trees]   # bad shapes fail before any generation
    known = modes(tree, extra_trees=extra, lookup=args.lookup, spares=not args.lookup_compact)
    unknown = [m for m in args.modes or () if m not in known and m != "ar"]   # ar: always run, the reference
    if unknown:   # a typo would otherwise run ar alone
        raise ValueError(f"--modes: unknown mode {unknown[0]!r}; known with these options: 'ar', "
                         + ", ".join(repr(k) for k in known))
    if args.lookup:
        if args.lookup_compact and args.device_round and args.device == "cuda":
            raise ValueError("--lookup-compact verifies rows that depend on the data, which the CUDA round's graphs "
                             "cannot hold: drop it (spares) or --device-round")
        for name, s in modes(tree, lookup=args.lookup, spares=not args.lookup_compact).items():
            if not args.modes or name in args.modes:   # (a tree only the lookup's head part fits is not run)
                s[1].options(1)   # a bad K fails first
    model, tok = load_model(args.model, args.device)
    if max(args.contexts) > model.cfg.max_seq_len:   # past the positions the model was trained for
        raise ValueError(f"--contexts {max(args.contexts)} exceeds the model's context of "
                         f"{model.cfg.max_seq_len} tokens")
    drafter = load_drafter(args.draft, model)
    if texts is None:
        docs = {"code": eval_documents(tok, max(args.contexts), args.docs)}
    else:
        docs = family_documents(tok, texts, families, args.contexts, args.docs, aligned=args.aligned)
    env = environment(args.device)
    os.makedirs(args.out, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "func"}

    def save(rows):
        tmp = os.path.join(args.out, f".spec-{args.device}.json.tmp")
        with open(tmp, "w") as f:
            json.dump({"env": env, "args": settings, "summary": summarize(rows, args.new_tokens), "rows": rows},
                      f, indent=1)
        os.replace(tmp, os.path.join(args.out, f"spec-{args.device}.json"))

    # room past the model's trained length for the new tokens and a last tree (as `bench e2e`): an
    # 8K prompt of the 8K-position default model is measured, not refused
    max_len = max(args.contexts) + args.new_tokens + max([tree.total_tokens] + [t.total_tokens for t in extra]) + 16
    rows = eval_spec(model, drafter, docs, args.contexts, args.new_tokens, tree, progress=True,
                     make_runner=lambda att: Runner(model, attention=att, max_len=max_len),
                     which=set(args.modes) if args.modes else None, on_row=save, warmup=args.warmup,
                     extra_trees=extra, temperatures=temps, seed=args.seed, repeats=args.repeats,
                     device_round=args.device_round, paired=args.paired, lookup=args.lookup,
                     spares=not args.lookup_compact)
    save(rows)
    from ssv.spec.planner import Profile
    try:  # the adaptive planner's offline profile (`ssv generate --profile`): all families, lowest temperature
        t0 = min(temps)
        src = f"ssv bench spec, {args.docs} documents per family ({', '.join(families)})"
        prof = Profile.from_rows([r for r in rows if r["temperature"] == t0],
                                 strategies(tree, "pos", extra_trees=extra, lookup=args.lookup,
                                            spares=not args.lookup_compact),
                                 meta={"env": env, "temperature": t0, "source": src})
        prof.save(os.path.join(args.out, f"profile-{args.device}.json"))
    except ValueError as e:
        print(f"no profile written: {e}", file=sys.stderr)
    opt = lambda x, fmt: "-" if x is None else format(x, fmt)  # noqa: E731
    print(f"{'family':6s} {'context':>7s} {'temp':>4s} {'mode':24s} {'docs':>4s} {'MAL':>6s} {'tok/s':>8s} "
          f"{'x ar':>5s} {'== ar':>5s} {'div/tok':>8s} {'max margin':>10s}  acceptance by depth")
    for s in summarize(rows, args.new_tokens):
        line = (f"{s['family']:6s} {s['context']:7d} {s['temperature']:4.2g} {s['mode']:24s} {s['docs']:4d} "
                f"{s['mean_accepted_length']:6.2f} {s['tokens_per_second']:8.1f} {s['speedup_vs_ar']:5.2f} "
                f"{opt(s['identical_to_ar'], 'd'):>5s} {opt(s['divergence_rate'], '.4f'):>8s} "
                f"{opt(s['max_ar_margin_at_diff'], '.3f'):>10s}  ")
        print((line + " ".join(f"{a:.2f}" for a in s["acceptance_by_depth"] or [])).rstrip())
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="ssv bench spec", description=__doc__)
    add_args(p)
    return cmd_bench_spec(p.parse_args(argv))
