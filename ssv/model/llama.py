"""The decoder: assembles layers; how attention is computed is the plan's business."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from ssv.cache import KVCache
from ssv.config import ModelConfig
from ssv.model.layers import Block, RMSNorm, dense, fused_glue, rope_cos_sin, rope_inv_freq


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # on the meta device (load_model) nn.Embedding's normal_ init runs torch's reference ops, which
        # import torch._dynamo: ~0.9 s of every `ssv generate`'s start. An explicit weight skips it
        # there; elsewhere (random test models) the same init as nn.Embedding's, in the same order
        w = torch.empty(cfg.vocab_size, cfg.hidden_size)
        if w.device.type != "meta":
            nn.init.normal_(w)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=w)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        with torch.device("cpu"):   # not on a meta device (its reference ops import torch._dynamo too)
            inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    # Hugging Face names: model.embed_tokens, model.layers.N..., model.norm, lm_head
    def load_hf_state_dict(self, sd: dict) -> None:
        own = {}
        for name, t in sd.items():
            if name == "lm_head.weight":
                if self.lm_head is None:
                    raise ValueError("checkpoint has lm_head.weight but the config ties embeddings")
                own["lm_head.weight"] = t
            elif name.startswith("model."):
                own[name[len("model."):]] = t
            else:
                raise ValueError(f"unexpected tensor {name!r} in checkpoint")
        expected = {k: v.shape for k, v in self.state_dict().items()}
        missing = sorted(set(expected) - set(own))
        if missing:
            raise ValueError(f"checkpoint is missing tensors: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        extra = sorted(set(own) - set(expected))
        if extra:
            raise ValueError(f"checkpoint has unexpected tensors: {extra[:8]}")
        for k, t in own.items():
            if tuple(t.shape) != tuple(expected[k]):
                raise ValueError(f"tensor {k}: checkpoint shape {tuple(t.shape)} != model shape {tuple(expected[k])}")
        self.load_state_dict(own, strict=True)

    def new_cache(self, max_len: Optional[int] = None, scratch: int = 256, nsa=None) -> KVCache:
        p = next(self.parameters())
        return KVCache(self.cfg.n_layers, self.cfg.n_kv_heads, self.cfg.head_dim,
                       max_len or self.cfg.max_seq_len, scratch, nsa, p.dtype, p.device)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if fused_glue(h):
            from ssv.ops.glue.ops import rmsnorm
            x = rmsnorm(h.contiguous(), self.norm.weight, self.norm.eps)
        else:
            x = self.norm(h)
        if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and x.dim() == 2:
            # keep the GEMM's fp32 accumulator: bf16 logits step by 0.125 at |logit| in [16, 32), so
            # rounding them turns near-ties into exact ties, which speculative and AR decoding break
            # differently (measured: most GPU divergences from `ar` had a bf16 margin of 0)
            return torch.mm(x, w.T, out_dtype=torch.float32)
        return dense(x, w).float()

    def rope_table(self, n: int):
        """cos, sin [n, head_dim] fp32 of positions 0..n-1, as `rope_cos_sin` computes them (the same
        elementwise ops on the same values: the same bits)."""
        return rope_cos_sin(torch.arange(n, device=self.inv_freq.device), self.inv_freq)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, plan, cache: KVCache,
                logits_rows: Optional[torch.Tensor] = None, taps: Sequence[int] = (), wide_taps: bool = False):
        """tokens/positions [N] of the step's new tokens. Returns (logits [R, V] fp32, tapped hidden states).

        logits_rows selects the rows to project (None: all); taps lists layer indices whose outputs
        (hidden states after that layer, before the final norm) are returned, EAGLE-3 style. wide_taps:
        returned as one tensor [N, len(taps) * H] whose j-th column block is layer taps[j]'s (the
        drafter's input order: one row gather later instead of a gather per tap and a concatenation).
        """
        x = self.embed_tokens(tokens)
        table = getattr(cache, "rope", None)
        if table is not None and fused_glue(x):
            # the RoPE kernel reads each row's cos / sin from the cache's table by position: none
            # of the five launches that compute them
            (cos, sin), rows = table, positions
        else:
            (cos, sin), rows = rope_cos_sin(positions, self.inv_freq), None
        tapped, d = [], x.shape[-1]
        wide = x.new_empty(x.shape[0], len(taps) * d) if wide_taps and taps else None
        col = {layer: j * d for j, layer in enumerate(taps)}     # a tap's first column in `wide`
        # the fused layers add their residuals into x in place: a tap is a copy
        keep = (lambda t: t.clone()) if fused_glue(x) else (lambda t: t)
        for i, layer in enumerate(self.layers):
            # a wide tap is written by the layer's last launch (its down projection's GEMM)
            tap = wide[:, col[i]:col[i] + d] if wide is not None and i in col else None
            x = layer(x, cos, sin, plan, cache, rows, tap=tap)
            if i in taps and wide is None:
                tapped.append(keep(x))
        h = x if logits_rows is None else x[logits_rows]
        return self.head(h), (tapped if wide is None else wide)
