"""The drafter rows of AR steps, kept on the device until one batched commit (the AR fall-back).

While the engine runs AR steps instead of rounds, the drafter still has to see every committed token,
or the next round would draft from a stale state. Each AR step's graph writes its row (the tapped
target features, the token after them) into fixed buffers; before the next round one captured
catch-up commits the batch (`drafter.commit_rows`). The catch-up also counts the head's depth-1
drafts that name the next row's token (top-1 and top-k hits): acceptance evidence that costs no
round (`ArFallback.observe_agreement`).
"""
from __future__ import annotations

import torch


class RowRing:
    SIZE = 32   # rows kept before they are committed in one batch

    def __init__(self, runner, drafter, top_k: int = 8):
        c, dev = runner.model.cfg, runner.device
        dt = next(runner.model.parameters()).dtype
        self.drafter = drafter
        # a batch of rows must fit the drafter's attention window (its rows see each other)
        n = min(self.SIZE, getattr(drafter, "window", self.SIZE))
        # the target's tapped features side by side, in the drafter's input order (`wide_taps`)
        self.feats = torch.zeros(n, len(drafter.taps) * c.hidden_size, device=dev, dtype=dt)
        self.toks = torch.zeros(n, dtype=torch.long, device=dev)
        self.cnt = torch.zeros(1, dtype=torch.long, device=dev)
        # (top-1 hits, top-k hits, pairs) since the last read; drafters that can predict rows only
        predicts = getattr(drafter, "vocab_ids", None) is not None and hasattr(drafter, "head")
        self.agree = torch.zeros(3, dtype=torch.long, device=dev) if predicts else None
        self.set_k(top_k)
        self.pending = 0               # rows written (the host's count)
        self._unread = False

    def set_k(self, top_k: int) -> None:
        """The tree's branching for the next catch-up's agreement count (a catch-up graph per k: an engine
        kept across generations, or a planner's strategies, may change it)."""
        self.k = max(1, min(int(top_k), self.drafter.vocab_ids.numel())) if self.agree is not None else 1

    def tensors(self) -> list:
        """The ring's device state (saved and restored around a capture's warm-up)."""
        return [self.feats, self.toks, self.cnt] + ([self.agree] if self.agree is not None else [])

    @property
    def full(self) -> bool:
        return self.pending == self.toks.numel()

    def write(self, taps, nxt: torch.Tensor) -> None:
        """One AR step's row (inside its graph): the target's features here, the token after them."""
        self.feats.index_copy_(0, self.cnt, taps)
        self.toks.index_copy_(0, self.cnt, nxt)
        self.cnt.add_(1)

    def commit_body(self, k: int) -> None:
        """The catch-up (captured, one graph per k): commit the rows; count the depth-1 hits on the next
        row's token among the drafter's top k."""
        if self.agree is None:
            self.drafter.commit_rows(self.feats, self.toks, self.cnt)
        else:
            pred = self.drafter.commit_rows(self.feats, self.toks, self.cnt, predict=k)          # [R, k]
            i = torch.arange(1, self.toks.numel(), device=self.toks.device)
            pair = i < self.cnt
            hit = pred[:-1] == self.toks[1:, None]
            self.agree[0] += (hit[:, 0] & pair).sum()
            self.agree[1] += (hit.any(-1) & pair).sum()
            self.agree[2] += pair.sum()
        self.cnt.zero_()

    def discard(self) -> None:
        """Drop the rows not yet committed (a new generation starts: they belong to the last one)."""
        self.cnt.zero_()
        if self.agree is not None:
            self.agree.zero_()
        self.pending = 0
        self._unread = False

    def committed(self) -> None:
        """After a catch-up ran (host side)."""
        self.drafter.advance_host(self.pending)
        self._unread = self.agree is not None
        self.pending = 0

    def take_agreement(self):
        """(top-1 hits, top-k hits, pairs) since the last call, or None when no catch-up ran since (a
        device-to-host read only then)."""
        if not self._unread:
            return None
        self._unread = False
        got = tuple(self.agree.tolist())
        self.agree.zero_()
        return got
