"""`ssv` command line: generate, ppl (and bench / train-draft where installed)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

MODES = ("ar", "sd-naive", "ssv")


def _die(msg: str) -> "None":
    print(f"ssv: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def load_model(spec: str, device: str, dtype: str | None = None, progress: bool = True):
    """Load a checkpoint into a Transformer on `device`. Returns (model, tokenizer)."""
    import torch

    from ssv.loaders import load_checkpoint
    from ssv.model import Transformer
    from ssv.model.layers import rope_inv_freq

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but no CUDA device is available")
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
        dtype or ("bfloat16" if device == "cuda" else "float32")]
    t0 = time.perf_counter()
    ck = load_checkpoint(spec)
    with torch.device("meta"):
        model = Transformer(ck.config)
    model = model.to_empty(device="cpu")
    model.load_hf_state_dict(ck.state_dict)
    model = model.to(device=device, dtype=dt).eval()
    # to_empty left the non-persistent RoPE buffer uninitialised: rebuild it, in fp32 whatever the weights
    model.inv_freq = rope_inv_freq(ck.config.head_dim, ck.config.rope).to(device)
    if progress:
        print(f"loaded {ck.source} in {time.perf_counter() - t0:.1f}s ({dt}, {device})", file=sys.stderr)
        if device == "cuda":
            from ssv.ops.linear.policy import tiles_measured
            name = torch.cuda.get_device_name(0)
            if tiles_measured(name) is None:
                print(f"note: no small-M linear tiles for {name}: the decode GEMMs run on cuBLAS "
                      "(`ssv bench linear --pdl --batch-invariant --rope --save` measures them for this GPU)",
                      file=sys.stderr)
    return model, ck.tokenizer


def _prompt_text(args) -> str:
    if args.prompt is not None and args.prompt_file is not None:
        raise ValueError("give either --prompt or --prompt-file, not both")
    if args.prompt_file is not None:
        if os.path.isdir(args.prompt_file):
            raise ValueError(f"--prompt-file {args.prompt_file} is a folder, not a text file")
        if not os.path.isfile(args.prompt_file):
            raise FileNotFoundError(f"prompt file not found: {args.prompt_file}")
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise ValueError(f"prompt file {args.prompt_file} is not UTF-8 text ({e.reason} at byte "
                             f"{e.start})") from None
    elif args.prompt is not None:
        text = args.prompt
    else:
        raise ValueError("no prompt: give --prompt TEXT or --prompt-file F")
    if not text.strip():
        raise ValueError("empty prompt")
    return text


def encode_prompt(tok, text: str, chat: bool) -> list:
    """A prompt's token ids: the text as the user's turn of the chat template (chat), or as it is."""
    if tok is None:
        raise ValueError("this checkpoint has no tokenizer; ssv needs tokenizer.json beside it")
    if chat:
        text = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return tok.encode(text)


def _check_generate(args) -> tuple:
    """Refuse bad options before the model loads (seconds on the CPU, more for a large checkpoint):
    the prompt's source and text, the new-token count, and for the speculative modes the tree, the
    verification options, the head's config and the profile. Returns (the prompt's text, the loaded
    profile or None)."""
    if args.record_routing and os.path.isdir(args.record_routing):
        raise ValueError(f"--record-routing {args.record_routing} is a folder: give the file to write")
    if args.record_routing and not os.path.isdir(os.path.dirname(os.path.abspath(args.record_routing))):
        raise FileNotFoundError(f"--record-routing: folder of {args.record_routing} does not exist")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    check_seed(args.seed, "--seed")
    given = unread_options(args.mode, vars(args))
    if given:
        flag = "--no-fallback" if given[0] == "fallback" else "--" + given[0].replace("_", "-")
        raise ValueError(f"{flag} does not apply to --mode {args.mode}"
                         + (" (every query is verified on its own there)" if args.mode == "sd-naive" else ""))
    text, profile = _prompt_text(args), None
    if args.mode != "ar":
        opts = _spec_options(args, n_layers=1)   # the refresh schedule's length is the model's; its rules are not
        if not (args.host_round or args.record_routing):   # the device round keeps exactly the tree's nodes
            from ssv.spec.device import check_spec
            check_spec(opts.tree)
        if args.draft != "default":
            from ssv.draft.io import read_config
            read_config(args.draft)
        if args.profile:
            from ssv.spec.planner import Profile
            profile = Profile.load(args.profile)   # --mode ssv: the other modes refuse it above
    return text, profile


# the speculative modes' options and their defaults (an option left at its default is not a choice the user
# made): mode "ar" reads none of them, "sd-naive" the first group only
SPEC_OPTIONS = {"draft": "default", "tree_depth": None, "tree_topk": None, "tree_tokens": None, "traversal": "pos",
                "lookup": None}
SSV_OPTIONS = {"group_size": 4, "precision": "strict", "refresh_every": 1, "profile": None, "fallback": True}


def unread_options(mode: str, options: dict) -> list:
    """The names in `options` set away from their defaults that `mode` does not read: refused, not ignored (a
    run would not be what was asked). The command line and the API (`ssv.api`) both check with it."""
    unread = {**SPEC_OPTIONS, **SSV_OPTIONS} if mode == "ar" else SSV_OPTIONS if mode == "sd-naive" else {}
    return [k for k, d in unread.items() if k in options and options[k] != d]


def check_seed(seed: int, name: str) -> None:
    if not -2 ** 63 <= seed < 2 ** 64:   # what torch's generators take
        raise ValueError(f"{name} must be in [-2^63, 2^64), got {seed}")


def cmd_generate(args) -> int:
    from ssv.engine.generate import generate_ar
    from ssv.engine.runner import Runner
    from ssv.spec.accept import SamplingParams

    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p)
    except ValueError as e:   # named as the flags the user typed
        raise ValueError(str(e).replace("SamplingParams.temperature", "--temperature")
                         .replace("SamplingParams.top_p", "--top-p")) from None
    text, profile = _check_generate(args)
    model, tok = load_model(args.model, args.device, args.dtype, progress=not args.json)
    ids = encode_prompt(tok, text, args.chat)
    record = [] if args.record_routing else None
    runner = Runner(model, attention=args.attention, record=record)
    # decoding runs the device-resident round (graphed on CUDA unless --eager), greedy or sampled;
    # --record-routing and --host-round keep the host round
    use_engine = record is None and not args.host_round
    if args.mode == "ar":
        engine = _engine(args, runner) if use_engine else None
        res = generate_ar(runner, ids, params, args.max_new_tokens, seed=args.seed, stop_ids=tok.eos_ids,
                          progress=not args.json, engine=engine)
    else:
        from ssv.engine.spec import generate_spec
        drafter, opts = _spec_setup(args, model)
        planner = None
        if profile is not None:
            from ssv.spec.planner import AdaptivePlanner
            # strict unless --precision approx: then the profile's approximate strategies may be chosen too
            planner = AdaptivePlanner(profile, model.cfg.n_layers,
                                      allow_approx=args.precision == "approx")
        engine = _engine(args, runner, drafter) if use_engine else None
        fallback = fallback_for(args.device, opts) if args.mode == "ssv" and args.fallback else None
        res = generate_spec(runner, drafter, ids, params, args.max_new_tokens, opts, seed=args.seed,
                            stop_ids=tok.eos_ids, progress=not args.json, planner=planner, engine=engine,
                            fallback=fallback)
    gen = [t for t in res.token_ids if t not in tok.eos_ids]
    text = tok.decode(gen)
    if record is not None:
        _save_routing(args.record_routing, record, args)
    if args.json:
        from ssv.bench.env import environment
        # where it ran (device, versions, date, commit): a run's JSON is a record by itself
        env = environment("cuda" if runner.device.type == "cuda" else "cpu")
        out = {"token_ids": res.token_ids, "text": text, "mode": args.mode, "attention": args.attention,
               "model": args.model, "dtype": str(runner.cache.k.dtype).removeprefix("torch."), "stats": res.stats,
               "env": env}
        from ssv.ops.linear.cpu import cpu_forms, uses_forms
        if uses_forms(runner.device, runner.cache.k.dtype):   # the forms round differently: a run's record
            out["cpu_gemm"] = list(cpu_forms())
        print(json.dumps(out))
    else:
        print(text)
        s = res.stats
        spec = f", mean accepted length {s['mean_accepted_length']:.2f}" if args.mode != "ar" and s["rounds"] else ""
        if s.get("ar_steps"):
            spec += f", {s['ar_steps']} AR fall-back steps"
            ag = s.get("fallback", {}).get("agreements")
            if not s["rounds"] and ag:   # why no round ran: the drafts' estimate against the cost of a round
                spec += (f" (drafts would accept ~{ag[-1]['expected_length']:.2f} tokens a round; a round "
                         f"pays from {s['fallback']['break_even']:.2f})")
        setup = s.get("setup_seconds", 0.0)
        # a first run on a machine compiles the kernels (Triton caches them on disk) and captures the graphs
        setup = f", setup {setup:.2f}s (kernel compiles, graph capture)" if setup >= 0.01 else ""
        print(f"[{s['new_tokens']} tokens, {s['tokens_per_second']:.1f} tok/s decode, prefill "
              f"{s['prefill_seconds']:.2f}s{setup}, {s['rounds']} rounds{spec}]", file=sys.stderr)
        if s.get("stop") == "context" and s["new_tokens"] < args.max_new_tokens:
            print(f"note: stopped at the context limit of {runner.context_limit} tokens after {s['new_tokens']} of "
                  f"--max-new-tokens {args.max_new_tokens} (the prompt has {len(ids)})", file=sys.stderr)
    return 0


def _engine(args, runner, drafter=None):
    from ssv.engine.device_round import DeviceEngine
    return DeviceEngine(runner, drafter, graphs=args.device == "cuda" and not args.eager)


# The default trees (depth, top-k, nodes, the root included). On the CPU the tree follows how the
# BLAS prices a step's rows (ssv/ops/linear/cpu.py: with SSV_CPU_GEMM its form for 4 rows, as below;
# calibrated, the measured cost of a 4th row, `FOURTH_ROW`):
# - "linear" (MKL's F.linear; the Intel VM of sessions 11-20): it streams the weights at up to 3 rows
#   but takes a slower kernel from 4 (a 2K target step 67 ms at 3 rows, 86 at 4:
#   bench/results/cpu-prefill/prefill-8fd468b-run2.json), so 3-node trees: at 2K 2x2x3 ran
#   1.22-1.24x / 1.18-1.22x / 1.10-1.13x ar on code / prose / chat where 4-node trees ran 0.87-1.06x
#   (bench/results/spec-cpu-2k-small-trees-bae657d.json, spec-cpu-2k-3node-trees-bae657d.json);
# - "transposed" (session 24's AMD VM): 4 rows cost what 3 do (20.8 against 20.6 ms of layer GEMMs a step,
#   bench/results/cpu-gemm/gemm-forms-c05e736.json),
#   and 2x2x4's higher MAL made it 0.97x / 1.17x / 1.05x 2x2x3's tok/s on code / prose / chat (medians
#   of 12 paired repeats in four runs, bench/results/cpu-gemm/);
# - "packed" (oneDNN's packed weights; session 25, the same kind of VM): 6 rows cost little more than 4,
#   but 6-node trees gained too little MAL: 2x2x4 1.22x / 1.24x / 1.06x ar on code / prose / chat,
#   2x3x6 1.13x / 1.20x / 1.13x, 3x2x6 1.08x / 1.19x / 1.08x (bench/results/cpu-packed/spec-cpu-2k-trees.json).
DEFAULT_TREE = (6, 8, 48)
CPU_TREES = {"linear": (2, 2, 3), "transposed": (2, 2, 4), "packed": (2, 2, 4)}
# and the chain looked up from the text beside it (ssv.spec.lookup; the CPU verifies only the chain's
# new tokens), on every form: with the packed form (session 29's AMD VM) at 2K, 2x2x4 with up to 3
# looked-up tokens ran 1.63-1.65x / 1.99-2.02x / 1.25x ar on code / prose / chat against 2x2x4's
# 1.21-1.25x / 1.32-1.34x / 1.17-1.19x in the same run (bench/results/cpu-s29/spec-2k-paired-lookup3-compact,
# each ratio over an ar stepped between its rounds); with the 3 rows always verified (spares)
# 1.51-1.54x / 1.79-1.83x / 1.14-1.15x (spec-2k-paired-lookup3). With F.linear (session 34's Intel VM,
# SSV_CPU_GEMM=linear), 2x2x3 with the chain ran 1.67x / 1.85x / 1.22x against 2x2x3's 1.28x / 1.29x /
# 1.20x (bench/results/cpu-s34/spec-2k-paired-linear-lookup3-compact). Session 34 also found that
# VM's 4-row form flipping between F.linear and packed from one process to the next (their times
# within MARGIN): a lookup by form switched the CPU's strategy at random; the transposed form's
# machine (session 24's) is gone and unmeasured
CPU_LOOKUP = 3
# The graphed CUDA round's default: the 48 rows of DEFAULT_TREE as a 6x8x40 head tree and a chain of up
# to 8 from the context in its spare rows. H200, bf16, greedy, 128 tokens, one document a family, at
# 1K / 2K / 4K / 8K, against 6x8x48 in the same process: code 1.57 -> 2.53x, 1.63 -> 2.93x, 2.45 -> 3.10x,
# 2.12 -> 2.41x ar-nsa; prose 1.21 -> 1.90x, 1.43 -> 2.13x, 1.28 -> 2.84x, 1.23 -> 2.42x; chat 1.20 ->
# 1.48x, 1.20 -> 1.29x, 1.14 -> 1.11x, 1.51 -> 2.26x (bench/results/gpu-s31/e2e-cuda-*-3a47002.json)
GPU_LOOKUP = 8
CPU_TREE = CPU_TREES["linear"]   # the smallest (the help text's depth and top-k)
# A calibrated machine (no SSV_CPU_GEMM) takes the 4-node tree only where its 4 rows' GEMMs cost at most
# FOURTH_ROW times its 3 rows' (each in the form it chose): a fourth node that costs a round little.
# Session 36's Intel VM, calibrated on the step's own weight shapes: F.linear at 3 rows 7.5-8.4 ms,
# packed at 4 rows 9.0-9.6 (1.13-1.20x, bench/results/cpu-s36/cpu-forms-repeat-after.json); there 2x2x3 with the lookup ran 1.79x / 2.01x / 1.27x ar on code / prose /
# chat against 2x2x4's 1.66x / 2.00x / 1.27x (bench/results/cpu-s36/). Session 24's AMD VM priced 4
# rows as 3 (20.8 against 20.6 ms, above), where 2x2x4 won. The bound sits midway: the Intel VM's
# calibrations read 1.13-1.20 in 8 processes (bench/results/cpu-s36/cpu-forms-repeat-after.json)
FOURTH_ROW = 1.09


def cpu_tree() -> tuple:
    """The CPU's default tree for `--mode ssv`: by what this machine's calibration measured a 4th row
    to cost (`FOURTH_ROW`), or by the fixed GEMM form for 4 rows (`SSV_CPU_GEMM`)."""
    from ssv.ops.linear.cpu import cpu_form, row_cost
    t3, t4 = row_cost(3), row_cost(4)
    if t3 is None or t4 is None:
        return CPU_TREES[cpu_form(4)]
    return (2, 2, 4) if t4 <= FOURTH_ROW * t3 else (2, 2, 3)


def cpu_lookup() -> int:
    """The CPU's default context lookup for `--mode ssv` (CPU_LOOKUP, on every GEMM form)."""
    return CPU_LOOKUP


# The AR fall-back's break-even (round / AR step) before both are timed. A 48-node round on the H200
# costs ~2.1 AR steps (bench/results/e2e-cuda-e513856.json). On the CPU, by the BLAS form for 4 rows:
# the Intel VM's 3-node round cost 1.27-1.35 AR steps (its MAL over its speedup in the runs above),
# session 24's AMD VM's 4-node round 1.58-1.62 (bench/results/cpu-gemm/round-costs-2k-2x2x4-*.json), and
# with the packed form 1.46-1.50 (bench/results/cpu-packed/round-costs-2k-2x2x4-*.json).
CPU_BREAK_EVEN = {"linear": 1.3, "transposed": 1.6, "packed": 1.5}
# with the lookup (MAL over tok/s): packed 2x2x4 1.54-1.60 (cpu-s29), linear 2x2x3 1.48-1.59 (cpu-s34)
CPU_BREAK_EVEN_LOOKUP = {"linear": 1.6, "packed": 1.6}


def fallback_for(device: str, opts):
    """--mode ssv's AR fall-back on `device` for the round `opts` (its break-even prior by the CPU's GEMM form)."""
    from ssv.spec.fallback import ArFallback
    # with a lookup a round accepts more than the head's agreement estimates: rounds alone judge
    extra = {"use_agreement": False} if opts is not None and opts.lookup else {}
    if device != "cpu" or opts is None:
        return ArFallback(**extra)
    from ssv.ops.linear.cpu import cpu_form
    form = cpu_form(4)
    small = opts.tree.total_tokens <= cpu_tree()[2]   # no larger than the machine's own tree
    if not small:
        return ArFallback(**extra)
    # the packed form's 2x2x4 round with a lookup of 3 cost 1.54-1.60 AR steps at 2K (1.42 without;
    # MAL over tok/s in bench/results/cpu-s29/spec-2k-paired-lookup3-compact), its rows grown by the chain's
    prior = CPU_BREAK_EVEN_LOOKUP.get(form, CPU_BREAK_EVEN[form]) if opts.lookup else CPU_BREAK_EVEN[form]
    return ArFallback(prior_break_even=prior, **extra)


def spec_options(mode: str, device: str, n_layers: int, tree=(None, None, None), lookup=None, group_size: int = 4,
                 precision: str = "strict", refresh_every: int = 1, traversal: str = "pos"):
    """The tree and verification options of mode 'sd-naive' / 'ssv' (validated). tree: (depth, top-k,
    nodes) with None for the default's; lookup None: the default's (see DEFAULT_TREE / CPU_TREES)."""
    from ssv.attention import VerifyOptions
    from ssv.engine.spec import SpecOptions
    from ssv.spec.tree import TreeSpec

    given = tuple(tree)
    # the CPU's profile tree only when no tree option is given (a partial choice fills in the default)
    cpu = device == "cpu" and mode == "ssv" and all(v is None for v in given)
    # the GPU's lookup in the default tree's rows only when neither the tree nor the lookup is given
    gpu = device != "cpu" and mode == "ssv" and all(v is None for v in given) and lookup is None
    shape = cpu_tree() if cpu else DEFAULT_TREE[:2] + (DEFAULT_TREE[2] - GPU_LOOKUP,) if gpu else DEFAULT_TREE
    spec = TreeSpec(*(v if v is not None else d for v, d in zip(given, shape)))
    if mode == "sd-naive":  # every verification query on its own, as a decode kernel would
        verify = VerifyOptions(group_size=1, precision="strict")
    else:
        verify = VerifyOptions(group_size=group_size, precision=precision,
                               refresh=VerifyOptions.every(refresh_every, n_layers))
    lookup = lookup if lookup is not None else (cpu_lookup() if cpu else GPU_LOOKUP if gpu else 0)
    if spec.total_tokens < 2 and not lookup:
        raise ValueError("a tree of 1 node is the root alone: nothing would be drafted (give 2 nodes or more, "
                         "or a lookup)")
    # the CPU verifies only the chain's new tokens (a row costs there); a graphed round, fixed rows
    return SpecOptions(tree=spec, order=traversal, verify=verify, lookup=lookup, spares=device != "cpu")


def _spec_options(args, n_layers: int):
    """`spec_options` from the command line's flags."""
    return spec_options(args.mode, args.device, n_layers, (args.tree_depth, args.tree_topk, args.tree_tokens),
                        args.lookup, args.group_size, args.precision, args.refresh_every, args.traversal)


def _spec_setup(args, model):
    """The drafter and the verification options of --mode sd-naive / ssv."""
    from ssv.draft import load_drafter
    return load_drafter(args.draft, model), _spec_options(args, model.cfg.n_layers)


def _save_routing(path, record, args) -> None:
    import torch
    torch.save({"model": args.model, "records": record}, path)


def cmd_ppl(args) -> int:
    from ssv.engine.generate import perplexity
    from ssv.engine.runner import Runner

    if not os.path.isfile(args.file):
        raise FileNotFoundError(f"text file not found: {args.file}")
    if args.context < 2:
        raise ValueError(f"--context must be >= 2, got {args.context}")
    if args.score_from is not None and not 1 <= args.score_from < args.context:
        raise ValueError(f"--score-from must be in [1, {args.context - 1}] (below --context), got {args.score_from}")
    model, tok = load_model(args.model, args.device, args.dtype, progress=not args.json)
    with open(args.file, encoding="utf-8", errors="replace") as f:
        ids = tok.encode(f.read())
    if len(ids) < args.context:
        raise ValueError(f"{args.file} has {len(ids)} tokens, fewer than --context {args.context}")
    ids = ids[: args.context]
    nsa = None
    if args.gating:
        from dataclasses import replace

        from ssv.config import NSAConfig
        nsa = replace(model.cfg.nsa or NSAConfig(), gating=args.gating)
    runner = Runner(model, attention=args.attention, nsa=nsa)
    score_from = args.score_from if args.score_from is not None else args.context // 2
    res = perplexity(runner, ids, score_from, progress=not args.json)
    res.update({"attention": args.attention, "file": os.path.basename(args.file)})
    if args.attention == "nsa":
        res["gating"] = runner.nsa.gating
    print(json.dumps(res) if args.json else f"perplexity {res['perplexity']:.4f} over {res['tokens']} tokens")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ssv", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="generate text")
    g.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct GGUF) or a path")
    g.add_argument("--attention", choices=("nsa", "dense"), default="nsa")
    g.add_argument("--mode", choices=MODES, default="ar")
    g.add_argument("--prompt")
    g.add_argument("--prompt-file")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    g.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    g.add_argument("--record-routing", metavar="FILE", help="save every layer's selected blocks (NSA)")
    g.add_argument("--eager", action="store_true", help="no CUDA graphs (the device round runs uncaptured)")
    g.add_argument("--host-round", action="store_true",
                   help="the host-driven round (tree, acceptance and commits on the CPU) instead of the device one")
    sd = g.add_argument_group("speculative decoding (--mode sd-naive | ssv)")
    sd.add_argument("--draft", default="default", help="EAGLE-3 head folder ('default': the shipped head)")
    sd.add_argument("--tree-depth", type=int,
                    help=f"default {DEFAULT_TREE[0]} (--mode ssv on the CPU: {CPU_TREE[0]}, its measured profile)")
    sd.add_argument("--tree-topk", type=int, help=f"default {DEFAULT_TREE[1]} (--mode ssv on the CPU: {CPU_TREE[1]})")
    sd.add_argument("--tree-tokens", type=int, help=f"nodes verified per round, root included; default "
                    f"{DEFAULT_TREE[2]} (--mode ssv: on the CPU 3 or 4, by how its BLAS prices 4 rows; on CUDA "
                    f"{DEFAULT_TREE[2] - GPU_LOOKUP} and a chain of {GPU_LOOKUP} from the context)")
    sd.add_argument("--traversal", choices=("bfs", "dfs", "pos"), default="pos")
    sd.add_argument("--lookup", type=int, metavar="K",
                    help="also verify a chain of up to K tokens drafted from the text itself (the tokens after "
                         "the latest earlier occurrence of its last 2-4 tokens); greedy and sampled rounds, output "
                         f"unchanged; default 0 (--mode ssv with the default tree: on the CPU {CPU_LOOKUP}; "
                         f"on CUDA {GPU_LOOKUP} in the 48-node tree's rows)")
    sd.add_argument("--group-size", type=int, default=4, help="C: queries sharing one load of their blocks")
    sd.add_argument("--precision", choices=("strict", "approx"), default="strict")
    sd.add_argument("--refresh-every", type=int, default=1,
                    help="recompute routing every K layers, reuse it between (approx only)")
    sd.add_argument("--fallback", action=argparse.BooleanOptionalAction, default=True,
                    help="--mode ssv: AR steps while speculation does not pay (observed acceptance below the "
                         "measured round / step cost; same tokens)")
    sd.add_argument("--profile", metavar="FILE",
                    help="adaptive planning: pick the strategy per context length and observed acceptance from "
                         "this profile (written by `ssv bench planner` or `ssv bench spec`); replaces the tree / C / traversal flags")
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=cmd_generate)

    q = sub.add_parser("ppl", help="perplexity on a text file")
    q.add_argument("--model", default="default")
    q.add_argument("--attention", choices=("nsa", "dense"), default="nsa")
    q.add_argument("--gating", choices=("union", "union_cmp"), help="training-free NSA gating rule")
    q.add_argument("--file", required=True)
    q.add_argument("--context", type=int, default=4096)
    q.add_argument("--score-from", type=int, help="score tokens from this position on (default context/2)")
    q.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    q.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_ppl)

    from ssv.draft.train import add_train_draft_parser
    add_train_draft_parser(sub)

    b = sub.add_parser("bench", help="benchmarks (CUDA)")
    bsub = b.add_subparsers(dest="bench", required=True)
    bk = bsub.add_parser("kernels", help="verification kernels: naive, SSV exact/approx, FLA, dense")
    from ssv.bench.kernels import add_args, cmd_bench_kernels
    add_args(bk)
    bk.set_defaults(func=cmd_bench_kernels)
    bs = bsub.add_parser("spec", help="speculative decoding by context length on held-out documents")
    from ssv.bench import spec as bench_spec
    bench_spec.add_args(bs)
    bs.set_defaults(func=bench_spec.cmd_bench_spec)
    be = bsub.add_parser("e2e", help="end to end tokens/s of every mode side by side, and the Llama-8B step table")
    from ssv.bench import e2e as bench_e2e
    bench_e2e.add_args(be)
    be.set_defaults(func=bench_e2e.cmd_bench_e2e)
    bl = bsub.add_parser("linear", help="the decode step's small GEMMs: cuBLAS against the Triton kernel's tiles; "
                                        "--save lists the winners for this GPU")
    from ssv.bench import linear as bench_linear
    bench_linear.add_args(bl)
    bl.set_defaults(func=bench_linear.cmd_bench_linear)
    bp = bsub.add_parser("planner", help="the adaptive planner against every fixed strategy on a mixed prompt set")
    from ssv.bench import planner as bench_planner
    bench_planner.add_args(bp)
    bp.set_defaults(func=bench_planner.cmd_bench_planner)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        _die(str(e))
