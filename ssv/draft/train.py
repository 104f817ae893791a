"""`ssv train-draft`: train an EAGLE-3 head for a target by self-distillation.

Stages, all cached in --run-dir so a run stopped by --time-budget resumes where it stopped when the
same command is run again (exit status 75 = stopped early, run again; 0 = finished):
  1. prompts (data.py; hash split)       -> prompts_train.jsonl, eval_prompts.jsonl
  2. the target's answers (gen.py)       -> data/{eval,train}_*.pt
     (+ with --raw-tokens: plain stdlib source pieces, labelled by the target online,
        and with --corpus: the machine's general text (corpus.py) as long pieces and chat prompts
                                         -> data/{eval,train}_raw_*.pt)
  3. the draft vocabulary (vocab.py)     -> vocab.pt (the --draft-vocab most frequent answer tokens,
                                            or by --balanced-vocab)
  4. TTT training (ttt.py), the target recomputing tapped features + logits online for each batch
                                         -> state.pt (every --save-every steps and at the budget),
                                            metrics.jsonl, curves.png (when matplotlib is importable)
  5. --export DIR                        -> DIR/config.json + DIR/model.safetensors (+ eval_prompts.jsonl)

Draft vocabulary: the head must stay under 25 MB. With hidden 576 the head without lm_head is
5.09M parameters (10.2 MB in bf16); lm_head adds 576 * draft_vocab parameters, so 8192 tokens
give 19.7 MB in bf16 and 12288 24.5 MB (the full 49152 would be 67 MB). 8192 is the default for a new
head; the shipped head has 12288, grown from 8192 by `--init-from default --draft-vocab 12288` and later
chosen anew by `--balanced-vocab` (each data group's frequencies weighing equally).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

EXIT_RESUME = 75  # EX_TEMPFAIL: stopped by --time-budget, run the same command again
SMOKE = dict(num_prompts=4, eval_prompts=2, max_new_tokens=32, max_prompt_tokens=160, gen_batch=4,
             sources="topics", seq_len=256, ttt_steps=2, epochs=100, max_steps=4, batch_tokens=512,
             save_every=2, eval_every=0, warmup=1, log_every=1, raw_tokens=512, raw_eval_tokens=256)
# parameters that change the data or the head: a resumed run must keep them
RUN_KEYS = ("model", "num_prompts", "eval_prompts", "sources", "max_prompt_tokens", "max_new_tokens",
            "sample_frac", "seq_len", "draft_vocab", "window", "seed", "teacher_backend", "loss_on_prompt",
            "raw_tokens", "raw_eval_tokens", "self_prompts", "corpus", "corpus_prompts", "corpus_tokens",
            "corpus_eval_tokens", "init_from", "init_from_sha256", "balanced_vocab")
ADDED_KEYS = {"raw_tokens": 0, "raw_eval_tokens": 0, "self_prompts": 0, "corpus": "", "corpus_prompts": 0,
              "corpus_tokens": 0, "corpus_eval_tokens": 0, "init_from": "",
              "init_from_sha256": "", "balanced_vocab": False}  # keys newer than some run folders: their old value


def add_train_draft_parser(subparsers):
    p = subparsers.add_parser("train-draft", help="train an EAGLE-3 draft head (self-distillation)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("--model", default="default", help="target checkpoint ('default' = SmolLM2-135M-Instruct)")
    a("--run-dir", required=True, help="run directory (data cache, state.pt, metrics); resumed when it exists")
    a("--device", default="auto", choices=("auto", "cpu", "cuda"))
    a("--smoke", action="store_true",
      help="tiny CPU-sized run (a few prompts, 32-token answers, 4 steps): sets the data and training sizes, "
           "over any given")
    a("--export", metavar="DIR", help="write the trained head (config.json + model.safetensors) to DIR")
    a("--export-dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    a("--time-budget", type=float, default=0, metavar="SECONDS", help="stop (and save) after this long (0: no limit)")
    g = p.add_argument_group("data")
    g.add_argument("--num-prompts", type=int, default=16000, help="training prompts (at most all available)")
    g.add_argument("--eval-prompts", type=int, default=256)
    g.add_argument("--sources", default="topics,docs,code", help="comma list of topics, docs, code")
    g.add_argument("--max-prompt-tokens", type=int, default=1024)
    g.add_argument("--max-new-tokens", type=int, default=384)
    g.add_argument("--sample-frac", type=float, default=0.5, help="fraction of prompts answered by sampling")
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--gen-batch", type=int, default=256, help="prompts per generate() call (halved on OOM)")
    g.add_argument("--teacher-backend", default="hf", choices=("hf", "ssv"))
    g.add_argument("--teacher-attention", default="dense", choices=("dense", "nsa"), help="for --teacher-backend ssv")
    g.add_argument("--loss-on-prompt", action="store_true", help="also distil on prompt tokens")
    g.add_argument("--raw-tokens", type=int, default=0,
                   help="also train on this many tokens of plain stdlib source (train-split files, no chat "
                        "template, the target's soft labels on every token): long-document continuation")
    g.add_argument("--raw-eval-tokens", type=int, default=0, help="held-out plain-source tokens in the eval set")
    g.add_argument("--self-prompts", type=int, default=0,
                   help="also this many general chat prompts written by the target itself from built-in topic "
                        "seeds (self-instruct; split by topic), answered like the others")
    g.add_argument("--corpus", default="", metavar="FILES",
                   help="comma list of corpus files (python -m ssv.draft.corpus: manual pages, package docs, "
                        "C headers, shell scripts of the building machine, split by file)")
    g.add_argument("--corpus-prompts", type=int, default=0, help="chat prompts over corpus documents (answered)")
    g.add_argument("--corpus-tokens", type=int, default=0,
                   help="plain corpus tokens, documents concatenated into --seq-len pieces (long contexts)")
    g.add_argument("--corpus-eval-tokens", type=int, default=0, help="held-out plain corpus tokens in the eval set")
    h = p.add_argument_group("head and training")
    h.add_argument("--draft-vocab", type=int, default=8192,
                   help="draft vocabulary size; with --init-from, a size above the head's own grows its vocabulary "
                        "(its ids and rows kept, the most frequent answer tokens it lacks added)")
    h.add_argument("--balanced-vocab", action="store_true",
                   help="count the draft vocabulary with each group of the data weighing equally (the answers to "
                        "the target's own general questions, the other answers, the document pieces), so that "
                        "everyday words are not crowded out by the corpus; with --init-from this replaces the "
                        "head's vocabulary (rows kept for the ids that stay, the others mapped from the target's)")
    h.add_argument("--window", type=int, default=512, help="draft attention window (ssv_draft_window)")
    h.add_argument("--seq-len", type=int, default=2048)
    h.add_argument("--ttt-steps", type=int, default=3)
    h.add_argument("--step-weight", type=float, default=0.8)
    h.add_argument("--epochs", type=int, default=4)
    h.add_argument("--max-steps", type=int, default=0, help="cap on optimizer steps (0 = epochs decide)")
    h.add_argument("--batch-tokens", type=int, default=16384, help="padded tokens per batch")
    h.add_argument("--lr", type=float, default=3e-4)
    h.add_argument("--warmup", type=int, default=100)
    h.add_argument("--weight-decay", type=float, default=0.0)
    h.add_argument("--grad-clip", type=float, default=0.5)
    h.add_argument("--init-from", default="", metavar="HEAD",
                   help="start from an EAGLE-3 head folder ('default': the shipped head): its weights and "
                        "draft vocabulary (the architecture flags must match it; --draft-vocab may be larger)")
    h.add_argument("--init-from-target", action="store_true",
                   help="start lm_head/norm from the target's (default: random, as EAGLE-3; a short A/B run "
                        "gave better step-0 but worse step-1/2 accuracy)")
    h.add_argument("--save-every", type=int, default=200)
    h.add_argument("--eval-every", type=int, default=500)
    h.add_argument("--log-every", type=int, default=10)
    h.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_train_draft)
    return p


def _log(run: Path, msg: str) -> None:
    print(f"[train-draft] {msg}", file=sys.stderr, flush=True)
    with open(run / "log.txt", "a", encoding="utf-8") as f:
        f.write(time.strftime("%Y-%m-%d %H:%M:%S ") + msg + "\n")


def _check_run(run: Path, args) -> None:
    path, mine = run / "run.json", {k: getattr(args, k) for k in RUN_KEYS}
    if path.exists():
        old = json.loads(path.read_text())
        diff = {k: (old.get(k, ADDED_KEYS.get(k)), v) for k, v in mine.items() if old.get(k, ADDED_KEYS.get(k)) != v}
        if diff:
            raise ValueError(f"{run} was started with different settings {diff} (old, new); "
                             f"use another --run-dir or the original settings")
    else:
        path.write_text(json.dumps(mine, indent=2) + "\n")


def cmd_train_draft(args) -> int:
    import torch

    t0 = time.time()
    if not args.time_budget >= 0:   # (NaN too)
        raise ValueError(f"--time-budget must be >= 0 seconds (0: none), got {args.time_budget}")
    if args.smoke:
        for k, v in SMOKE.items():
            setattr(args, k, v)
        # one thread: on a shared 2-core machine OpenMP hand-offs made this 10x slower (19 s vs 3 min)
        torch.set_num_threads(1)
    deadline = t0 + args.time_budget if args.time_budget and args.time_budget > 0 else None
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but no CUDA device is available")
    for name in ("raw_tokens", "raw_eval_tokens", "self_prompts", "corpus_prompts", "corpus_tokens",
                 "corpus_eval_tokens"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
    for name in ("num_prompts", "seq_len", "ttt_steps", "draft_vocab", "window", "batch_tokens", "gen_batch",
                 "max_new_tokens", "max_prompt_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.init_from and args.init_from_target:
        raise ValueError("--init-from and --init-from-target are exclusive")
    uses_corpus = args.corpus_prompts or args.corpus_tokens or args.corpus_eval_tokens
    if uses_corpus and not args.corpus:
        raise ValueError("--corpus-prompts / --corpus-tokens / --corpus-eval-tokens need --corpus FILES")
    from ssv.draft.corpus import read_corpus
    corpus = read_corpus([f for f in args.corpus.split(",") if f]) if args.corpus else []  # fails before any work
    run = Path(args.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    from ssv.draft import data, gen
    from ssv.draft.eagle3 import Eagle3Config
    from ssv.draft.teacher import Teacher
    from ssv.loaders import load_checkpoint

    ck = load_checkpoint(args.model)
    if ck.tokenizer is None:
        raise ValueError("the target has no tokenizer; training needs one to build chat prompts")
    if args.draft_vocab > ck.config.vocab_size:
        _log(run, f"--draft-vocab {args.draft_vocab} > target vocab: using {ck.config.vocab_size}")
        args.draft_vocab = ck.config.vocab_size
    hcfg = Eagle3Config.for_target(ck.config, args.draft_vocab, window=args.window,
                                   max_position_embeddings=args.seq_len)
    base = None
    if args.init_from:   # checked before any generation
        from ssv.draft.loop import load_base_head

        base = load_base_head(args.init_from, hcfg, ck.config, hcfg.layer_ids(ck.config.n_layers))
    # the head's bytes, so that a resumed run or a re-run of `--init-from default` names the head it started from
    args.init_from_sha256 = base.sha256 if base else ""
    _check_run(run, args)   # after every refusal: a refused run leaves no settings behind
    tdtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    teacher = Teacher(ck.config, ck.state_dict, hcfg.layer_ids(ck.config.n_layers), args.device, tdtype,
                      backend=args.teacher_backend, attention=args.teacher_attention)
    _log(run, f"target {ck.source} on {args.device} ({tdtype}); taps {list(hcfg.layer_ids(ck.config.n_layers))}")

    # 1-2. prompts and the target's answers
    sources = tuple(s.strip() for s in args.sources.split(",") if s.strip())
    if not (run / "eval_prompts.jsonl").exists():
        own = self_instruct(run, args, teacher, ck.tokenizer) if args.self_prompts else []
        own_eval = [p for p in own if data.is_eval(p["split_key"])][: max(1, args.eval_prompts // 4)]
        from ssv.draft.corpus import corpus_prompts
        data.write_prompts(run / "prompts_train.jsonl", data.train_prompts(args.num_prompts, sources)
                           + [p for p in own if not data.is_eval(p["split_key"])]
                           + corpus_prompts(corpus, "train", args.corpus_prompts))
        data.write_prompts(run / "eval_prompts.jsonl", data.eval_prompts(args.eval_prompts, sources) + own_eval
                           + corpus_prompts(corpus, "eval", args.eval_prompts // 4 if args.corpus_prompts else 0))
    gkw = dict(max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens, seq_len=args.seq_len,
               batch=args.gen_batch, sample_frac=args.sample_frac, temperature=args.temperature, top_p=args.top_p,
               seed=args.seed, deadline=deadline, log=lambda m: _log(run, m))
    for split, name in (("eval", "eval_prompts.jsonl"), ("train", "prompts_train.jsonl")):
        if not gen.generate_split(run / "data", split, data.read_prompts(run / name), teacher, ck.tokenizer, **gkw):
            _log(run, f"stopped by --time-budget; run the same command again to resume (exit {EXIT_RESUME})")
            return EXIT_RESUME
    from ssv.draft.corpus import corpus_pieces
    for split, n, nc in (("eval", args.raw_eval_tokens, args.corpus_eval_tokens),
                         ("train", args.raw_tokens, args.corpus_tokens)):
        if (n or nc) and not (run / "data" / f"{split}_raw.done").exists():
            pieces = data.raw_documents(ck.tokenizer, split, args.seq_len, n) if n else []
            extra = corpus_pieces(ck.tokenizer, corpus, split, args.seq_len, nc) if nc else []
            gen.write_raw_split(run / "data", split, pieces + extra)
            _log(run, f"{split}: {len(pieces)} plain-source pieces, {sum(map(len, pieces))} tokens; "
                      f"{len(extra)} corpus pieces, {sum(map(len, extra))} tokens")
    from ssv.draft.loop import train_loop

    return train_loop(args, run, ck, hcfg, teacher, deadline, log=lambda m: _log(run, m), base=base)


def self_instruct(run: Path, args, teacher, tokenizer) -> list:
    """The target writes --self-prompts general chat prompts from data.SELF_TOPICS (sampled, cached in
    prompts_self.jsonl); unusable or repeated ones are dropped, so a few less may come back."""
    from ssv.draft import data, gen

    path = run / "prompts_self.jsonl"
    if path.exists():
        return data.read_prompts(path)
    seeds = data.self_seeds(args.self_prompts)
    ids = [tokenizer.encode_chat([{"role": "user", "content": p["text"]}]) for p in seeds]
    out, seen = [], set()
    for b in range(0, len(seeds), args.gen_batch):
        answers = gen._generate(teacher, ids[b:b + args.gen_batch], 64, tuple(tokenizer.eos_ids), sample=True,
                                temperature=0.8, top_p=0.95, seed=args.seed * 7919 + b)
        for p, a in zip(seeds[b:b + args.gen_batch], answers):
            q = data.clean_question(tokenizer.decode([t for t in a if t not in tokenizer.eos_ids],
                                                     skip_special_tokens=True))
            if q and q not in seen:
                seen.add(q)
                out.append({**p, "text": q})
    data.write_prompts(path, out)
    _log(run, f"self-instruct: {len(out)} prompts from {len(seeds)} seeds")
    return out


def main(argv=None) -> int:
    """`python -m ssv.draft.train ...` (the same options as `ssv train-draft`)."""
    p = argparse.ArgumentParser(prog="python -m ssv.draft.train")
    sub = p.add_subparsers(dest="cmd")
    add_train_draft_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv if argv[:1] == ["train-draft"] else ["train-draft"] + argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"ssv train-draft: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
