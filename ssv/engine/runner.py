"""A model, its cache and its attention choice; prefill and one-step forwards over plans."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ssv.attention import DensePlan, NSAPlan, StepMeta, TritonNSAPlan, VerifyOptions
from ssv.config import NSAConfig
from ssv.engine.modes import decoding
from ssv.model.llama import Transformer

ATTENTIONS = ("dense", "nsa")
BACKENDS = ("auto", "reference", "triton")


@dataclass
class Runner:
    model: Transformer
    attention: str = "nsa"
    nsa: Optional[NSAConfig] = None   # None: the checkpoint's own, else the training-free default
    max_len: Optional[int] = None
    scratch: int = 256
    record: Optional[list] = None     # routing records (ssv generate --record-routing)
    backend: str = "auto"             # NSA ops: Triton kernels on CUDA, the reference elsewhere

    def __post_init__(self):
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.nsa is None:
            self.nsa = self.model.cfg.nsa or NSAConfig()
        if self.model.cfg.nsa is not None and self.model.cfg.nsa.gating == "gated" and self.nsa.gating != "gated":
            raise ValueError("this checkpoint was trained with gated NSA; its gating cannot be changed")
        ml = self.max_len or self.model.cfg.max_seq_len
        self.cache = self.model.new_cache(ml, self.scratch, self.nsa if self.attention == "nsa" else None)
        if self.device.type == "cuda":
            self.cache.rope = self.model.rope_table(ml + self.scratch)
        else:
            # the CPU step's GEMM forms are timed once per process (ssv/ops/linear/cpu.py) and the
            # packed weights made: here, not inside the first decode step that a caller times
            from ssv.ops.linear.cpu import cpu_forms, prepack, uses_forms
            if uses_forms(self.device, self.cache.k.dtype):
                cpu_forms()
                prepack(self.model)

    @property
    def device(self):
        return self.cache.k.device

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def context_limit(self) -> int:
        return self.cache.max_len

    @property
    def uses_kernels(self) -> bool:
        if self.attention != "nsa" or self.backend == "reference":
            return False
        return self.backend == "triton" or self.device.type == "cuda"

    def plan(self, meta: StepMeta, opts: Optional[VerifyOptions] = None):
        if self.attention == "dense":
            return DensePlan(meta)
        if self.uses_kernels:
            return TritonNSAPlan(meta, self.nsa, opts, self.record)
        return NSAPlan(meta, self.nsa, opts, self.record)

    @decoding
    def forward(self, tokens: torch.Tensor, meta: StepMeta, opts: Optional[VerifyOptions] = None,
                logits_rows=None, taps=()):
        """Run the step's new tokens (written to the cache scratch; nothing is committed)."""
        self.cache.check_room(meta.n)
        meta = StepMeta(meta.prefix_len, meta.positions.to(self.device), meta.tree_mask.to(self.device))
        return self.model(tokens.to(self.device), meta.positions, self.plan(meta, opts),
                          self.cache, logits_rows=logits_rows, taps=taps)

    @decoding
    def prefill(self, ids: list[int], chunk: Optional[int] = None, progress: bool = False, taps=()):
        """Commit the prompt chunk by chunk; returns the last position's logits [V] (and taps per chunk)."""
        self.check_prompt(ids)
        from tqdm import tqdm
        chunk = chunk or (128 if self.uses_kernels else 256)  # the kernels take at most 128 new tokens
        bar = tqdm(total=len(ids), desc="prefill", unit="tok", disable=not progress, leave=False)
        tapped, logits = [], None
        for c0 in range(0, len(ids), chunk):
            part = torch.tensor(ids[c0:c0 + chunk], dtype=torch.long)
            meta = StepMeta.chain(self.length, part.numel())
            logits, t = self.forward(part, meta, logits_rows=torch.tensor([part.numel() - 1]), taps=taps)
            tapped.append(t)
            self.cache.commit(part.numel())
            bar.update(part.numel())
        bar.close()
        return logits[-1], tapped

    def check_prompt(self, ids) -> None:
        """A prompt to prefill (here, or `DeviceEngine.prefill`): not empty, within the context."""
        if len(ids) == 0:
            raise ValueError("empty prompt: give at least one token")
        # an embedding lookup past the table is an opaque IndexError (a device assert on CUDA)
        lo, hi = (int(x) for x in torch.aminmax(torch.as_tensor(ids)))
        if lo < 0 or hi >= self.model.cfg.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {self.model.cfg.vocab_size})")
        if self.length + len(ids) > self.context_limit:
            raise ValueError(f"prompt of {len(ids)} tokens does not fit the context limit of "
                             f"{self.context_limit} tokens ({self.length} already used)")

    def reset(self) -> None:
        self.cache.reset()
