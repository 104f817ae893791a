"""Self-distillation data: the target answers the prompts; sequences are cached as shards in the run dir.

A shard `data/<split>_<i>.pt` holds one generation batch: {"tokens": the prompt + answer sequences
concatenated (uint16), "lengths", "prompt_len", "prompt_id", "sampled"}. Shards are written atomically and skipped when present, so an interrupted
generation resumes where it stopped; `data/<split>.done` marks a complete split.
"""
from __future__ import annotations

import hashlib
import os
import random
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import torch

from ssv.draft.data import chat_ids


def sampled(prompt_id: str, frac: float) -> bool:
    """Whether this prompt is answered by sampling (else greedily): a hash, so it is reproducible."""
    h = int.from_bytes(hashlib.sha256(("sample:" + prompt_id).encode()).digest()[:4], "big")
    return h / 2 ** 32 < frac


def save_atomic(obj, path: Path) -> None:
    """torch.save that never leaves a half-written file (a run stopped mid-write resumes cleanly)."""
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def generate_split(data_dir: Path, split: str, prompts: Sequence[dict], teacher, tokenizer, *,
                   max_prompt_tokens: int, max_new_tokens: int, seq_len: int, batch: int, sample_frac: float,
                   temperature: float, top_p: float, seed: int, deadline: Optional[float] = None,
                   log: Callable = print, progress: bool = True) -> bool:
    """Generate the answers of `prompts` into shards; False when stopped by the deadline."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if (data_dir / f"{split}.done").exists():
        return True
    from tqdm import tqdm

    ids = [chat_ids(tokenizer, p, max_prompt_tokens) for p in prompts]
    eos = tuple(tokenizer.eos_ids)
    # greedy and sampled prompts in separate batches; long prompts first (memory peaks early)
    order = sorted(range(len(prompts)), key=lambda i: (sampled(prompts[i]["id"], sample_frac), -len(ids[i]), i))
    batches = [order[i:i + batch] for i in range(0, len(order), batch)]
    bar = tqdm(total=len(batches), desc=f"generate {split}", unit="batch", disable=not progress,
               mininterval=0.1 if sys.stderr.isatty() else 30)
    slowest = 0.0  # longest batch so far: do not start one that would overrun the deadline
    for b, idx in enumerate(batches):
        path = data_dir / f"{split}_{b:05d}.pt"
        if path.exists():
            bar.update(1)
            continue
        t_batch = time.time()
        if deadline is not None and t_batch + 1.2 * slowest > deadline:
            bar.close()
            log(f"time budget reached while generating {split} data ({b}/{len(batches)} batches done)")
            return False
        do_sample = sampled(prompts[idx[0]]["id"], sample_frac)
        answers = _generate(teacher, [ids[i] for i in idx], max_new_tokens, eos, sample=do_sample,
                            temperature=temperature, top_p=top_p, seed=seed * 100003 + b)
        seqs = [(ids[i] + a)[:seq_len] for i, a in zip(idx, answers)]
        _save_shard(path, seqs, [min(len(ids[i]), seq_len) for i in idx], [prompts[i]["id"] for i in idx], do_sample)
        slowest = max(slowest, time.time() - t_batch)
        bar.update(1)
    bar.close()
    (data_dir / f"{split}.done").write_text(f"{len(batches)}\n")
    return True


def write_raw_split(data_dir: Path, split: str, pieces: Sequence[Sequence[int]], shard: int = 256) -> None:
    """Document pieces (no generation; every token is a loss position) as `<split>_raw_<i>.pt` shards,
    which `load_split` reads with the generated ones; `<split>_raw.done` marks them complete."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if (data_dir / f"{split}_raw.done").exists():
        return
    for stale in data_dir.glob(f"{split}_raw_*.pt"):  # an interrupted earlier attempt
        stale.unlink()
    for b in range(0, len(pieces), shard):
        seqs = [list(p) for p in pieces[b:b + shard]]
        _save_shard(data_dir / f"{split}_raw_{b // shard:05d}.pt", seqs, [0] * len(seqs),
                    [f"raw:{split}:{b + i}" for i in range(len(seqs))], False)
    (data_dir / f"{split}_raw.done").write_text(f"{len(pieces)}\n")


def _generate(teacher, prompts, max_new_tokens, eos, **kw):
    """teacher.generate, halving the batch on CUDA out-of-memory."""
    try:
        return teacher.generate(prompts, max_new_tokens, eos, **kw)
    except torch.cuda.OutOfMemoryError:
        if len(prompts) == 1:
            raise
        torch.cuda.empty_cache()
        h = len(prompts) // 2
        return (_generate(teacher, prompts[:h], max_new_tokens, eos, **kw)
                + _generate(teacher, prompts[h:], max_new_tokens, eos, **kw))


def load_split(data_dir: Path, split: str) -> List[dict]:
    """[{"ids": LongTensor, "prompt_len": int, "source": str}] of a generated split, in shard order;
    source: the prompt's id ("self:..." for the target's own questions) or "raw:..." for a document piece."""
    if not (data_dir / f"{split}.done").exists():
        raise FileNotFoundError(f"{data_dir}: the {split} data has not been generated yet")
    if any(data_dir.glob(f"{split}_raw_*.pt")) and not (data_dir / f"{split}_raw.done").exists():
        raise FileNotFoundError(f"{data_dir}: the {split} document pieces are incomplete")
    out = []
    for path in sorted(data_dir.glob(f"{split}_*.pt")):
        shard = torch.load(path, weights_only=True)
        seqs = shard["tokens"].to(torch.long).split(shard["lengths"].tolist())
        sources = shard.get("prompt_id") or [""] * len(seqs)
        for seq, pl, src in zip(seqs, shard["prompt_len"], sources):
            out.append({"ids": seq, "prompt_len": int(pl), "source": src})
    return out


def _save_shard(path: Path, seqs: List[List[int]], prompt_len: List[int], prompt_id: List[str], sampled: bool) -> None:
    save_atomic({"tokens": _pack(seqs), "lengths": torch.tensor([len(s) for s in seqs]), "prompt_len": prompt_len,
                 "prompt_id": prompt_id, "sampled": sampled}, path)


def _pack(seqs: List[List[int]]) -> torch.Tensor:
    """All sequences in one flat tensor (uint16 when the ids fit: the data cache stays small)."""
    flat = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
    return flat.to(torch.uint16 if flat.numel() == 0 or int(flat.max()) < 65536 else torch.int32)


def make_batches(lengths: Sequence[int], batch_tokens: int, seed: int, epoch: int) -> List[List[int]]:
    """Length-bucketed batches of at most batch_tokens padded tokens (>= 1 sequence), shuffled per epoch."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * lengths[i] > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    random.Random(seed * 1000003 + epoch).shuffle(batches)
    return batches


def collate(samples: Sequence[dict], loss_on_prompt: bool = False):
    """(ids [B, T] right-padded, lengths [B], valid [B, T]) -- valid marks teacher positions p whose
    next token p + 1 is an answer token (or any token with loss_on_prompt)."""
    T = max(s["ids"].numel() for s in samples)
    ids = torch.zeros(len(samples), T, dtype=torch.long)
    valid = torch.zeros(len(samples), T, dtype=torch.bool)
    lengths = torch.tensor([s["ids"].numel() for s in samples])
    for b, s in enumerate(samples):
        n = s["ids"].numel()
        ids[b, :n] = s["ids"]
        lo = 0 if loss_on_prompt else max(0, s["prompt_len"] - 1)
        valid[b, lo:n - 1] = True
    return ids, lengths, valid
