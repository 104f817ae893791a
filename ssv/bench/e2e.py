"""`ssv bench e2e`: tokens per second a user sees, every mode side by side in one process (CUDA).

Part 1, the default model: held-out prompts of three families (code, prose, chat; `--prompts`, made
by scripts/make_e2e_prompts.py) at each context, greedy, every mode on the same prompt: tok/s, mean
accepted length, speedup over `ar-nsa`, the round's split (draft / verify / accept+commit: CUDA
events between the phases' graph replays), kernel launches per round and the GPU's kernel-busy
fraction (torch profiler over extra rounds), and whether the tokens equal the AR run of the same
attention (with ar's top-2 margin where they first differ).
Part 2, the Llama-3.1-8B shape with random bf16 weights (`--steps`): a graphed AR step and a 48-node
verify pass per mode, against the bytes floor (weights + the AR step's KV at the copy bandwidth
measured in the same run). Random weights route with no overlap between queries: grouping cannot
show there, so its verify rows are upper bounds for the grouped modes.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

from ssv.attention import VerifyOptions
from ssv.bench.e2e_steps import run_steps
from ssv.engine.device_round import DeviceEngine
from ssv.engine.generate import generate_ar
from ssv.engine.runner import Runner
from ssv.engine.spec import SpecOptions, generate_spec
from ssv.spec.accept import SamplingParams
from ssv.spec.fallback import ArFallback
from ssv.spec.tree import TreeSpec

MODES = ("ar-nsa", "sd-naive", "ssv strict", "ssv strict no-fallback", "ssv strict lookup", "sd-naive lookup",
         "ssv approx C16", "ssv approx C16 reuse/2", "ar dense", "eagle3 dense", "eagle3 dense lookup", "transformers")
# the lookup modes: the head's tree LOOKUP nodes smaller, a chain of up to LOOKUP tokens from the
# context in their rows (spares: the same 48 rows a round, a graph's fixed shape; ssv.spec.lookup).
# The dense baseline gets the same chain: drafting from the context is not NSA's
LOOKUP = 8
GREEDY = SamplingParams(temperature=0.0)
QUESTION = "\n\nWhat is the text above about? Answer in a few sentences."


def mode_table(n_layers: int, tree: TreeSpec) -> dict:
    """mode -> (attention, SpecOptions or None for AR)."""
    def so(c, precision="strict", every=1, lookup=0):
        t = TreeSpec(tree.depth, tree.top_k, tree.total_tokens - lookup)
        return SpecOptions(tree=t, order="pos", verify=VerifyOptions(c, precision, VerifyOptions.every(every, n_layers)),
                           lookup=lookup)
    return {"ar-nsa": ("nsa", None), "sd-naive": ("nsa", so(1)), "ssv strict": ("nsa", so(4)),
            "ssv strict no-fallback": ("nsa", so(4)), "ssv strict lookup": ("nsa", so(4, lookup=LOOKUP)),
            "sd-naive lookup": ("nsa", so(1, lookup=LOOKUP)),
            "eagle3 dense lookup": ("dense", so(1, lookup=LOOKUP)),
            "ssv approx C16": ("nsa", so(16, "approx")), "ssv approx C16 reuse/2": ("nsa", so(16, "approx", 2)),
            "ar dense": ("dense", None), "eagle3 dense": ("dense", so(1))}


# the ssv modes fall back to AR steps while speculation does not pay (`ArFallback`, as `ssv generate
# --mode ssv` does); the baselines speculate every round, as published
FALLBACK = ("ssv strict", "ssv strict lookup", "ssv approx C16", "ssv approx C16 reuse/2")


def prompt_ids(tok, family: str, text: str, context: int, end: int | None = None) -> list:
    """`context` tokens of a document that end at its token `end` (default: `context`, the document's
    start); chat: the document's tokens before `end` cut to fit, a question, the chat template. With one
    `end` for every context, each context length continues the same text (`ssv bench spec --aligned`)."""
    ids = tok.encode(text)
    if end is not None and end < context:
        raise ValueError(f"a prompt of {context} tokens cannot end at token {end}")
    if family != "chat":
        end = context if end is None else end
        if len(ids) < end:
            raise ValueError(f"a {family} document has {len(ids)} tokens, fewer than {end}")
        return ids[end - context:end]
    overhead = len(tok.encode(tok.apply_chat_template([{"role": "user", "content": QUESTION}],
                                                      add_generation_prompt=True)))
    n = max(16, context - overhead)   # the document's tokens in the prompt
    end = n if end is None else end
    body = tok.decode(ids[max(0, end - n):end])
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": body + QUESTION}],
                                              add_generation_prompt=True))[:context]


def profile_run(engine: DeviceEngine, opts, params: SamplingParams, stats: dict) -> dict:
    """`profile_rounds` after a generation with these `stats`. A fall-back run may end on AR steps whose
    drafter rows wait: they are committed first, so that the first profiled round is not also the
    catch-up; a run of AR steps alone (the fall-back never let a round run) is profiled as AR steps,
    not as the rounds it never ran (until session 34 such rows reported a round's launches)."""
    engine.catch_up()
    spec_ran = opts is not None and stats.get("rounds", 0) > 0
    prof = profile_rounds(engine, opts if spec_ran else None, params)
    prof["profiled"] = "rounds" if spec_ran else "ar steps"
    return prof


def compare_to_ar(mode: str, att: str, tokens: list, ref: dict, greedy: bool) -> tuple:
    """(the reference tokens or None, the first difference or None) of a run against the AR run of its
    attention in `ref`, which only the AR modes fill: a run without one compares nothing (until
    session 34 the first mode of an attention became its reference, so a run without ar-nsa compared
    sd-naive with itself). Sampled texts differ by design (lossless in distribution): no difference."""
    key = "ar dense" if att == "dense" else "ar-nsa"
    if mode == key:
        ref.setdefault(key, tokens)
    base = ref.get(key)
    if base is None or not greedy:
        return base, None
    return base, first_diff(tokens, base)


def profile_rounds(engine: DeviceEngine, opts, params: SamplingParams | None = None, rounds: int = 12) -> dict:
    """Kernel launches per round and the kernel-busy fraction of `rounds` more rounds (graph replays),
    overlapped as the generation loops run them (round r + 1 launched before round r is read), with
    the run's sampling parameters: a sampled round replays other graphs than a greedy one (until
    session 34 the sampled rows reported the greedy round's launches)."""
    from torch.profiler import ProfilerActivity, profile
    launch = ((lambda: engine.launch_ar(params)) if opts is None
              else (lambda: engine.launch_spec(opts, params)))
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        flight = launch()
        for _ in range(rounds - 1):
            nxt = launch()
            engine.finish(flight)
            flight = nxt
        engine.finish(flight)
        sync()
        wall = time.perf_counter() - t0
    kern = [e for e in prof.events() if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()
            and "memset" not in e.name.lower()]
    spans = sorted((e.time_range.start, e.time_range.end) for e in kern)
    busy, end = 0.0, float("-inf")
    for a, b in spans:  # union of kernel intervals (us)
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    return {"launches_per_round": len(kern) / rounds if kern else None,
            "gpu_busy_fraction": busy * 1e-6 / wall if kern else None, "profiled_rounds": rounds}


def ar_margin(runner: Runner, prompt: list, ar_tokens: list, at: int):
    """ar's top-2 logit margin at token `at`, from its own decode step (`generate_ar`'s host steps,
    which pick ar's tokens; None if they do not). Not a teacher-forced prefill's logits: in bf16
    those differ from the step's (code 8K, token 53: 0.81 against the step's 0.17, bench/NOTES.md
    "Session 20"), and the near-tie criterion is about the choice AR decoding made."""
    res = generate_ar(runner, prompt, GREEDY, at + 1, margins=True)
    if res.token_ids[:at] != list(ar_tokens[:at]):
        return None
    return res.stats["top2_margins"][at]


def first_diff(a, b):
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)


def hf_generate(model, ids: list, new_tokens: int, max_cache: int, params: SamplingParams = GREEDY):
    """transformers' own generate on the same weights, static cache (its auto-compiled decode), greedy
    or sampled as `params` (no top-k: transformers' default of 50 would be another distribution).
    Returns (token ids, decode tok/s)."""
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache
    cache = getattr(model, "_hf", None)
    if cache is None:
        c = model.cfg
        cfg = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                          num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
                          head_dim=c.head_dim, rms_norm_eps=c.norm_eps, rope_theta=c.rope.theta,
                          tie_word_embeddings=c.tie_embeddings, max_position_embeddings=max(c.max_seq_len, max_cache))
        hf = LlamaForCausalLM(cfg).to(device="cuda", dtype=next(model.parameters()).dtype).eval()
        sd = {("lm_head.weight" if k == "lm_head.weight" else "model." + k): v for k, v in model.state_dict().items()}
        hf.load_state_dict(sd, strict=False)
        if c.tie_embeddings:
            hf.tie_weights()
        model.__dict__["_hf"] = cache = hf
    hf = cache
    x = torch.tensor([ids], device="cuda")

    def run(n):
        kv = StaticCache(config=hf.config, max_cache_len=max_cache)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        how = (dict(do_sample=False) if params.greedy else
               dict(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0))
        out = hf.generate(x, max_new_tokens=n, past_key_values=kv, min_new_tokens=n, pad_token_id=0, **how)
        torch.cuda.synchronize()
        return out[0, len(ids):].tolist(), time.perf_counter() - t0
    run(new_tokens)                # compiles / warms at this prompt length
    _, t1 = run(1)
    toks, tn = run(new_tokens)
    return toks, (new_tokens - 1) / max(tn - t1, 1e-9)


def sampling(args) -> SamplingParams:
    """The runs' sampling parameters (greedy by default, as the issue's table)."""
    return SamplingParams(temperature=getattr(args, "temperature", 0.0), top_p=getattr(args, "top_p", 1.0))


def run_default(args, env: dict, save) -> list:
    from ssv.cli import load_model
    from ssv.draft import load_drafter
    model, tok = load_model(args.model, "cuda")
    drafter = load_drafter(args.draft, model)
    tree = TreeSpec(depth=6, top_k=8, total_tokens=48)
    table = mode_table(model.cfg.n_layers, tree)
    max_len = max(args.contexts) + args.new_tokens + 256      # room for the profiled extra rounds
    runners = {a: Runner(model, attention=a, max_len=max_len) for a in ("nsa", "dense")}
    engines = {a: DeviceEngine(r, drafter) for a, r in runners.items()}
    with open(args.prompts) as f:
        texts = json.load(f)
    rows = []

    params = sampling(args)

    def run_mode(mode, ids, warm=False):
        att, opts = table[mode]
        r, eng = runners[att], engines[att]
        eng.timing, eng.phase_ms = True, {}
        if opts is None:
            res = generate_ar(r, ids, params, args.new_tokens, engine=eng, seed=args.seed)
        else:
            fb = None
            if mode in FALLBACK:  # the warm-up forces a burst: the fall-back's graphs are captured too
                # with a lookup a round accepts more than the head's agreement says: rounds alone judge
                extra = {"use_agreement": False} if opts.lookup else {}
                fb = (ArFallback(slack=0, min_ar=4, max_ar=4, prior_break_even=1e9, **extra) if warm
                      else ArFallback(**extra))
            res = generate_spec(r, drafter, ids, params, args.new_tokens, opts=opts, engine=eng, fallback=fb,
                                seed=args.seed)
        eng.timing = False
        split = {k: sum(v) / len(v) for k, v in eng.phase_ms.items() if v}
        return res, split, profile_run(eng, opts, params, res.stats)

    # warm-up: every mode's graphs captured and kernels compiled before anything is timed
    warm_ids = prompt_ids(tok, "code", texts["code"][0], min(args.contexts))
    for mode in table:
        if mode in args.modes:
            run_mode(mode, warm_ids, warm=True)
    for context in args.contexts:   # context-major: a run cut short still covers every family
        for family in args.families:
            for d, text in enumerate(texts[family][: args.docs]):
                ids = prompt_ids(tok, family, text, context)
                ref = {}
                # repeats interleave the modes (all modes, then all again), so that a drift of the
                # machine's speed falls on every mode alike; summaries pair each rep with ar-nsa's
                for rep, mode in [(i, m) for i in range(args.repeats) for m in MODES if m in args.modes]:
                    # the cache's capacity sizes the kernels' grids (a 4K step in a cache for 8K measured
                    # ~9% slower, bench/NOTES.md): a row's numbers depend on the run's largest context
                    row = {"family": family, "context": len(ids), "target_context": context, "doc": d, "rep": rep,
                           "mode": mode, "cache_capacity": max_len}
                    try:
                        if mode == "transformers":
                            toks, tps = hf_generate(model, ids, args.new_tokens, max_len, params)
                            row.update(tokens_per_second=tps, mean_accepted_length=1.0, token_ids=toks,
                                       identical_to_ar=(toks == ref["ar dense"]) if params.greedy and "ar dense" in ref
                                       else None)
                        else:
                            res, split, prof = run_mode(mode, ids)
                            att = table[mode][0]
                            base, diff = compare_to_ar(mode, att, res.token_ids, ref, params.greedy)
                            row.update(tokens_per_second=res.stats["tokens_per_second"],
                                       mean_accepted_length=res.stats["mean_accepted_length"],
                                       rounds=res.stats["rounds"], decode_seconds=res.stats["decode_seconds"],
                                       # time to the first token: the prompt's prefill (graphed), then
                                       # setup (warm: the graphs are already captured)
                                       prefill_seconds=res.stats["prefill_seconds"],
                                       setup_seconds=res.stats.get("setup_seconds"),
                                       round_ms=split,
                                       identical_to_ar=(diff is None) if params.greedy and base is not None else None,
                                       first_diff=diff,
                                       token_ids=res.token_ids, ar_steps=res.stats.get("ar_steps", 0), **prof)
                            if "fallback" in res.stats:
                                row["fallback"] = res.stats["fallback"]
                            if diff is not None and table[mode][1] is not None and rep == 0:
                                row["ar_margin_at_diff"] = ar_margin(runners[att], ids, base, diff)
                    except Exception as e:  # noqa: BLE001 -- a failing mode is reported, not fatal
                        row["error"] = f"{type(e).__name__}: {e}"[:400]
                        print(f"{family} {context} {mode}: {row['error']}", file=sys.stderr)
                    rows.append(row)
                    print(_line(row), flush=True)
                    save(rows)
    return rows


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['family']:6s} {r['context']:6d} {r['mode']:24s} error"
    rm = r.get("round_ms") or {}
    return (f"{r['family']:6s} {r['context']:6d} {r['mode']:24s} {r['tokens_per_second']:8.1f} tok/s  "
            f"MAL {r['mean_accepted_length']:.2f}  identical {r.get('identical_to_ar')}  "
            + " ".join(f"{k} {v:.3f}ms" for k, v in rm.items())
            + (f"  launches {r['launches_per_round']:.0f} busy {r['gpu_busy_fraction']:.2f}"
               if r.get("launches_per_round") else ""))


def summarize(rows: list) -> list:
    """Per (family, context, mode): tok/s and MAL averaged over documents, each document's tok/s the
    median of its repeats; the speedup the median over (document, repeat) of the ratio to ar-nsa's
    run of the same document and repeat (interleaved, so both saw the same machine), with its range."""
    out, groups = [], {}
    for r in rows:
        if "error" not in r:
            groups.setdefault((r["family"], r["target_context"], r["mode"]), []).append(r)
    for (fam, ctx, mode), rs in groups.items():
        base = {(x.get("doc", 0), x.get("rep", 0)): x["tokens_per_second"]
                for x in groups.get((fam, ctx, "ar-nsa"), [])}

        def mean(key, rr=rs):
            vals = [x[key] for x in rr if x.get(key) is not None]
            return sum(vals) / len(vals) if vals else None
        docs = sorted({x.get("doc", 0) for x in rs})
        tps = statistics.fmean(statistics.median(x["tokens_per_second"] for x in rs if x.get("doc", 0) == d)
                               for d in docs)
        ratios = [x["tokens_per_second"] / base[k] for x in rs
                  if (k := (x.get("doc", 0), x.get("rep", 0))) in base and base[k]]
        r0 = min(x.get("rep", 0) for x in rs)   # a mode whose runs all came in later repeats counts too
        first = [x for x in rs if x.get("rep", 0) == r0]
        out.append({"family": fam, "context": ctx, "mode": mode, "tokens_per_second": tps,
                    "mean_accepted_length": mean("mean_accepted_length"),
                    "speedup_vs_ar_nsa": statistics.median(ratios) if ratios else None,
                    "speedup_range": [min(ratios), max(ratios)] if ratios else None,
                    "gpu_busy_fraction": mean("gpu_busy_fraction"), "launches_per_round": mean("launches_per_round"),
                    # None where no run compares (sampled runs: their texts differ by design)
                    "identical_to_ar": (sum(bool(x.get("identical_to_ar")) for x in first)
                                        if any(x.get("identical_to_ar") is not None for x in first) else None),
                    "docs": len(docs),
                    "repeats": len(rs) // max(1, len(docs))})
    return out


def plot(summary: list, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fams = sorted({s["family"] for s in summary})
    fig, axes = plt.subplots(1, len(fams), figsize=(5 * len(fams), 4), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        for mode in MODES:
            pts = sorted((s["context"], s["tokens_per_second"]) for s in summary
                         if s["family"] == fam and s["mode"] == mode and s["tokens_per_second"])
            if pts:
                ax.plot(*zip(*pts), marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_title(fam)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("tok/s")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_args(p) -> None:
    p.add_argument("--model", default="default")
    p.add_argument("--draft", default="default")
    p.add_argument("--prompts", default=".stage/e2e-prompts.json", help="scripts/make_e2e_prompts.py's JSON")
    p.add_argument("--families", nargs="+", default=["code", "prose", "chat"])
    p.add_argument("--contexts", nargs="+", type=int, default=[1024, 2048, 4096, 8192])
    p.add_argument("--docs", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1,
                   help="run every mode this many times per document, interleaved; summaries take medians")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--modes", nargs="+", default=list(MODES))
    p.add_argument("--steps", nargs="*", type=int, default=None, metavar="CONTEXT",
                   help="also (or with --no-default, only) the step table at these contexts (random weights of "
                        "--steps-shape, Llama-3.1-8B by default)")
    p.add_argument("--steps-shape", default="llama3.1-8b", choices=["llama3.1-8b", "smollm2-135m"],
                   help="the step table's model shape (random bf16 weights)")
    p.add_argument("--no-default", action="store_true", help="skip the default-model part")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="> 0: every mode samples (texts differ from ar's by design; e2e-cuda-sampled.json)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results")


def keep_earlier(doc: dict, old: dict) -> dict:
    """A run in several calls: `doc` (this call's, still empty) takes the results of an earlier file of
    the same commit and sampling, and every part's environment in `parts_env` (each call may land on
    another card: until session 34 the merged file named only the last call's)."""
    if old.get("env", {}).get("commit") != doc["env"]["commit"] or old.get("sampling") != doc["sampling"]:
        return doc
    doc.update({k: old.get(k, []) for k in ("summary", "steps", "rows")})
    doc["parts_env"] = old.get("parts_env", [old["env"]]) + [doc["env"]]
    return doc


def cmd_bench_e2e(args) -> int:
    from ssv.bench.env import environment
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    if args.docs < 1:
        raise ValueError(f"--docs must be >= 1, got {args.docs}")
    low = min(args.contexts + (args.steps or []))
    if low < 1:
        raise ValueError(f"--contexts and --steps must be positive token counts, got {low}")
    if not torch.cuda.is_available():
        raise ValueError("ssv bench e2e needs a CUDA GPU")
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown modes {bad}; choose from {list(MODES)}")
    if not args.no_default and not os.path.isfile(args.prompts):
        raise FileNotFoundError(f"--prompts {args.prompts} not found (make it with scripts/make_e2e_prompts.py)")
    params = sampling(args)   # bad values fail here, before a model loads
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "e2e-cuda.json" if params.greedy else "e2e-cuda-sampled.json")
    doc = {"env": environment(), "sampling": {"temperature": params.temperature, "top_p": params.top_p,
                                              "seed": args.seed}, "summary": [], "steps": [], "rows": []}
    if os.path.isfile(path):  # a run in several calls: keep the other part's results
        with open(path) as f:
            keep_earlier(doc, json.load(f))

    def save(rows=None):
        if rows is not None:
            doc["rows"], doc["summary"] = rows, summarize(rows)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
    if args.steps is not None:
        doc["steps"] = []
        run_steps(args.steps or ([8192, 16384, 32768, 65536, 131072] if args.steps_shape == "llama3.1-8b"
                                 else [1024, 4096, 8192, 16384]), doc["steps"], save, args.steps_shape)
        save()
    if not args.no_default:
        run_default(args, doc["env"], save)
        print("\nfamily context mode tok/s MAL speedup busy launches identical")
        for s in doc["summary"]:
            f = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
            print(f"{s['family']} {s['context']} {s['mode']:24s} {f(s['tokens_per_second'], 1)} "
                  f"{f(s['mean_accepted_length'])} {f(s['speedup_vs_ar_nsa'])} {f(s['gpu_busy_fraction'])} "
                  f"{f(s['launches_per_round'], 0)} {'-' if s['identical_to_ar'] is None else s['identical_to_ar']}/{s['docs']}")
        plot(doc["summary"], os.path.join(args.out, "e2e-cuda.png"))
    save()
    print(f"wrote {path}")
    return 0
