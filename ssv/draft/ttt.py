"""EAGLE-3 training-time test (TTT): the head unrolled over its own outputs, as at inference.

Batch rows are sequence positions t. Step 0 feeds row t the pair (fc(taps at t), token t+1) at RoPE
position t and predicts token t+2. Step k > 0 feeds row t (its own step k-1 output at row t, token
t+1+k) at position t+k and predicts token t+2+k -- exactly a depth-k tree node whose root is the
committed row t. Attention of step k, row t (SafeAILab/EAGLE `traineagle3/cnets.py`, SpecForge
`llama3_eagle.py`): the step-0 ("committed") keys of rows <= t plus the diagonal keys of steps
1..k of row t itself (its chain), all limited to the sliding window (key position > query position
- window), as Eagle3Drafter does.

Loss of step k: soft cross-entropy against the target's next-token distribution restricted to the
draft vocabulary and renormalised, at positions where the target's top-1 token lies in the draft
vocabulary (EAGLE-3's position mask); steps are weighted step_weight**k.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from ssv.draft.eagle3 import Eagle3Head


def _shift(x: torch.Tensor, s: int, fill=0) -> torch.Tensor:
    """x[:, t] <- x[:, t + s] along dim 1, padded with `fill`."""
    if s == 0:
        return x
    pad = torch.full_like(x[:, :s], fill)
    return torch.cat([x[:, s:], pad], 1)


def _band(x: torch.Tensor, Q: int, L: int, nb: int) -> torch.Tensor:
    """x [B, T, h, d] -> [B, nb, L + Q, h, d]: band n holds positions nQ - L .. nQ + Q - 1 (zeros
    outside 0 .. T - 1)."""
    xp = F.pad(x, (0, 0, 0, 0, L, nb * Q - x.shape[1]))
    return xp.unfold(1, L + Q, Q).permute(0, 1, 4, 2, 3)


def _attend(q: torch.Tensor, keys: list, vals: list, k: int, W: int) -> torch.Tensor:
    """Step k's attention: q [B, T, hk, g, d] over the step-0 keys of rows in the window and the
    diagonal keys of steps 1..k (keys, vals: per step [B, T, hk, d]) -> [B, T, hk, g, d].

    The step-0 keys in bands: query block n (rows nQ .. nQ + Q - 1) sees keys nQ - L .. nQ + Q - 1,
    which hold every key its rows can see, so scores are [.., T, L + Q] rather than [.., T, T]
    (Q = L = W for sequences longer than the window; one block, L = 0, otherwise)."""
    B, T, hk, g, d = q.shape
    dev = q.device
    Q = min(W, T)
    nb = -(-T // Q)
    Tp, L = nb * Q, min(W, (nb - 1) * Q)
    qpos = torch.arange(Tp, device=dev).view(nb, Q, 1)
    kpos = (torch.arange(nb, device=dev) * Q - L).view(nb, 1, 1) + torch.arange(L + Q, device=dev).view(1, 1, L + Q)
    band_k, band_v = (_band(x, Q, L, nb) for x in (keys[0], vals[0]))     # [B, nb, L + Q, hk, d]
    scale = d ** -0.5
    qb = F.pad(q, (0, 0, 0, 0, 0, 0, 0, Tp - T)).view(B, nb, Q, hk, g, d)
    s0 = torch.einsum("bnthgd,bnshd->bhgnts", qb, band_k) * scale      # [B, hk, g, nb, Q, L + Q]
    s0 = s0.masked_fill(~((kpos >= 0) & (kpos <= qpos) & (kpos > qpos + k - W)), float("-inf"))
    diag = [torch.einsum("bthgd,bthd->bhgt", q, keys[i]) * scale for i in range(1, k + 1)]
    diag = [s if k - i < W else torch.full_like(s, float("-inf")) for i, s in enumerate(diag, 1)]
    diag = [F.pad(s, (0, Tp - T)).view(B, hk, g, nb, Q) for s in diag]
    p = torch.softmax(torch.cat([s0] + [s[..., None] for s in diag], -1), -1)
    o = torch.einsum("bhgnts,bnshd->bnthgd", p[..., :L + Q], band_v).reshape(B, Tp, hk, g, d)[:, :T]
    for i in range(1, k + 1):
        w = p[..., L + Q + i - 1].reshape(B, hk, g, Tp)[..., :T].permute(0, 3, 1, 2)   # [B, T, hk, g]
        o = o + w[..., None] * vals[i][:, :, :, None, :]
    return o


def teacher_targets(head: Eagle3Head, teacher_logits: torch.Tensor, valid: torch.Tensor):
    """(probs over the draft vocab [B, T, Vd] fp32, their argmax [B, T], trained mask [B, T])."""
    with torch.no_grad():
        top = teacher_logits.argmax(-1)
        probs = torch.softmax(teacher_logits[..., head.target_ids()].float(), -1)
        mask = valid & head.t2d[top]
        return probs, probs.argmax(-1), mask


def ttt_forward(head: Eagle3Head, embed_weight: torch.Tensor, feats: torch.Tensor, tokens: torch.Tensor,
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
    keys, vals = [], []
    total, losses, accs, counts, kept = 0.0, [], [], [], []
    for k in range(steps):
        toks = _shift(tokens, k + 1)
        emb = F.embedding(toks, embed_weight).to(hidden.dtype)
        cos, sin = head.rope(pos + k)
        q, kk, vv = mid.qkv(emb.reshape(B * T, -1), hidden.reshape(B * T, -1), cos.repeat(B, 1), sin.repeat(B, 1))
        keys.append(kk.view(B, T, hk, d).float())
        vals.append(vv.view(B, T, hk, d).float())
        o = _attend(q.view(B, T, hk, g, d).float(), keys, vals, k, W)
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
