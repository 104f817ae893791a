"""The training loop of `ssv train-draft`: vocabulary, head init, TTT steps, eval, checkpoints, export."""
from __future__ import annotations

import json
import math
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, List, NamedTuple, Optional

import torch

from ssv.draft import gen
from ssv.draft.eagle3 import Eagle3Config, Eagle3Head
from ssv.draft.ttt import ttt_forward
from ssv.draft.vocab import balanced_scores, count_tokens, coverage, grow_ids, top_tokens

SIZE_LIMIT = 25_000_000


def build_vocab(run: Path, train_data: List[dict], vocab_size: int, n: int, log: Callable,
                fixed: Optional[torch.Tensor] = None, balanced: bool = False) -> torch.Tensor:
    """The run's draft vocabulary (vocab.pt): the n most frequent answer tokens; or `fixed` (a starting
    head's), grown to n with the most frequent answer tokens it lacks when n is larger. balanced: the
    n ids of the highest `balanced_scores` over the data's groups (`vocab_groups`), `fixed` or not."""
    path = run / "vocab.pt"
    if path.exists():
        return torch.load(path, weights_only=True)["ids"]
    groups = vocab_groups(train_data, vocab_size)
    counts = sum(groups.values())   # the groups partition the data
    if balanced:
        ids = top_tokens(balanced_scores(list(groups.values())), n)
    else:
        ids = top_tokens(counts, n) if fixed is None else grow_ids(fixed, counts, n)
    cov = coverage(counts, ids)
    torch.save({"ids": ids, "counts": counts, "coverage": cov, "balanced": balanced,
                "group_coverage": {k: coverage(c, ids) for k, c in groups.items()}}, path)
    how = " (groups weighed equally)" if balanced else ""
    if fixed is not None:
        how += (" of the starting head" if len(fixed) == n and not balanced else
                f", from the starting head's ({len(fixed)} ids, {coverage(counts, fixed):.2%}; "
                f"{int(torch.isin(ids, fixed).sum())} kept)")
    log(f"draft vocabulary{how}: {len(ids)} of {vocab_size} target tokens cover {cov:.2%} of the answer tokens")
    for k, c in groups.items():
        before = f"{coverage(c, fixed):.2%} -> " if fixed is not None else ""
        log(f"  {k}: {int(c.sum())} tokens, covered {before}{coverage(c, ids):.2%}")
    return ids


def vocab_groups(train_data: List[dict], vocab_size: int) -> dict:
    """Token counts by group: the answers to the target's own general questions ("self"), the other
    answers, and the document pieces (stdlib source and corpus text)."""
    def group(s):
        src = s.get("source", "")
        return "self answers" if src.startswith("self:") else "documents" if src.startswith("raw:") else "other answers"
    return {name: count_tokens((s["ids"][s["prompt_len"]:] for s in train_data if group(s) == name), vocab_size)
            for name in ("self answers", "other answers", "documents")}


def init_head(hcfg: Eagle3Config, ids: torch.Tensor, sd: dict, from_target: bool) -> Eagle3Head:
    head = Eagle3Head(hcfg)
    head.set_vocab(ids)
    if from_target:  # start from the target's own output layer (rows of the draft vocabulary)
        w = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
        with torch.no_grad():
            head.lm_head.weight.copy_(w[head.target_ids()])
            head.norm.weight.copy_(sd["model.norm.weight"])
    return head


# fields that shape a head's weights or what they mean (max_position_embeddings only sizes RoPE caches)
_ARCH = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
         "vocab_size", "draft_vocab_size", "target_hidden_size", "rms_norm_eps", "rope_theta", "rope_scaling",
         "window")


class BaseHead(NamedTuple):
    """The head --init-from names (loaded), its draft vocabulary (target ids) and weights file's sha256."""
    head: Eagle3Head
    ids: torch.Tensor
    sha256: str


def start_head(hcfg: Eagle3Config, ids: torch.Tensor, sd: dict, from_target: bool,
               base: Optional[BaseHead]) -> Eagle3Head:
    """The head a run starts from: new (`init_head`), the --init-from head's weights, or that head moved
    to the run's other vocabulary `ids` (grown, or chosen anew: `remap_head`, the rows of the ids in both
    kept, the others mapped from the target's output layer)."""
    if base is None:
        return init_head(hcfg, ids, sd, from_target)
    if torch.equal(base.ids.cpu(), torch.as_tensor(ids).cpu()):
        head = init_head(hcfg, ids, sd, from_target)
        head.load_state_dict(base.head.state_dict(), strict=True)
        return head
    from ssv.draft.eagle3 import remap_head
    return remap_head(base.head, ids, sd.get("lm_head.weight", sd["model.embed_tokens.weight"]))


def load_base_head(spec: str, hcfg: Eagle3Config, target_cfg, layer_ids) -> BaseHead:
    """Refused unless it is the head this run would build (same architecture, taps and draft vocabulary
    size) for this target."""
    import hashlib

    from ssv.draft import default_head_path
    from ssv.draft.io import WEIGHTS_NAME, load_eagle3

    folder = default_head_path() if spec == "default" else Path(spec)
    base, bcfg = load_eagle3(folder, target=target_cfg)
    # a larger --draft-vocab grows the head's vocabulary (`build_vocab`, `start_head`)
    diff = {k: (getattr(bcfg, k), getattr(hcfg, k)) for k in _ARCH if getattr(bcfg, k) != getattr(hcfg, k)
            and not (k == "draft_vocab_size" and bcfg.draft_vocab_size < hcfg.draft_vocab_size)}
    if tuple(bcfg.layer_ids(target_cfg.n_layers)) != tuple(layer_ids):
        diff["aux_layer_ids"] = (tuple(bcfg.layer_ids(target_cfg.n_layers)), tuple(layer_ids))
    if diff:
        raise ValueError(f"--init-from {folder}: the head differs from this run's {diff} (head, run); "
                         f"pass the matching --draft-vocab / --window")
    digest = hashlib.sha256((folder / WEIGHTS_NAME).read_bytes()).hexdigest()
    return BaseHead(base, base.target_ids().cpu(), digest)


def _rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    # generator states must be CPU byte tensors, wherever the checkpoint was mapped
    torch.set_rng_state(st["torch"].cpu())
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([t.cpu() for t in st["cuda"]])


def _batch_loss(head, teacher, samples, args, grad: bool):
    ids, lengths, valid = gen.collate(samples, args.loss_on_prompt)
    feats, logits = teacher.forward(ids, lengths)
    dev = next(head.parameters()).device
    with torch.set_grad_enabled(grad):
        return ttt_forward(head, teacher.embed_weight, feats.float(), ids.to(dev), logits, valid.to(dev),
                           steps=args.ttt_steps, step_weight=args.step_weight)


@torch.no_grad()
def evaluate(head, teacher, eval_data, args) -> dict:
    head.eval()
    k = args.ttt_steps
    tot_l, tot_a, tot_n = [0.0] * k, [0.0] * k, [0] * k
    for idx in gen.make_batches([s["ids"].numel() for s in eval_data], args.batch_tokens, 0, 0):
        r = _batch_loss(head, teacher, [eval_data[i] for i in idx], args, grad=False)
        for j in range(k):
            tot_l[j] += r["losses"][j] * r["counts"][j]
            tot_a[j] += r["accs"][j] * r["counts"][j]
            tot_n[j] += r["counts"][j]
    head.train()
    return {"loss": [l / max(1, n) for l, n in zip(tot_l, tot_n)], "acc": [a / max(1, n) for a, n in zip(tot_a, tot_n)],
            "tokens": tot_n}


def plot(run: Path) -> Optional[Path]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    tr, ev = [r for r in rows if r["kind"] == "train"], [r for r in rows if r["kind"] == "eval"]
    if not tr:
        return None
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for j in range(len(tr[0]["loss"])):
        ax[0].plot([r["step"] for r in tr], [r["loss"][j] for r in tr], label=f"train step {j}")
        ax[1].plot([r["step"] for r in tr], [r["acc"][j] for r in tr], label=f"train step {j}")
        if ev:
            ax[0].plot([r["step"] for r in ev], [r["loss"][j] for r in ev], "o--", label=f"eval step {j}")
            ax[1].plot([r["step"] for r in ev], [r["acc"][j] for r in ev], "o--", label=f"eval step {j}")
    ax[0].set_title("soft cross-entropy"), ax[1].set_title("top-1 accuracy")
    for a in ax:
        a.set_xlabel("optimizer step"), a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(run / "curves.png", dpi=100)
    plt.close(fig)
    return run / "curves.png"


def export(head, run: Path, out: Path, dtype_name: str, summary: dict, log: Callable) -> None:
    from ssv.draft.io import head_size_bytes, save_eagle3

    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype_name]
    save_eagle3(out, head.float().cpu(), dtype=dtype)
    shutil.copyfile(run / "eval_prompts.jsonl", Path(out) / "eval_prompts.jsonl")
    (Path(out) / "train_meta.json").write_text(json.dumps(summary, indent=2) + "\n")
    size = (Path(out) / "model.safetensors").stat().st_size
    log(f"exported the head to {out} ({size / 1e6:.1f} MB)")
    if size > SIZE_LIMIT:
        log(f"WARNING: {size / 1e6:.1f} MB exceeds the 25 MB budget of a shipped head "
            f"(estimate {head_size_bytes(head.cfg, dtype) / 1e6:.1f} MB); lower --draft-vocab")


def train_loop(args, run: Path, ck, hcfg: Eagle3Config, teacher, deadline: Optional[float], log: Callable,
               base: Optional[BaseHead] = None) -> int:
    from tqdm import tqdm

    from ssv.draft.train import EXIT_RESUME

    dev = torch.device(args.device)
    train_data, eval_data = gen.load_split(run / "data", "train"), gen.load_split(run / "data", "eval")
    ids = build_vocab(run, train_data, ck.config.vocab_size, args.draft_vocab, log,
                      fixed=base.ids if base is not None else None, balanced=args.balanced_vocab)
    head = start_head(hcfg, ids, ck.state_dict, args.init_from_target, base)   # a resumed run reloads state.pt below
    head = head.to(dev).train()
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    lengths = [s["ids"].numel() for s in train_data]
    per_epoch = len(gen.make_batches(lengths, args.batch_tokens, args.seed, 0))
    total = per_epoch * args.epochs if not args.max_steps else min(args.max_steps, per_epoch * args.epochs)

    def lr_at(step):  # linear warmup, cosine decay to 10%
        if step < args.warmup:
            return (step + 1) / args.warmup
        frac = (step - args.warmup) / max(1, total - args.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    step, epoch, cursor, done = 0, 0, 0, False
    state_path = run / "state.pt"
    if state_path.exists():
        # on the CPU: the optimizer moves its state to the parameters' device itself, and mapping the
        # RNG states to CUDA made every resume on the GPU fail
        st = torch.load(state_path, weights_only=False, map_location="cpu")
        head.load_state_dict(st["head"]), opt.load_state_dict(st["opt"]), sched.load_state_dict(st["sched"])
        step, epoch, cursor = st["step"], st["epoch"], st["cursor"]
        done = step >= total and (run / "final_eval.json").exists()
        _set_rng_state(st["rng"])
        log(f"resumed at step {step} (epoch {epoch}, batch {cursor})")

    def save(final=False):
        gen.save_atomic({"head": head.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "step": step,
                      "epoch": epoch, "cursor": cursor, "rng": _rng_state(), "done": final,
                      "config": hcfg.to_json_dict()}, state_path)

    metrics = open(run / "metrics.jsonl", "a", encoding="utf-8")

    def record(kind, **kw):
        metrics.write(json.dumps(dict(kind=kind, step=step, epoch=epoch, time=round(time.time(), 1), **kw)) + "\n")
        metrics.flush()

    log(f"{len(train_data)} training / {len(eval_data)} eval sequences; {per_epoch} batches per epoch; "
        f"{total} steps in all")
    bar = tqdm(total=total, initial=min(step, total), desc="train-draft", unit="step",
               mininterval=0.1 if sys.stderr.isatty() else 30)
    window, t_step = [], time.time()
    if base is not None and step == 0 and args.eval_every:   # the starting head on this run's eval set
        ev = evaluate(head, teacher, eval_data, args)
        record("eval", **ev)
        log(f"step 0 ({args.init_from}): eval loss {[round(x, 3) for x in ev['loss']]} "
            f"acc {[round(x, 3) for x in ev['acc']]}")
    while not done and step < total:
        batches = gen.make_batches(lengths, args.batch_tokens, args.seed, epoch)
        while cursor < len(batches) and step < total:
            if deadline is not None and time.time() > deadline - 5:
                save()
                bar.close()
                log(f"stopped by --time-budget at step {step}; run the same command again to resume "
                    f"(exit {EXIT_RESUME})")
                return EXIT_RESUME
            r = _batch_loss(head, teacher, [train_data[i] for i in batches[cursor]], args, grad=True)
            opt.zero_grad(set_to_none=True)
            r["loss"].backward()
            gnorm = float(torch.nn.utils.clip_grad_norm_(head.parameters(), args.grad_clip))
            opt.step()
            sched.step()
            step, cursor = step + 1, cursor + 1
            window.append((r["losses"], r["accs"], sum(r["counts"]) // len(r["counts"]), gnorm))
            bar.update(1)
            bar.set_postfix(loss=f"{r['losses'][0]:.3f}", acc=" ".join(f"{a:.2f}" for a in r["accs"]))
            if step % args.log_every == 0 or step == total:
                n = len(window)
                record("train", loss=[sum(w[0][j] for w in window) / n for j in range(args.ttt_steps)],
                       acc=[sum(w[1][j] for w in window) / n for j in range(args.ttt_steps)],
                       tokens=sum(w[2] for w in window), grad_norm=sum(w[3] for w in window) / n,
                       lr=sched.get_last_lr()[0], sec_per_step=(time.time() - t_step) / n)
                window, t_step = [], time.time()
            if args.eval_every and step % args.eval_every == 0:
                ev = evaluate(head, teacher, eval_data, args)
                record("eval", **ev)
                log(f"step {step}: eval loss {[round(x, 3) for x in ev['loss']]} acc {[round(x, 3) for x in ev['acc']]}")
            if step % args.save_every == 0:
                save()
        if cursor >= len(batches):
            epoch, cursor = epoch + 1, 0
    bar.close()
    if not done:
        ev = evaluate(head, teacher, eval_data, args)
        record("eval", **ev)
        log(f"final eval (step {step}): loss {[round(x, 3) for x in ev['loss']]} acc {[round(x, 3) for x in ev['acc']]}")
        save(final=True)
        (run / "final_eval.json").write_text(json.dumps(dict(step=step, **ev), indent=2) + "\n")
    metrics.close()
    png = plot(run)
    if png:
        log(f"curves: {png}")
    if args.export:
        ev = json.loads((run / "final_eval.json").read_text()) if (run / "final_eval.json").exists() else {}
        vocab = torch.load(run / "vocab.pt", weights_only=True)
        summary = {"target": ck.source, "steps": step, "train_sequences": len(train_data),
                   "eval_sequences": len(eval_data), "draft_vocab_coverage": vocab["coverage"], "final_eval": ev,
                   "settings": {k: getattr(args, k) for k in sorted(vars(args)) if k != "func"}}
        export(head, run, Path(args.export), args.export_dtype, summary, log)
    return 0
