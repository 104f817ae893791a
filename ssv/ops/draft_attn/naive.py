"""Plain-PyTorch twin of the draft level's attention: the visibility built as tensors, then a masked
softmax in fp32 (`ssv.draft.eagle3.masked_attention`)."""
from __future__ import annotations

import torch


def draft_visibility(ring_pos: torch.Tensor, path_rows: torch.Tensor, dlen: torch.Tensor, level: int,
                     window: int, n_scratch: int) -> torch.Tensor:
    """[F, W + S] bool: ring slot s (position ring_pos[s], -1 empty) is visible when inside the window
    of the level's query position p = dlen - 1 + level - 1, i.e. ring_pos > p - W; scratch row r when
    it is one of the node's own path rows (column j holds its ancestor at depth j + 1, at distance
    (level - 1) - (j + 1) < W)."""
    f, depth = path_rows.shape
    W = window
    pos = (dlen.reshape(()) - 1) + (level - 1)
    ring = ring_pos[:W]
    vis_ring = ((ring >= 0) & (ring > pos - W))[None].expand(f, W)
    cols = torch.arange(depth, device=path_rows.device)
    ok = (path_rows >= 0) & ((level - 1) - (cols[None] + 1) < W)
    scr = torch.zeros(f, n_scratch, dtype=torch.int32, device=path_rows.device)
    scr = scr.scatter_add_(1, path_rows.clamp_min(0), ok.to(torch.int32)) > 0
    return torch.cat([vis_ring, scr], 1)


def draft_attn_naive(q: torch.Tensor, k_ring: torch.Tensor, v_ring: torch.Tensor, ring_pos: torch.Tensor,
                     k_scr: torch.Tensor, v_scr: torch.Tensor, path_rows: torch.Tensor, dlen: torch.Tensor,
                     level: int, window: int, scale=None) -> torch.Tensor:
    """q [F, Hq, D]; k_ring/v_ring [>= W, Hkv, D]; ring_pos [>= W]; k_scr/v_scr [S, Hkv, D];
    path_rows [F, depth] (-1 padded); dlen [1] -> o [F, Hq * D] fp32."""
    n, hq, d = q.shape
    W = window
    hkv = k_ring.shape[1]
    vis = draft_visibility(ring_pos, path_rows, dlen, level, W, k_scr.shape[0])
    k = torch.cat([k_ring[:W], k_scr]).float()
    v = torch.cat([v_ring[:W], v_scr]).float()
    qf = q.float().view(n, hkv, hq // hkv, d)
    s = torch.einsum("nhgd,mhd->nhgm", qf, k) * (d ** -0.5 if scale is None else scale)
    s = s.masked_fill(~vis[:, None, None, :], float("-inf"))
    o = torch.einsum("nhgm,mhd->nhgd", torch.softmax(s, -1), v)
    return o.reshape(n, hq * d)


def draft_attn_rows_naive(q: torch.Tensor, k_ring: torch.Tensor, v_ring: torch.Tensor, ring_pos: torch.Tensor,
                          k_new: torch.Tensor, v_new: torch.Tensor, dlen: torch.Tensor, n: torch.Tensor, window: int,
                          scale=None) -> torch.Tensor:
    """The drafter's commit of R rows (`Eagle3Drafter.commit_rows`' visibility): row i at position
    p_i = dlen + i sees ring slot s when ring_pos[s] >= 0 and ring_pos[s] > p_i - W, and new row j
    when j <= i and j < n, or j = i (a padded row sees itself) -> o [R, Hq * D] fp32."""
    r, hq, d = q.shape
    W = window
    hkv = k_ring.shape[1]
    ar = torch.arange(r, device=q.device)
    pos = dlen.reshape(()).long() + ar
    ring = ring_pos[:W]
    vis_ring = (ring[None] >= 0) & (ring[None] > pos[:, None] - W)
    vis_new = ((ar[None] <= ar[:, None]) & (ar[None] < n)) | (ar[None] == ar[:, None])
    vis = torch.cat([vis_ring, vis_new], 1)
    k = torch.cat([k_ring[:W], k_new]).float()
    v = torch.cat([v_ring[:W], v_new]).float()
    qf = q.float().view(r, hkv, hq // hkv, d)
    s = torch.einsum("nhgd,mhd->nhgm", qf, k) * (d ** -0.5 if scale is None else scale)
    s = s.masked_fill(~vis[:, None, None, :], float("-inf"))
    o = torch.einsum("nhgm,mhd->nhgd", torch.softmax(s, -1), v)
    return o.reshape(r, hq * d)
