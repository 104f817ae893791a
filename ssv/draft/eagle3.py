"""The EAGLE-3 draft head module (its config, in the EAGLE-3 / SpecForge config.json layout: config.py).

Tensor names follow SpecForge `specforge/modeling/draft/llama3_eagle.py` (LlamaForCausalLMEagle3)
and SafeAILab/EAGLE `eagle/model/cnets.py`, so heads trained there for a Llama target load here:

    fc.weight                               [hidden, 3 * target_hidden]
    midlayer.input_layernorm.weight         [hidden]      (norms the token embedding)
    midlayer.hidden_norm.weight             [hidden]      (norms the fused feature)
    midlayer.self_attn.{q,k,v}_proj.weight  [heads * head_dim, 2 * hidden]
    midlayer.self_attn.o_proj.weight        [hidden, heads * head_dim]
    midlayer.post_attention_layernorm.weight, midlayer.mlp.{gate,up,down}_proj.weight
    norm.weight, lm_head.weight             [draft_vocab, hidden]
    d2t [draft_vocab] int64 (target_id = draft_id + d2t[draft_id]), t2d [vocab] bool

Forward of one draft row (same as both references):
    residual = h                                 # fc(cat(taps)) on the first step, else the previous
    x = cat(input_layernorm(embed(token)), hidden_norm(h))          # midlayer output (pre-norm)
    h = residual + o_proj(attn(q_proj(x), k_proj(x), v_proj(x)))
    h = h + mlp(post_attention_layernorm(h))      # -> the feature handed to the next draft step
    logits = lm_head(norm(h))                     # over the draft vocabulary

The token embedding is the target's (shared and frozen): it is neither a parameter nor saved.

Long contexts: the draft's attention is restricted to a sliding window of `window`
(`ssv_draft_window` in config.json, default 512) keys: a query at position p sees draft keys at
positions (p - window, p]. A head is trained on sequences of a few thousand tokens at most, so
full attention at 4K-128K would (a) put it far outside the key-count distribution it was trained
on (softmax mass spread over 100K keys it never learnt to ignore) and (b) cost O(context) per draft
step, which defeats the purpose of a draft that must be ~free next to a sparse-attention target.
The draft predicts the next few tokens mostly from the fused target features (which already
summarise the long context through the target's own NSA attention) plus local syntax, so a window
of a few hundred tokens loses little and behaves identically at 4K and 128K. RoPE positions are
the true positions (EAGLE convention: a draft row holding (feature at t, token t+1) sits at t);
only relative offsets matter to RoPE, so the absolute value is harmless at any length.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ssv.draft.config import (ARCHITECTURE, DEFAULT_WINDOW, Eagle3Config, check_compatible,  # noqa: F401
                              default_layer_ids)
from ssv.model.layers import (MLP, RMSNorm, _cat_cached, add_linear, add_mlp, apply_rope, dense, fused_glue, rope_cos_sin,
                              rope_inv_freq, tuned_linear)


class Eagle3Attention(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)


class Eagle3Layer(nn.Module):
    """The midlayer, split around attention so callers choose the keys each query sees."""

    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.c = c
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Eagle3Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def qkv(self, emb: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """emb, hidden [N, hidden]; cos/sin [N, head_dim] -> q [N, Hq, D], k, v [N, Hkv, D] (RoPE'd)."""
        c, n = self.c, emb.shape[0]
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], -1)
        a = self.self_attn
        q = apply_rope(dense(x, a.q_proj.weight).view(n, c.num_attention_heads, c.head_dim), cos, sin)
        k = apply_rope(dense(x, a.k_proj.weight).view(n, c.num_key_value_heads, c.head_dim), cos, sin)
        v = dense(x, a.v_proj.weight).view(n, c.num_key_value_heads, c.head_dim)
        return q, k, v

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """attn [N, Hq*D] (attention output before o_proj); residual = the step's input feature."""
        h = residual + dense(attn.to(residual.dtype), self.self_attn.o_proj.weight)
        return h + self.mlp(self.post_attention_layernorm(h))

    # the fused twins of qkv / finish (the target's glue kernels: ~7 launches where the eager
    # layer takes ~50), for the device round's fixed shapes; tests compare them with the eager ones
    def qkv_write(self, embed_w, tokens, hidden, cos, sin, k_buf, v_buf, slots, pos=None, hidden_rows=None,
                  raw=None) -> torch.Tensor:
        """qkv of the rows (token embedding rows `tokens` of embed_w, hidden), with k and v stored at
        rows `slots` of k_buf / v_buf [S, Hkv, D]; returns q [N, Hq, D]. pos [N]: cos / sin are tables
        by position (`rope_write`'s). The two norms write the halves of one buffer in one launch, the
        first gathering the embedding rows: no lookup or concatenation launch of their own.
        hidden_rows [N]: the features are rows hidden_rows of hidden (the nodes' parents); raw [N, H]:
        the same launch copies the features there as they are (the residual `finish_fused` adds into).
        The q|k|v GEMM, its RoPE and the cache writes are one `linear_rope` launch where ssv/ops/linear's
        table lists the GEMM with `rope` (K = 2 H, no folded norm: `ssv bench linear --draft`), else cuBLAS
        and `rope_write`."""
        from ssv.ops.glue.ops import rmsnorm_pair, rope_write
        c, a, h = self.c, self.self_attn, hidden.shape[1]
        n = tokens.numel()
        x = torch.empty(n, 2 * h, device=hidden.device, dtype=hidden.dtype)
        rmsnorm_pair(embed_w, self.input_layernorm.weight, self.input_layernorm.eps, tokens, hidden,
                     self.hidden_norm.weight, self.hidden_norm.eps, out=x, rows2=hidden_rows, raw=raw)
        w = _cat_cached(a, "_wqkv", [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
        lp = tuned_linear(x, w, rope=True)
        if lp is not None:   # GEMM, RoPE and cache writes in one launch where ssv/ops/linear's table lists it
            from ssv.ops.linear.ops import linear_rope
            return linear_rope(x, w, cos, sin, c.num_attention_heads, c.num_key_value_heads, k_buf.transpose(0, 1),
                               v_buf.transpose(0, 1), slots, pos=pos, launch=lp)
        return rope_write(F.linear(x, w), cos, sin, c.num_attention_heads, c.num_key_value_heads,
                          k_buf.transpose(0, 1), v_buf.transpose(0, 1), slots, pos=pos)

    def finish_fused(self, attn: torch.Tensor, residual: torch.Tensor, out=None) -> torch.Tensor:
        """`finish` as the target's fused layer runs its second half (`Block._forward_fused`): the
        residual copied once into `out` (a scratch range; it may be a broadcast row), o_proj and
        down_proj added into it in place, the post-attention norm folded into gate|up. The GEMMs take
        ssv/ops/linear where its table lists them (at 16-row tiles the frontier's rows have the AR
        step's keys), else cuBLAS and a SwiGLU launch: 4-5 launches where copy-and-add GEMMs, a norm
        and a SwiGLU took 7. `out` may be `residual` itself (no copy then)."""
        h = torch.empty(residual.shape, device=residual.device, dtype=residual.dtype) if out is None else out
        if h is not residual:
            h.copy_(residual)
        add_linear(h, attn.to(h.dtype), self.self_attn.o_proj.weight)
        return add_mlp(h, self.mlp, self.post_attention_layernorm)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """q [N, Hq, D]; k, v [M, Hkv, D]; visible [N, M] bool (every row sees >= 1 key) -> [N, Hq*D] fp32."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    qf = q.float().view(n, hkv, hq // hkv, d)
    s = torch.einsum("nhgd,mhd->nhgm", qf, k.float()) * d ** -0.5
    s = s.masked_fill(~visible[:, None, None, :], float("-inf"))
    o = torch.einsum("nhgm,mhd->nhgd", torch.softmax(s, -1), v.float())
    return o.reshape(n, hq * d)


def masked_attention_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """`masked_attention` as one SDPA call in the inputs' dtype: the G query heads of a KV head are
    taken as G x N queries of that head, so no key is repeated -> [N, Hq*D] in q's dtype."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    qh = q.view(n, hkv, g, d).permute(1, 2, 0, 3).reshape(1, hkv, g * n, d)      # [1, Hkv, G*N, D]
    mask = visible[None].expand(g, n, visible.shape[1]).reshape(1, 1, g * n, -1)
    o = F.scaled_dot_product_attention(qh, k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask)
    return o.view(hkv, g, n, d).permute(2, 0, 1, 3).reshape(n, hq * d)


class Eagle3Head(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.t2d[: cfg.draft_vocab_size] = True  # identity mapping until a vocabulary is set
        self._inv_freq = {}  # device -> fp32 RoPE frequencies (kept out of .to(dtype))

    def set_vocab(self, draft_to_target: torch.Tensor) -> None:
        """Use the target ids `draft_to_target` [draft_vocab] (distinct) as the draft vocabulary."""
        ids = torch.as_tensor(draft_to_target, dtype=torch.long).flatten().cpu()
        from ssv.draft.vocab import mapping_from_ids

        d2t, t2d = mapping_from_ids(ids, self.cfg.vocab_size, self.cfg.draft_vocab_size)
        self.d2t.copy_(d2t.to(self.d2t.device))
        self.t2d.copy_(t2d.to(self.t2d.device))

    def target_ids(self) -> torch.Tensor:
        """LongTensor [draft_vocab]: the target id of each draft id."""
        return torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device) + self.d2t

    def rope(self, positions: torch.Tensor):
        dev = positions.device
        if dev not in self._inv_freq:
            self._inv_freq[dev] = rope_inv_freq(self.cfg.head_dim, self.cfg.rope).to(dev)
        return rope_cos_sin(positions, self._inv_freq[dev])

    def project(self, feats: torch.Tensor) -> torch.Tensor:
        """Fused target features [..., 3 * target_hidden] -> first-step draft features [..., hidden]."""
        return dense(feats, self.fc.weight)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if fused_glue(hidden):
            from ssv.ops.glue.ops import rmsnorm
            return _logits_fp32(rmsnorm(hidden.contiguous(), self.norm.weight, self.norm.eps), self.lm_head.weight)
        return dense(self.norm(hidden), self.lm_head.weight).float()

    def draft_logits_folded(self, hidden: torch.Tensor):
        """`draft_logits` as `ssv.spec.device.Logits` for the top-k's launch: the GEMM projects the
        un-normalized rows through the head with the final norm's weight folded in (cached), and the
        top-k applies each row's 1 / rms before its log_softmax: no norm launch (the roundings move as
        in the target's folded norms: the weight is rounded instead of the normalized row)."""
        from ssv.spec.device import Logits
        w = _cat_cached(self, "_lm_folded", [self.lm_head.weight], norm_w=self.norm.weight)
        x = hidden.contiguous()
        return Logits(_logits_fp32(x, w), norm=(x, self.norm.eps))

    def draft_logp(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft next-token log-probs [..., draft_vocab] (ids `target_ids()`)."""
        return torch.log_softmax(self.draft_logits(hidden), -1)

    def to_target(self, lp: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary log-probs -> [..., vocab] over the TARGET vocabulary (-inf off the draft vocab)."""
        out = lp.new_full((*lp.shape[:-1], self.cfg.vocab_size), float("-inf"))
        out[..., self.target_ids()] = lp
        return out

    def target_logp(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft next-token log-probs [..., vocab] over the TARGET vocabulary (-inf off the draft vocab)."""
        return self.to_target(self.draft_logp(hidden))


def _logits_fp32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T in float32: a half-precision GEMM keeps its fp32 accumulator (as the target's head): no
    rounding, no cast launch."""
    if x.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(x, w.t(), out_dtype=torch.float32)
    return F.linear(x, w).float()


def grow_head(head: Eagle3Head, new_ids: torch.Tensor, target_rows: torch.Tensor) -> Eagle3Head:
    """`remap_head` to a grown draft vocabulary: `new_ids` must contain every id of the head's own."""
    from ssv.draft.vocab import check_grown

    check_grown(head.target_ids(), new_ids)
    return remap_head(head, new_ids, target_rows)


def remap_head(head: Eagle3Head, new_ids: torch.Tensor, target_rows: torch.Tensor) -> Eagle3Head:
    """A copy of `head` whose draft vocabulary is `new_ids`: every weight but the output rows kept, the
    rows of ids in both vocabularies kept, the others from `ssv.draft.vocab.remap_rows` (target_rows:
    the target's output layer [vocab, hidden])."""
    import dataclasses

    from ssv.draft.vocab import remap_rows

    old = head.target_ids().cpu()
    cfg = dataclasses.replace(head.cfg, draft_vocab_size=int(torch.as_tensor(new_ids).numel()))
    out = Eagle3Head(cfg)
    out.set_vocab(new_ids)
    sd = {k: v for k, v in head.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    missing, unexpected = out.load_state_dict(sd, strict=False)
    if unexpected or set(missing) != {"lm_head.weight", "d2t", "t2d"}:
        raise ValueError(f"remap_head: unexpected weights {unexpected}, missing {missing}")
    with torch.no_grad():
        out.lm_head.weight.copy_(remap_rows(head.lm_head.weight, old, out.target_ids().cpu(), target_rows))
    return out.to(head.lm_head.weight.dtype)
