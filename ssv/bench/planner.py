"""`ssv bench planner`: the adaptive planner against every fixed strategy of its profile.

One process, the device-resident round (CUDA graphs on CUDA; the same code eagerly on the CPU), greedy,
no AR fall-back (the planner's own effect, not the fall-back's):
1. Profile: on profiling documents (`--profile-docs`, never evaluated on) every strategy continues each
   family's document at each context; `Profile.from_rows` ranks the strategies per context bucket by
   mean accepted length over seconds per round, averaged over the families.
2. Mixed set: the evaluation documents (`--eval-docs`) of every family at every context, shuffled with
   a fixed seed, so that families and lengths interleave. Per prompt, `ar-nsa`, every fixed strategy
   and the adaptive planner (from the profile, re-ranking on observed acceptance) run in turn, the
   order rotated per prompt and repeat. A prompt's time per run is its median over repeats.
Reported: accepted tokens/s over the whole set (emitted tokens / decode seconds, summed over prompts)
of every run; adaptive / best fixed; the per-prompt oracle (each prompt's fastest fixed strategy,
chosen after the fact: the ceiling of any per-prompt choice from this strategy space); switches
per prompt; the cost of a switch (the round right after a switch against the median of the same
strategy's other rounds in that run); and whether the tokens equal ar-nsa's.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import sys

import torch

from ssv.engine.generate import generate_ar
from ssv.engine.spec import generate_spec
from ssv.spec.accept import SamplingParams
from ssv.spec.planner import AdaptivePlanner, Profile, Strategy
from ssv.spec.tree import TreeSpec

GREEDY = SamplingParams(temperature=0.0)
# from a chain-like small tree (cheap rounds, for text the head drafts badly) to a deep wide one
TREES = ((4, 2, 8), (4, 4, 16), (5, 6, 32), (6, 8, 48), (8, 8, 96))
# the same rows a round with a chain of up to LOOKUP tokens from the context in the head's last rows
# (ssv.spec.lookup; `ssv generate`'s CUDA default is the 48-row one)
LOOKUP_TREES = ((4, 4, 16), (5, 6, 32), (6, 8, 48), (8, 8, 96))
LOOKUP = 8


def strategy_space(allow_approx: bool = False, trees=TREES, lookup_trees=LOOKUP_TREES) -> list:
    """Strict trees from small to large at C = 4 (pos order), the same rows with a context lookup,
    the default tree at C = 8 and in BFS order; with allow_approx, the default tree's approximate
    C = 16 strategies too."""
    out = [Strategy(f"strict {d}x{k}x{n}", TreeSpec(d, k, n)) for d, k, n in trees]
    out += [Strategy(f"strict {d}x{k}x{n - LOOKUP} lookup {LOOKUP}", TreeSpec(d, k, n - LOOKUP), lookup=LOOKUP)
            for d, k, n in lookup_trees]
    base = TreeSpec(6, 8, 48)
    out += [Strategy("strict 6x8x48 C8", base, group_size=8), Strategy("strict 6x8x48 bfs", base, order="bfs")]
    if allow_approx:
        out += [Strategy("approx 6x8x48 C16", base, group_size=16, precision="approx"),
                Strategy("approx 6x8x48 C16 reuse/2", base, group_size=16, precision="approx", refresh_every=2)]
    return out


def run_one(runner, engine, drafter, ids: list, new_tokens: int, strategy=None, planner=None) -> dict:
    """One greedy generation: AR (neither given), a fixed strategy, or the planner."""
    if strategy is None and planner is None:
        res = generate_ar(runner, ids, GREEDY, new_tokens, engine=engine)
        return {"tokens": res.token_ids, "decode_seconds": res.stats["decode_seconds"], "rounds": len(res.token_ids) - 1,
                "mean_accepted_length": 1.0}
    per_round: list = []
    opts = None if strategy is None else strategy.options(runner.model.cfg.n_layers)
    res = generate_spec(runner, drafter, ids, GREEDY, new_tokens, opts=opts, engine=engine, planner=planner,
                        round_seconds=per_round)
    out = {"tokens": res.token_ids, "decode_seconds": res.stats["decode_seconds"], "rounds": res.stats["rounds"],
           "mean_accepted_length": res.stats["mean_accepted_length"]}
    if planner is not None:
        s = res.stats["planner"]
        out.update(switches=s["switches"], rounds_by_strategy=s["rounds_by_strategy"],
                   switch_cost_seconds=switch_costs(s["switches"], per_round))
    return out


def switch_costs(switches: list, per_round: list) -> list:
    """Per switch (not the first choice): the switched-to round's time minus the median of that
    strategy's other rounds in the same run (None when it ran no other round)."""
    names, cur, starts = [], None, {s["round"]: s["to"] for s in switches}
    for i in range(len(per_round)):
        cur = starts.get(i, cur)
        names.append(cur)
    first = {s["round"] for s in switches if s["from"] is not None}
    out = []
    for i in sorted(first):
        if i >= len(per_round):
            continue
        rest = [t for j, t in enumerate(per_round) if names[j] == names[i] and j not in first]
        out.append(per_round[i] - statistics.median(rest) if rest else None)
    return out


def profile(runner, engine, drafter, docs: dict, contexts, strategies, new_tokens: int, meta=None, log=None):
    """docs: {family: [{context: prompt ids}, ...]}. Returns (rows, Profile)."""
    rows = []
    for L in contexts:
        for fam, items in docs.items():
            for d, doc in enumerate(items):
                for s in strategies:
                    r = run_one(runner, engine, drafter, doc[L], new_tokens, strategy=s)
                    emitted = len(r["tokens"]) - 1
                    rows.append({"family": fam, "doc": d, "context": L, "mode": s.name, "rounds": r["rounds"],
                                 "mean_accepted_length": r["mean_accepted_length"],
                                 "tokens_per_second": emitted / r["decode_seconds"]})
                    if log:
                        log(rows[-1])
    return rows, Profile.from_rows(rows, {s.name: s for s in strategies}, meta)


def mixed_set(docs: dict, contexts, seed: int = 0) -> list:
    """(family, doc, context) of every evaluation prompt, shuffled (families and lengths interleaved)."""
    items = [(fam, d, L) for fam, ds in docs.items() for d in range(len(ds)) for L in contexts]
    random.Random(seed).shuffle(items)
    return items


def run_mixed(runner, engine, drafter, docs: dict, items: list, strategies, prof: Profile, new_tokens: int,
              repeats: int = 1, allow_approx: bool = False, log=None, on_prompt=None) -> list:
    """Rows per (prompt, run, repeat); runs 'ar-nsa', every strategy's name, 'adaptive'. on_prompt(rows)
    after every prompt's runs (the benchmark saves there: a run cut short keeps its rows)."""
    runs = ["ar-nsa"] + [s.name for s in strategies] + ["adaptive"]
    by_name = {s.name: s for s in strategies}
    planner = AdaptivePlanner(prof, runner.model.cfg.n_layers, allow_approx=allow_approx)
    rows = []
    for rep in range(repeats):
        for p, (fam, d, L) in enumerate(items):
            k = (p + rep) % len(runs)          # rotate: no run always follows the same one
            for name in runs[k:] + runs[:k]:
                kw = {"planner": planner} if name == "adaptive" else {"strategy": by_name.get(name)}
                r = run_one(runner, engine, drafter, docs[fam][d][L], new_tokens, **kw)
                rows.append({"prompt": p, "family": fam, "doc": d, "context": L, "rep": rep, "run": name, **r})
                if log:
                    log(rows[-1])
            if on_prompt:
                on_prompt(rows)
    return rows


def summarize(rows: list) -> dict:
    """Set-level accepted tokens/s per run (a prompt's seconds: the median over its repeats), the
    per-prompt oracle over the fixed strategies, adaptive / best fixed, switches and their cost, and
    agreement with ar-nsa (first repeat)."""
    secs, toks, first = {}, {}, {}
    rep0 = min(r["rep"] for r in rows)
    for r in rows:
        key = (r["run"], r["prompt"])
        secs.setdefault(key, []).append(r["decode_seconds"])
        toks[key] = len(r["tokens"]) - 1
        if r["rep"] == rep0:
            first[key] = r
    runs = list(dict.fromkeys(r["run"] for r in rows))   # in the order they first ran
    prompts = sorted({k[1] for k in secs})
    med = {k: statistics.median(v) for k, v in secs.items()}
    fixed = [n for n in runs if n not in ("ar-nsa", "adaptive")]

    def rate(pick):
        t = sum(toks[pick(p), p] for p in prompts)
        s = sum(med[pick(p), p] for p in prompts)
        return t / s
    table = {n: {"tokens_per_second": rate(lambda p, n=n: n)} for n in runs}
    for n in runs:
        same = [first[n, p]["tokens"] == first["ar-nsa", p]["tokens"] for p in prompts if ("ar-nsa", p) in first]
        table[n]["identical_to_ar_nsa"] = f"{sum(same)}/{len(same)}"
        table[n]["mean_accepted_length"] = statistics.fmean(first[n, p]["mean_accepted_length"] for p in prompts)
    # the oracle's pick per prompt by seconds per emitted token (the runs may stop at different lengths)
    best_of = {p: min(fixed, key=lambda n, p=p: med[n, p] / max(toks[n, p], 1)) for p in prompts}
    best_fixed = max(fixed, key=lambda n: table[n]["tokens_per_second"])
    out = {"runs": table, "best_fixed": best_fixed,
           "oracle_per_prompt": {"tokens_per_second": rate(lambda p: best_of[p]),
                                 "picks": {n: sum(v == n for v in best_of.values()) for n in fixed}}}
    base = table[best_fixed]["tokens_per_second"]
    out["oracle_vs_best_fixed"] = out["oracle_per_prompt"]["tokens_per_second"] / base
    if "adaptive" in table:
        ad = [first["adaptive", p] for p in prompts]
        sw = [s for r in ad for s in r["switches"] if s["from"] is not None]
        costs = [c for r in ad for c in r["switch_cost_seconds"] if c is not None]
        out["adaptive_vs_best_fixed"] = table["adaptive"]["tokens_per_second"] / base
        out["adaptive_vs_ar_nsa"] = table["adaptive"]["tokens_per_second"] / table["ar-nsa"]["tokens_per_second"]
        out["switches_per_prompt"] = len(sw) / len(prompts)
        out["switch_reasons"] = {w: sum(s["reason"] == w for s in sw) for w in ("bucket", "acceptance")}
        out["switch_cost_ms_median"] = 1e3 * statistics.median(costs) if costs else None
        out["adaptive_rounds_by_strategy"] = {n: sum(r["rounds_by_strategy"].get(n, 0) for r in ad) for n in fixed}
    return out


def plot(summ: dict, path: str) -> None:
    """Accepted tokens/s of every run over the mixed set, the per-prompt oracle as a line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(summ["runs"])
    vals = [summ["runs"][n]["tokens_per_second"] for n in names]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    colors = ["grey" if n == "ar-nsa" else "tab:orange" if n == "adaptive" else "tab:blue" for n in names]
    ax.barh(names, vals, color=colors)
    ax.axvline(summ["oracle_per_prompt"]["tokens_per_second"], color="k", ls="--", lw=1, label="per-prompt oracle")
    ax.invert_yaxis()
    ax.set_xlabel("accepted tokens/s over the mixed set")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_args(p) -> None:
    p.add_argument("--model", default="default")
    p.add_argument("--draft", default="default")
    p.add_argument("--prompts", default=".stage/planner-prompts.json",
                   help="scripts/make_e2e_prompts.py --docs 4 (documents 0-1 are bench e2e's)")
    p.add_argument("--families", nargs="+", default=["code", "prose", "chat"])
    p.add_argument("--contexts", nargs="+", type=int, default=[1024, 2048, 4096, 8192])
    p.add_argument("--profile-docs", nargs="+", type=int, default=[1, 3], help="document indices to profile on")
    p.add_argument("--eval-docs", nargs="+", type=int, default=[0, 2], help="document indices of the mixed set")
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="the mixed set's shuffle")
    p.add_argument("--strategies", nargs="+", help="a subset of the space by name (default: all of it)")
    p.add_argument("--precision", choices=("strict", "approx"), default="strict",
                   help="approx: approximate strategies enter the space and the planner may pick them")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--out", default="bench/results")


def cmd_bench_planner(args) -> int:
    from ssv.bench.e2e import prompt_ids
    from ssv.bench.env import environment
    from ssv.bench.spec import check_families, load_prompts
    from ssv.cli import load_model
    from ssv.draft import load_drafter
    from ssv.engine.device_round import DeviceEngine
    from ssv.engine.runner import Runner

    if args.repeats < 1 or args.new_tokens < 1:
        raise ValueError("--repeats and --new-tokens must be >= 1")
    if set(args.profile_docs) & set(args.eval_docs):
        raise ValueError(f"documents {sorted(set(args.profile_docs) & set(args.eval_docs))} are both profiled "
                         "and evaluated on: the mixed set must be held out from the profile")
    space = strategy_space(args.precision == "approx")
    if args.strategies:
        names = [s.name for s in space]
        bad = [n for n in args.strategies if n not in names]
        if bad:
            raise ValueError(f"unknown strategies {bad}; choose from {names}")
        space = [s for s in space if s.name in args.strategies]
    texts = load_prompts(args.prompts)
    fams = check_families(args.families, texts)
    need = max(args.profile_docs + args.eval_docs) + 1
    short = [f for f in fams if len(texts[f]) < need]
    if short:
        raise ValueError(f"--prompts has fewer than {need} documents for {short} (scripts/make_e2e_prompts.py --docs {need})")
    model, tok = load_model(args.model, args.device)
    drafter = load_drafter(args.draft, model)
    max_len = max(args.contexts) + args.new_tokens + max(s.tree.total_tokens + s.lookup for s in space) + 16
    runner = Runner(model, attention="nsa", max_len=max_len)
    engine = DeviceEngine(runner, drafter, graphs=False if args.eager or args.device == "cpu" else None)

    def docs_of(idx):
        return {f: [{L: prompt_ids(tok, f, texts[f][i], L) for L in args.contexts} for i in idx] for f in fams}
    prof_docs, eval_docs = docs_of(args.profile_docs), docs_of(args.eval_docs)
    env = environment(args.device)
    # warm-up: every strategy's graphs captured and kernels compiled before anything is timed
    warm = prof_docs[fams[0]][0][min(args.contexts)]
    run_one(runner, engine, drafter, warm, 16)
    for s in space:
        run_one(runner, engine, drafter, warm, 16, strategy=s)
    def log(r):
        brief = {k: v for k, v in r.items() if k not in ("tokens", "switches")}
        if "tokens" in r:
            brief.update(emitted=len(r["tokens"]) - 1, head=r["tokens"][:4])
        if r.get("switches"):
            brief["switches"] = [(s["round"], s["to"]) for s in r["switches"]]
        print(brief, file=sys.stderr, flush=True)
    prof_rows, prof = profile(runner, engine, drafter, prof_docs, args.contexts, space, args.new_tokens,
                              meta={"env": env, "source": f"ssv bench planner, documents {args.profile_docs}"}, log=log)
    os.makedirs(args.out, exist_ok=True)
    prof.save(os.path.join(args.out, f"planner-profile-{args.device}.json"))
    items = mixed_set(eval_docs, args.contexts, args.seed)
    path = os.path.join(args.out, f"planner-{args.device}.json")
    doc = {"env": env, "args": {k: v for k, v in vars(args).items() if k != "func"},
           "strategies": [s.to_json() for s in space], "profile_rows": prof_rows,
           "mixed_set": [{"family": f, "doc": args.eval_docs[d], "context": L} for f, d, L in items]}

    def save(rows):
        # a run cut short: only the prompts every repeat reached are summarized
        done = {r["prompt"] for r in rows if r["rep"] == rows[-1]["rep"]} if rows[-1]["rep"] else None
        keep = [r for r in rows if done is None or r["prompt"] in done]
        doc.update(summary=summarize(keep), complete_prompts=len({r["prompt"] for r in keep}), rows=rows)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    rows = run_mixed(runner, engine, drafter, eval_docs, items, space, prof, args.new_tokens, args.repeats,
                     allow_approx=args.precision == "approx", log=log, on_prompt=save)
    save(rows)
    summ = doc["summary"]
    try:
        plot(summ, os.path.join(args.out, f"planner-{args.device}.png"))
    except ImportError:   # matplotlib is the [bench] extra
        print("matplotlib missing: no plot", file=sys.stderr)
    print(f"{'run':28s} {'tok/s':>8s} {'MAL':>5s} {'== ar':>6s}")
    for n, t in summ["runs"].items():
        print(f"{n:28s} {t['tokens_per_second']:8.1f} {t['mean_accepted_length']:5.2f} {t['identical_to_ar_nsa']:>6s}")
    print(f"best fixed: {summ['best_fixed']}; oracle per prompt {summ['oracle_vs_best_fixed']:.3f}x it; "
          f"adaptive {summ.get('adaptive_vs_best_fixed', float('nan')):.3f}x it, "
          f"{summ.get('switches_per_prompt', 0):.2f} switches per prompt, "
          f"median switch cost {summ.get('switch_cost_ms_median')} ms")
    print(f"wrote {path}")
    return 0
