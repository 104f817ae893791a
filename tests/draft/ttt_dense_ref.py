"""The TTT forward before its banded attention (full [T, T] step-0 scores, masked to the window):
the reference the banded ssv.draft.ttt.ttt_forward is compared against."""
from __future__ import annotations

import torch
from torch.nn import functional as F

from ssv.draft.eagle3 import Eagle3Head
from ssv.draft.ttt import _shift, teacher_targets


def ttt_forward_dense(head: Eagle3Head, embed_weight: torch.Tensor, feats: torch.Tensor, tokens: torch.Tensor,
                teacher_logits: torch.Tensor, valid: torch.Tensor, steps: int = 3, step_weight: float = 0.8,
                keep_logits: bool = False):
    """Unrolled TTT loss.

    feats [B, T, 3 * target_hidden]: tapped target hidden states at each position (fc column order);
    tokens [B, T]; teacher_logits [B, T, vocab]: the target's logits at each position (distribution of
    the token after it); valid [B, T] bool: teacher positions that count (answer tokens, not padding).
    Returns {"loss": weighted sum, "losses": [per step], "accs": [top-1 per step], "counts": [...]}
    (+ "logits": [per step, draft-vocab logits [B, T, Vd]] when keep_logits).
    """
    if steps < 1:
        raise ValueError(f"ttt steps must be >= 1, got {steps}")
    c, mid = head.cfg, head.midlayer
    B, T = tokens.shape
    hq, hk, d, W = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.window
    g = hq // hk
    dev = tokens.device
    probs, arg, pmask = teacher_targets(head, teacher_logits, valid)
    hidden = head.project(feats.to(head.fc.weight.dtype))
    pos = torch.arange(T, device=dev)
    causal = pos[None, :] <= pos[:, None]                      # [t, s]: s <= t
    keys, vals = [], []
    total, losses, accs, counts, kept = 0.0, [], [], [], []
    for k in range(steps):
        toks = _shift(tokens, k + 1)
        emb = F.embedding(toks, embed_weight).to(hidden.dtype)
        cos, sin = head.rope(pos + k)
        q, kk, vv = mid.qkv(emb.reshape(B * T, -1), hidden.reshape(B * T, -1), cos.repeat(B, 1), sin.repeat(B, 1))
        q = q.view(B, T, hk, g, d).float()
        keys.append(kk.view(B, T, hk, d).float())
        vals.append(vv.view(B, T, hk, d).float())
        scale = d ** -0.5
        s0 = torch.einsum("bthgd,bshd->bhgts", q, keys[0]) * scale
        vis0 = causal & (pos[None, :] > pos[:, None] + k - W)
        s0 = s0.masked_fill(~vis0, float("-inf"))
        diag = [torch.einsum("bthgd,bthd->bhgt", q, keys[i]) * scale for i in range(1, k + 1)]
        diag = [s if k - i < W else torch.full_like(s, float("-inf")) for i, s in enumerate(diag, 1)]
        scores = torch.cat([s0] + [s[..., None] for s in diag], -1)
        p = torch.softmax(scores, -1)
        o = torch.einsum("bhgts,bshd->bthgd", p[..., :T], vals[0])
        for i in range(1, k + 1):
            o = o + p[..., T + i - 1].permute(0, 3, 1, 2)[..., None] * vals[i][:, :, :, None, :]
        out = mid.finish(o.reshape(B * T, hq * d), hidden.reshape(B * T, -1)).view(B, T, -1)
        logits = head.draft_logits(out)
        tp, ta, m = _shift(probs, k + 1), _shift(arg, k + 1), _shift(pmask, k + 1, False)
        n = m.sum()
        ce = -(tp * torch.log_softmax(logits, -1)).sum(-1)
        loss = (ce * m).sum() / n.clamp(min=1)
        total = total + step_weight ** k * loss
        losses.append(float(loss.detach()))
        accs.append(float(((logits.argmax(-1) == ta) & m).sum()) / max(1, int(n)))
        counts.append(int(n))
        if keep_logits:
            kept.append(logits.detach())
        hidden = out
    res = {"loss": total, "losses": losses, "accs": accs, "counts": counts}
    if keep_logits:
        res["logits"] = kept
    return res
