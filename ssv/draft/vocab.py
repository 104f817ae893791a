"""The draft vocabulary: the most frequent target tokens, and the d2t / t2d maps of EAGLE-3.

d2t [draft_vocab] int64 holds OFFSETS: target_id = draft_id + d2t[draft_id] (EAGLE's
`used_tokens[i] - i`, SGLang's `hot_token_id = d2t + arange`); t2d [vocab] bool marks the target ids
that are in the draft vocabulary. Draft ids are assigned in increasing target-id order, as EAGLE does.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch


def mapping_from_ids(target_ids: torch.Tensor, vocab_size: int, draft_vocab_size: int):
    """(d2t, t2d) for a draft vocabulary made of the distinct `target_ids` (any order)."""
    ids = torch.as_tensor(target_ids, dtype=torch.long).flatten().cpu()
    if ids.numel() != draft_vocab_size:
        raise ValueError(f"draft vocabulary has {ids.numel()} ids, the head expects {draft_vocab_size}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"draft vocabulary ids must lie in [0, {vocab_size})")
    ids = torch.sort(ids).values
    if ids.numel() > 1 and bool((ids[1:] == ids[:-1]).any()):
        raise ValueError("draft vocabulary ids must be distinct")
    d2t = ids - torch.arange(ids.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return d2t, t2d


def check_mapping(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int, where: str = "head") -> None:
    """Raise ValueError unless d2t maps draft ids to distinct target ids and t2d marks exactly those."""
    if d2t.dtype.is_floating_point or t2d.shape != (vocab_size,):
        raise ValueError(f"{where}: d2t must be integer and t2d of shape [{vocab_size}]")
    tgt = torch.arange(d2t.numel()) + d2t.long().cpu()
    if tgt.numel() and (int(tgt.min()) < 0 or int(tgt.max()) >= vocab_size):
        raise ValueError(f"{where}: d2t maps draft ids outside the target vocabulary [0, {vocab_size})")
    if torch.unique(tgt).numel() != tgt.numel():
        raise ValueError(f"{where}: d2t maps two draft ids to the same target id")
    expect = torch.zeros(vocab_size, dtype=torch.bool)
    expect[tgt] = True
    if not torch.equal(expect, t2d.bool().cpu()):
        raise ValueError(f"{where}: t2d does not mark exactly the target ids that d2t maps to")


def count_tokens(sequences: Iterable, vocab_size: int) -> torch.Tensor:
    """LongTensor [vocab] of token counts over `sequences` (iterables of ids)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        t = torch.as_tensor(seq, dtype=torch.long).flatten()
        if t.numel():
            counts += torch.bincount(t, minlength=vocab_size)[:vocab_size]
    return counts


def balanced_scores(groups: Sequence[torch.Tensor]) -> torch.Tensor:
    """Float64 [vocab] scores that weigh each group's counts equally: the sum of each group's token
    frequencies (its counts over its total; an empty group adds nothing). Counted over all the data at
    once, the largest group (6.8M tokens of stdlib source and corpus documents against 0.2M of general
    chat answers) picks most of the vocabulary and everyday words fall out of it (session 41: " air",
    " molecules")."""
    out = None
    for c in groups:
        c = torch.as_tensor(c, dtype=torch.float64)
        out = torch.zeros_like(c) if out is None else out
        if c.sum() > 0:
            out += c / c.sum()
    if out is None:
        raise ValueError("balanced_scores needs at least one group of counts")
    return out


def top_tokens(counts: torch.Tensor, n: int) -> torch.Tensor:
    """The n ids of the highest counts or scores (ties, zeros included: lower id first), sorted by id."""
    counts = torch.as_tensor(counts)
    if not 0 < n <= counts.numel():
        raise ValueError(f"draft vocabulary size must be in [1, {counts.numel()}], got {n}")
    # stable sort on -count keeps the id order among equal counts
    order = torch.sort(-counts, stable=True).indices[:n]
    return torch.sort(order).values


def coverage(counts: torch.Tensor, ids: torch.Tensor) -> float:
    """Fraction of the counted tokens that the draft vocabulary `ids` covers."""
    total = int(counts.sum())
    return float(counts[ids].sum()) / total if total else 1.0


def grow_ids(old_ids: torch.Tensor, counts: torch.Tensor, n: int) -> torch.Tensor:
    """A draft vocabulary grown to n ids: every id of `old_ids` kept, then the most frequent others by
    `counts` (ties: lower id first), sorted by id."""
    old = torch.as_tensor(old_ids, dtype=torch.long).flatten().cpu()
    counts = torch.as_tensor(counts, dtype=torch.long).cpu()
    if not old.numel() <= n <= counts.numel():
        raise ValueError(f"a grown draft vocabulary needs {old.numel()} <= size <= {counts.numel()}, got {n}")
    rank = counts.clone()
    rank[old] = -1                       # below every count: never taken again
    extra = torch.sort(-rank, stable=True).indices[: n - old.numel()]
    return torch.sort(torch.cat([old, extra])).values


def grow_rows(w_old: torch.Tensor, old_ids: torch.Tensor, new_ids: torch.Tensor,
              target_rows: torch.Tensor) -> torch.Tensor:
    """`remap_rows` for a grown draft vocabulary: `new_ids` must contain every old id."""
    check_grown(old_ids, new_ids)
    return remap_rows(w_old, old_ids, new_ids, target_rows)


def check_grown(old_ids: torch.Tensor, new_ids: torch.Tensor) -> None:
    """Raise ValueError unless `new_ids` contains every id of `old_ids`."""
    old = torch.as_tensor(old_ids, dtype=torch.long).cpu()
    if not bool(torch.isin(old, torch.as_tensor(new_ids, dtype=torch.long).cpu()).all()):
        raise ValueError("the grown vocabulary must contain every old id")


def remap_rows(w_old: torch.Tensor, old_ids: torch.Tensor, new_ids: torch.Tensor,
               target_rows: torch.Tensor) -> torch.Tensor:
    """Output rows [len(new_ids), H] for another draft vocabulary (both id lists sorted): the head's own
    row `w_old` [len(old_ids), H] for every id in both, and each other token's row the target's output
    row of that token (`target_rows` [vocab, Ht]) mapped by the least-squares linear map from the
    target's rows of the old tokens to the head's rows. A trained head's rows are not the target's
    (cosine ~0.02 on session 27's head) but are nearly a linear image of them (~0.76 on rows held out
    of the fit): a start for training, not a substitute."""
    old = torch.as_tensor(old_ids, dtype=torch.long).cpu()
    new = torch.as_tensor(new_ids, dtype=torch.long).cpu()
    a, b = target_rows.float().cpu()[old], w_old.float().cpu()
    m = torch.linalg.lstsq(a, b).solution                                             # [Ht, H]
    out = target_rows.float().cpu()[new] @ m
    both = torch.isin(old, new)
    out[torch.searchsorted(new, old[both])] = b[both]
    return out
