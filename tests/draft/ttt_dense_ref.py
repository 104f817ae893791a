"""Step k's TTT attention as it was before the bands: full [T, T] step-0 scores masked to the window.
The reference that ssv.draft.ttt._attend is compared against (same signature)."""
import torch


def attend_dense(q, keys, vals, k, W):
    B, T, hk, g, d = q.shape
    pos = torch.arange(T, device=q.device)
    scale = d ** -0.5
    s0 = torch.einsum("bthgd,bshd->bhgts", q, keys[0]) * scale
    vis0 = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] + k - W)
    s0 = s0.masked_fill(~vis0, float("-inf"))
    diag = [torch.einsum("bthgd,bthd->bhgt", q, keys[i]) * scale for i in range(1, k + 1)]
    diag = [s if k - i < W else torch.full_like(s, float("-inf")) for i, s in enumerate(diag, 1)]
    p = torch.softmax(torch.cat([s0] + [s[..., None] for s in diag], -1), -1)
    o = torch.einsum("bhgts,bshd->bthgd", p[..., :T], vals[0])
    for i in range(1, k + 1):
        o = o + p[..., T + i - 1].permute(0, 3, 1, 2)[..., None] * vals[i][:, :, :, None, :]
    return o
